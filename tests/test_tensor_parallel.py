"""Tensor-parallel Linear layers (column and row split across 2 ranks) equal nn.Linear, forward and
backward, alone and chained as the Megatron MLP; an uneven split is a clear error."""

import pytest
import torch
import torch.distributed as dist
from torch import nn

from course_utils import launch
from course_utils.model_parallel.tensor_parallel import ColumnParallelLinear, RowParallelLinear

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
