"""Tensor-parallel Linear layers (column and row split across 2 ranks) equal nn.Linear, forward and
backward, alone and chained as the Megatron MLP (also written with its f and g); an uneven split is
a clear error. PyTorch's parallelize_module (ColwiseParallel, RowwiseParallel) on a 1-D mesh equals
the course's layers, and on a 2-D ("dp", "tp") mesh of 4 ranks equals one process."""

import pytest
import torch
import torch.distributed as dist
from torch import nn

from course_utils import launch
from course_utils.model_parallel.tensor_parallel import ColumnParallelLinear, MegatronMLP, RowParallelLinear
from course_utils.model_parallel.torch_tp import torch_tp_vs_course, tp_dp_gradients

pytestmark = [pytest.mark.chapter(5), pytest.mark.launches]

TIMEOUT = 60


def _tensor_parallel_check(seed):
    torch.manual_seed(seed)
    x = torch.randn(6, 8)
    first, second = nn.Linear(8, 12), nn.Linear(12, 4)
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {}
    # one Linear split by output features (columns of y), then by input features (rows of W^T)
    for name, layer in (("column", ColumnParallelLinear(first)), ("row", RowParallelLinear(first))):
        xi = x.clone().requires_grad_(True)
        out = layer(xi)
        out.pow(2).sum().backward()
        results[name] = (out.detach(), xi.grad, layer.weight.grad, layer.bias.grad)
    # the Megatron MLP: column (no gather) -> ReLU -> row (sharded input):
    # one all_reduce forward, one backward
    col, row = (
        ColumnParallelLinear(first, gather_output=False),
        RowParallelLinear(second, input_is_sharded=True),
    )
    xi = x.clone().requires_grad_(True)
    out = row(torch.relu(col(xi)))
    out.pow(2).sum().backward()
    results["mlp"] = (out.detach(), xi.grad, col.weight.grad, row.weight.grad)
    return rank, world, results


def test_column_and_row_parallel_linear_equal_nn_linear():
    torch.manual_seed(5)
    x = torch.randn(6, 8)
    first, second = nn.Linear(8, 12), nn.Linear(12, 4)
    results = launch(_tensor_parallel_check, 5, world_size=2, timeout=TIMEOUT)
    # the same on one process
    ref = {}
    for name in ("column", "row"):
        first.zero_grad()
        xi = x.clone().requires_grad_(True)
        out = first(xi)
        out.pow(2).sum().backward()
        ref[name] = (out.detach(), xi.grad, first.weight.grad.clone(), first.bias.grad.clone())
    first.zero_grad()
    xi = x.clone().requires_grad_(True)
    out = second(torch.relu(first(xi)))
    out.pow(2).sum().backward()
    ref["mlp"] = (out.detach(), xi.grad, first.weight.grad.clone(), second.weight.grad.clone())
    close = dict(atol=1e-5, rtol=1e-5)
    for rank, _world, res in results:
        for name in ("column", "row", "mlp"):
            torch.testing.assert_close(res[name][0], ref[name][0], **close)  # output, full on every rank
            torch.testing.assert_close(res[name][1], ref[name][1], **close)  # dL/dx, full on every rank
        rows, cols = slice(6 * rank, 6 * rank + 6), slice(4 * rank, 4 * rank + 4)
        torch.testing.assert_close(res["column"][2], ref["column"][2][rows], **close)  # this rank's rows of W
        torch.testing.assert_close(res["column"][3], ref["column"][3][rows], **close)
        torch.testing.assert_close(res["row"][2], ref["row"][2][:, cols], **close)  # this rank's columns
        torch.testing.assert_close(res["row"][3], ref["row"][3], **close)  # bias, added once
        torch.testing.assert_close(res["mlp"][2], ref["mlp"][2][rows], **close)
        torch.testing.assert_close(res["mlp"][3], ref["mlp"][3][:, rows], **close)


def _uneven_split():
    ColumnParallelLinear(nn.Linear(4, 5))


def test_uneven_split_is_a_clear_error():
    from course_utils import RankFailedError

    with pytest.raises(RankFailedError, match="dimension 0 of size 5 cannot be split evenly across 2 ranks"):
        launch(_uneven_split, world_size=2, timeout=TIMEOUT, show_output=False)


def _megatron_mlp(first, second, x):
    mlp = MegatronMLP(first, second)
    xi = x.clone().requires_grad_(True)
    out = mlp(xi)
    out.pow(2).sum().backward()
    return out.detach(), xi.grad, mlp.column.weight.grad, mlp.row.weight.grad, mlp.row.bias.grad


