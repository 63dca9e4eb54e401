"""Fixtures shared by the unit tests."""

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
