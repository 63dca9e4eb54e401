"""Fixtures shared by the unit tests."""

import matplotlib
import pytest
import torch


@pytest.fixture
def meta_as_gpu(monkeypatch):
    """Meta tensors stand in for GPU tensors: ``Tensor.cpu`` of a meta tensor gives zeros of its
    shape (and leaves other tensors alone); returns the list of shapes copied, in order."""
    copied = []

    def cpu(self):
        copied.append(tuple(self.shape))
        return torch.zeros(self.shape, dtype=self.dtype) if self.device.type == "meta" else self

    monkeypatch.setattr(torch.Tensor, "cpu", cpu)
    return copied


@pytest.fixture(scope="module")
def agg_backend():
    """Draw with Agg (no display) in the module that asks for it, then give the session its
    backend back (``pytestmark = pytest.mark.usefixtures("agg_backend")``)."""
    before = matplotlib.get_backend()
    matplotlib.use("Agg")
    yield
    matplotlib.use(before)