def test_megatron_mlp_with_f_and_g_equals_the_unsplit_mlp():
    torch.manual_seed(6)
    x, first, second = torch.randn(6, 8), nn.Linear(8, 12), nn.Linear(12, 4)
    results = launch(_megatron_mlp, first, second, x, world_size=2, timeout=TIMEOUT, show_output=False)
    xi = x.clone().requires_grad_(True)
    ref = second(torch.relu(first(xi)))
    ref.pow(2).sum().backward()
    close = dict(atol=1e-5, rtol=1e-5)
    for rank, (out, x_grad, col_grad, row_grad, bias_grad) in enumerate(results):
        mine = slice(6 * rank, 6 * rank + 6)
        torch.testing.assert_close(out, ref.detach(), **close)
        torch.testing.assert_close(x_grad, xi.grad, **close)  # f summed the ranks' parts of dL/dx
        torch.testing.assert_close(col_grad, first.weight.grad[mine], **close)
        torch.testing.assert_close(row_grad, second.weight.grad[:, mine], **close)
        torch.testing.assert_close(bias_grad, second.bias.grad, **close)


def _megatron_uneven():
    MegatronMLP(nn.Linear(4, 5), nn.Linear(5, 4))


def _megatron_mismatch():
    MegatronMLP(nn.Linear(4, 6), nn.Linear(8, 4))


def test_megatron_mlp_errors_name_the_size_and_the_fix():
    from course_utils import RankFailedError

    match = (
        "hidden size 5 is not divisible by the tensor-parallel degree 2: "
        "use a hidden size that is a multiple of 2 .e.g. 6."
    )
    with pytest.raises(RankFailedError, match=match):
        launch(_megatron_uneven, world_size=2, timeout=TIMEOUT, show_output=False)
    with pytest.raises(RankFailedError, match="first layer gives 6 features but the second takes 8"):
        launch(_megatron_mismatch, world_size=2, timeout=TIMEOUT, show_output=False)


def test_torch_parallelize_module_equals_the_course_layers():
    torch.manual_seed(3)
    first, second, x = nn.Linear(8, 12), nn.Linear(12, 6), torch.randn(4, 8)
    for result in launch(
        torch_tp_vs_course, first, second, x, world_size=2, timeout=TIMEOUT, show_output=False
    ):
        assert result["placements"] == {
            "0.weight": "Shard(0)",
            "0.bias": "Shard(0)",
            "2.weight": "Shard(1)",
            "2.bias": "Replicate",
        }
        assert result["shapes"] == {"0.weight": [6, 8], "0.bias": [6], "2.weight": [6, 6], "2.bias": [6]}
        assert result["same_shards"] is True  # torch's local shards are the course's slices, exactly
        assert result["forward"] < 1e-6, result
        assert result["gradients"] < 1e-6, result


def test_2d_mesh_tensor_and_data_parallel_equals_one_process():
    torch.manual_seed(7)
    first, second = nn.Linear(8, 12), nn.Linear(12, 6)
    x, y = torch.randn(8, 8), torch.randn(8, 6)
    results = launch(
        tp_dp_gradients, first, second, x, y, 2, 2, world_size=4, timeout=TIMEOUT, show_output=False
    )
    ref = nn.Sequential(first, nn.ReLU(), second)
    nn.functional.mse_loss(ref(x), y).backward()
    assert [r["coordinates"] for r in results] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for r in results:
        for name, p in ref.named_parameters():
            torch.testing.assert_close(r["grads"][name], p.grad, atol=1e-5, rtol=1e-5)
    # each data-parallel group alone (half the batch) would give other gradients: the average matters
    half = nn.Sequential(nn.Linear(8, 12), nn.ReLU(), nn.Linear(12, 6))
    half.load_state_dict(ref.state_dict())
    nn.functional.mse_loss(half(x[:4]), y[:4]).backward()
    assert (half[0].weight.grad - ref[0].weight.grad).abs().max() > 1e-3


def _tp_dp_wrong_mesh():
    tp_dp_gradients(nn.Linear(4, 4), nn.Linear(4, 4), torch.randn(4, 4), torch.randn(4, 4), 2, 2)


def test_2d_mesh_that_does_not_match_the_ranks_is_refused():
    from course_utils import RankFailedError

    with pytest.raises(RankFailedError, match="a 2 x 2 mesh needs 4 ranks, got 2"):
        launch(_tp_dp_wrong_mesh, world_size=2, timeout=TIMEOUT, show_output=False)
