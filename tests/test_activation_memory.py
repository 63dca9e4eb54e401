"""What autograd saves for backward, measured with saved_tensors_hooks, against a hand count."""

import pytest
import torch
from torch import nn

from course_utils.model_parallel.activation_memory import layer_output_bytes, saved_for_backward

pytestmark = pytest.mark.chapter(5)

F32 = 4  # bytes per float32


def tiny_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


def test_saved_bytes_match_a_hand_count():
    # Linear(3, 4) saves its input x [5, 3] (for the weight gradient; x needs no gradient, so
    # not its weight). ReLU saves its output [5, 4]. Linear(4, 2) saves that same output (its
    # input: one storage, counted once) and its weight [2, 4] (for the input gradient).
    saved = saved_for_backward(tiny_model(), torch.randn(5, 3))
    assert saved.activation_bytes == (5 * 3 + 5 * 4) * F32
    assert saved.parameter_bytes == 2 * 4 * F32
    assert saved.saved_tensors == 4  # x, ReLU output twice, weight
    assert saved.output.shape == (5, 2) and saved.output.grad_fn is not None


def test_the_estimate_from_shapes_counts_outputs_instead():
    # outputs of Linear [5, 4], ReLU [5, 4], Linear [5, 2]: the first is never saved, x is
    assert layer_output_bytes(tiny_model(), torch.randn(5, 3)) == (5 * 4 + 5 * 4 + 5 * 2) * F32


def test_an_input_that_needs_a_gradient_makes_the_first_linear_save_its_weight():
    x = torch.randn(5, 3, requires_grad=True)
    saved = saved_for_backward(tiny_model(), x)
    assert saved.activation_bytes == (5 * 3 + 5 * 4) * F32
    assert saved.parameter_bytes == (4 * 3 + 2 * 4) * F32


def test_views_of_one_tensor_count_once_and_no_grad_saves_nothing():
    class TwoViews(nn.Module):
        def forward(self, x):
            return (x[:, :2] * x[:, 2:]).sum()

    x = torch.randn(4, 4, requires_grad=True)
    saved = saved_for_backward(TwoViews(), x)
    # mul saves both factors: two views of x's one storage [4, 4], held once
    assert saved.saved_tensors == 2 and saved.activation_bytes == 4 * 4 * F32
    frozen = tiny_model().requires_grad_(False)
    assert saved_for_backward(frozen, torch.randn(5, 3)).activation_bytes == 0


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="needs an nn.Module, got function"):
        saved_for_backward(lambda x: x, torch.randn(2))
