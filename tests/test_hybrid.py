"""The hybrid DLRM (sharded tables + DDP MLPs) against single-process training on the same data."""

import pytest
import torch

from course_utils import launch, sharding
from course_utils.sharding import hybrid
from course_utils.workload import data, train
from course_utils.workload.models import DLRM, DLRMConfig

pytestmark = [pytest.mark.chapter(7), pytest.mark.launches]

CARDS = data.criteo_cardinalities(1 / 1000)
LOGS = data.make_click_logs(3072, seed=3, cardinalities=CARDS)
TRAIN, TEST = LOGS[:2048], LOGS[2048:]
BATCH, LR = 256, 1e-2  # 8 steps of Adam
SGD_LR = 0.1
PARAM_TOL = 1e-5  # float sums in another order (all-reduce, all-to-all): 3e-8 measured with SGD
# Adam's step is lr * m / (sqrt(v) + eps): a row whose gradient is float noise (1e-10 in one order,
# 0 in another) moves by up to lr * 1e-2. With MKL's AVX-512 kernels that moved one row per table by
# up to 1e-2 in 8 steps (AVX2: 1.3e-4), while the losses agreed within 5e-8. So the parameters
# are compared after SGD, whose step is linear in the gradient; Adam is compared on what it computes.


def _single(optimizer, lr):
    model = DLRM(CARDS, seed=0)
    history = train.train(model, TRAIN, batch_size=BATCH, lr=lr, eval_data=TEST, optimizer=optimizer)
    return model, history


@pytest.fixture(scope="module")
def single_process():
    return _single("sgd", SGD_LR)


def _train(kind, model, split="range", optimizer="sgd", lr=SGD_LR):
    h = hybrid.HybridDLRM(model, kind, split=split)
    history = hybrid.train_hybrid(h, TRAIN, batch_size=BATCH, lr=lr, eval_data=TEST, optimizer=optimizer)
    shards = [
        (s, w.detach().clone()) for s, w in zip(h.embeddings.shards, h.embeddings.weights, strict=False)
    ]
    return history, shards, {k: v.clone() for k, v in h.dense.module.state_dict().items()}


@pytest.mark.parametrize("kind, world_size", [("table_wise", 2), ("row_wise", 4), ("column_wise", 2)])
def test_hybrid_training_equals_single_process(kind, world_size, single_process):
    reference, ref_history = single_process
    results = launch(_train, kind, DLRM(CARDS, seed=0), world_size=world_size, timeout=120)
    history = results[0][0]
    assert len(history.step_loss) == len(ref_history.step_loss) == 8
    assert max(abs(a - b) for a, b in zip(history.step_loss, ref_history.step_loss, strict=False)) < 1e-5
    for rank_history, shards, dense in results:
        assert rank_history.final == history.final  # every rank reports the same
        for shard, weight in shards:
            expected = shard.of(reference.embeddings[shard.table].weight.detach())
            assert torch.allclose(weight, expected, atol=PARAM_TOL, rtol=0)
        for name, value in dense.items():
            assert torch.allclose(value, reference.state_dict()[name], atol=PARAM_TOL, rtol=0), name
    assert abs(history.final["auc"] - ref_history.final["auc"]) < 1e-4
    assert abs(history.final["logloss"] - ref_history.final["logloss"]) < 1e-4


def test_hybrid_training_with_adam_gives_the_single_process_losses():
    _, ref_history = _single("adam", LR)
    results = launch(_train, "row_wise", DLRM(CARDS, seed=0), "range", "adam", LR, world_size=2, timeout=120)
    for history, _shards, _dense in results:
        assert len(history.step_loss) == 8
        assert max(abs(a - b) for a, b in zip(history.step_loss, ref_history.step_loss, strict=True)) < 1e-5
        assert abs(history.final["auc"] - ref_history.final["auc"]) < 1e-4
        assert abs(history.final["logloss"] - ref_history.final["logloss"]) < 1e-4
        assert history.final == results[0][0].final


def test_hybrid_from_config_never_builds_whole_tables():
    def build():
        h = hybrid.HybridDLRM(DLRMConfig(tuple(CARDS)), "row_wise", seed=5)
        return [tuple(w.shape) for w in h.embeddings.weights]

    shapes = launch(build, world_size=2, timeout=60)
    assert [s[0] for s in shapes[0]] == [-(-n // 2) for n in CARDS]  # rank 0: the first half of each


def test_budget_makes_does_not_fit_real():
    big = [100_000] + CARDS[1:]
    budget = sharding.MemoryBudget(10 * 2**20, optimizer="adam")  # 10 MiB per rank

    def attempt(kind):
        try:
            h = hybrid.HybridDLRM(DLRMConfig(tuple(big)), kind, budget=budget)
        except sharding.BudgetExceededError as err:
            return "refused: " + str(err)
        hybrid.train_hybrid(h, TRAIN[:1024], batch_size=BATCH, lr=LR, budget=budget)
        return f"trained, holds {budget.held(h)} bytes"

    table_wise = launch(attempt, "table_wise", world_size=2, timeout=60)
    assert all(r.startswith("refused: rank 0 would need") for r in table_wise)
    assert "Table 0 alone needs" in table_wise[0]
    row_wise = launch(attempt, "row_wise", world_size=4, timeout=60)
    assert all(r.startswith("trained") for r in row_wise)
    with pytest.raises(sharding.BudgetExceededError, match="over its budget"):
        sharding.MemoryBudget(1024).enforce(torch.nn.Linear(100, 100))


def test_uneven_batches_are_refused_clearly():
    def odd():
        h = hybrid.HybridDLRM(DLRMConfig(tuple(CARDS)), "table_wise")
        with pytest.raises(ValueError, match="cannot be split equally over 2 ranks"):
            hybrid.train_hybrid(h, TRAIN[:1001], batch_size=BATCH)
        return True

    assert launch(odd, world_size=2, timeout=60) == [True, True]


def _train_sgd(average):
    h = hybrid.HybridDLRM(DLRM(CARDS, seed=0), "table_wise", average_embedding_gradients=average)
    hybrid.train_hybrid(h, TRAIN, batch_size=BATCH, lr=0.1, optimizer="sgd")
    return [(s, w.detach().clone()) for s, w in zip(h.embeddings.shards, h.embeddings.weights, strict=False)]


def test_without_the_division_sgd_moves_the_tables_w_times_as_far():
    """The hook matters, and the check can see it: with SGD the summed gradients make W times the steps."""
    start, reference = DLRM(CARDS, seed=0), DLRM(CARDS, seed=0)
    train.train(reference, TRAIN, batch_size=BATCH, lr=0.1, optimizer="sgd")
    pairs = zip(reference.embeddings, start.embeddings, strict=True)
    moved = max((a.weight - b.weight).abs().max().item() for a, b in pairs)
    for average, low, high in ((True, 0.999, 1.001), (False, 1.8, 2.2)):
        shards = [p for rank in launch(_train_sgd, average, world_size=2, timeout=120) for p in rank]
        hybrid_moved = max((w - s.of(start.embeddings[s.table].weight)).abs().max().item() for s, w in shards)
        gap = max((w - s.of(reference.embeddings[s.table].weight)).abs().max().item() for s, w in shards)
        assert low < hybrid_moved / moved < high, (average, hybrid_moved / moved)
        assert (gap < PARAM_TOL) == average, (average, gap)
