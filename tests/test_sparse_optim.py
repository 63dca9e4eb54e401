"""Sparse embedding gradients with SparseAdam and Adagrad (``course_utils.workload.sparse_optim``)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from course_utils.workload import data
from course_utils.workload.models import DLRM
from course_utils.workload.sparse_optim import (
    Optimizers,
    gradient_bytes,
    make_optimizers,
    sparse_gradient_formula,
    state_bytes,
    tensor_bytes,
    train_with,
)

pytestmark = pytest.mark.chapter(7)


def _bag(rows=50, dim=4, sparse=True, seed=0):
    bag = nn.EmbeddingBag(rows, dim, mode="sum", sparse=sparse)
    with torch.no_grad():
        bag.weight.copy_(torch.randn(rows, dim, generator=torch.Generator().manual_seed(seed)))
    return bag


def test_sparse_gradient_rows_are_the_batch_lookups_and_coalesce_to_its_distinct_ids():
    bag = _bag()
    ids = torch.tensor([[3], [7], [3], [12], [7], [3]])  # [B, 1]: 6 lookups, 3 distinct ids
    (bag(ids) * torch.arange(1.0, 7.0).view(6, 1)).sum().backward()
    grad = bag.weight.grad
    assert grad.is_sparse and grad._nnz() == 6
    merged = grad.coalesce()
    assert merged._indices()[0].tolist() == ids.flatten().unique().tolist()
    # each distinct row's gradient is the sum of its lookups' upstream gradients
    assert merged._values()[:, 0].tolist() == [1.0 + 3 + 6, 2.0 + 5, 4.0]  # rows 3, 7, 12
    assert tensor_bytes(grad) == sparse_gradient_formula(6, 4) == 6 * (8 + 16)
    assert tensor_bytes(merged) == sparse_gradient_formula(6, 4, distinct=3)
    dense = _bag(sparse=False)
    dense(ids).sum().backward()
    assert tensor_bytes(dense.weight.grad) == 50 * 4 * 4


def test_sparse_adam_leaves_untouched_rows_and_their_moments_alone_while_adam_moves_them():
    first, second = torch.tensor([[1], [2]]), torch.tensor([[2], [5]])  # row 1 only in the first batch
    moved = {}
    for name, sparse, make in (
        ("sparse_adam", True, lambda p: torch.optim.SparseAdam(p, lr=0.1)),
        ("adam", False, lambda p: torch.optim.Adam(p, lr=0.1)),
    ):
        bag = _bag(sparse=sparse)
        opt = make(list(bag.parameters()))
        start = bag.weight.detach().clone()
        for ids in (first, second):
            opt.zero_grad(set_to_none=True)
            bag(ids).sum().backward()
            opt.step()
            if ids is first:
                after_first = bag.weight.detach().clone()
                moments = {k: v.clone() for k, v in opt.state[bag.weight].items() if torch.is_tensor(v)}
        untouched = [r for r in range(50) if r not in (1, 2, 5)]
        assert torch.equal(bag.weight.detach()[untouched], start[untouched])  # never looked up: unchanged
        moved[name] = (bag.weight.detach()[1] - after_first[1]).abs().max().item()
        if name == "sparse_adam":
            for k in ("exp_avg", "exp_avg_sq"):  # row 1's moments frozen while it is absent
                assert torch.equal(opt.state[bag.weight][k][1], moments[k][1])
                assert torch.count_nonzero(opt.state[bag.weight][k][untouched]) == 0
    assert moved["sparse_adam"] == 0.0  # lazy: row 1 absent from the second batch, not updated
    assert moved["adam"] > 1e-3  # dense Adam: its first moment still moves row 1


def test_sparse_adagrad_computes_what_dense_adagrad_computes():
    batches = [torch.randint(0, 50, (16, 1), generator=torch.Generator().manual_seed(s)) for s in range(5)]
    weights = []
    for sparse in (True, False):
        bag = _bag(sparse=sparse)
        opt = Optimizers(torch.optim.Adagrad(bag.parameters(), lr=0.1))
        for ids in batches:
            opt.zero_grad()
            (bag(ids) ** 2).sum().backward()
            opt.step()
        weights.append(bag.weight.detach())
    torch.testing.assert_close(weights[0], weights[1], rtol=1e-6, atol=1e-6)


def test_optimizers_step_without_a_warning():
    model = DLRM([30, 20], seed=0, sparse_gradients=True)
    opt = make_optimizers(model, "adagrad", lr=1e-2, table_lr=0.05)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(torch.zeros(4, 13), torch.tensor([[1, 2], [3, 4], [1, 2], [0, 0]])).sum().backward()
        opt.step()


def test_state_bytes_match_the_formula():
    cards = [30, 20]
    for name, table_copies, counters in (("adam", 2, 4), ("sparse_adam", 2, 0), ("adagrad", 1, 4)):
        model = DLRM(cards, seed=0, sparse_gradients=name != "adam")
        opt = make_optimizers(model, name, lr=1e-2)
        model(torch.zeros(4, 13), torch.tensor([[1, 2], [3, 4], [1, 2], [0, 0]])).sum().backward()
        opt.step()
        tables = sum(cards) * 16 * 4
        dense = sum(tensor_bytes(p) for p in model.dense_parameters())
        n_dense = len(list(model.dense_parameters()))
        # tables: table_copies [N, D] tensors (+ a 4-byte step counter each, except SparseAdam's int);
        # the MLPs: Adam's two moments and a counter per parameter
        expected = table_copies * tables + counters * len(cards) + 2 * dense + 4 * n_dense
        assert state_bytes(opt) == expected, name


def test_make_optimizers_refuses_tables_of_the_wrong_kind():
    with pytest.raises(ValueError, match="sparse_gradients=True"):
        make_optimizers(DLRM([10], seed=0), "sparse_adam", lr=1e-2)
    with pytest.raises(ValueError, match="sparse_gradients=False"):
        make_optimizers(DLRM([10], seed=0, sparse_gradients=True), "adam", lr=1e-2)
    with pytest.raises(ValueError, match="lamb"):
        make_optimizers(DLRM([10], seed=0), "lamb", lr=1e-2)


def test_train_with_measures_the_gradient_bytes_of_one_step():
    logs = data.make_click_logs(1024 + 512, seed=3)
    train, test = logs[:1024], logs[1024:]
    runs = {
        name: train_with(name, train, test, lr=1e-2, batch_size=256, table_lr=0.05)
        for name in ("adam", "sparse_adam", "adagrad")
    }
    T, N = len(logs.cardinalities), sum(logs.cardinalities)
    distinct = sum(len(set(train.sparse[:256, t].tolist())) for t in range(T))
    for name, run in runs.items():
        assert run.weight_bytes == N * 16 * 4 + runs["adam"].dense_gradient_bytes
        assert 0.3 < run.history.final["auc"] < 1.0
        if name == "adam":
            assert run.table_gradient_bytes == run.table_gradient_coalesced == N * 16 * 4
        else:
            assert run.table_gradient_bytes == T * sparse_gradient_formula(256, 16)
            per_table = [len(set(train.sparse[:256, t].tolist())) for t in range(T)]
            assert run.table_gradient_coalesced == sum(sparse_gradient_formula(256, 16, n) for n in per_table)
            assert run.table_gradient_coalesced == distinct * (8 + 64)
    assert runs["sparse_adam"].state_bytes == runs["adam"].state_bytes - 4 * T  # same moments, int counters
    assert gradient_bytes([]) == 0
