"""Dispatch to the GPU kernels: only CUDA tensors, and only when triton is installed."""

import torch

from hyla.ops import gpu


def test_cpu_tensors_never_take_the_triton_path(monkeypatch):
    monkeypatch.setattr(gpu, "triton_available", lambda: True)
    assert not gpu.use_triton(torch.zeros(2))


def test_cuda_without_triton_falls_back(monkeypatch):
    class FakeCuda:
        is_cuda = True

    monkeypatch.setattr(gpu, "triton_available", lambda: False)
    assert not gpu.use_triton(FakeCuda())
    monkeypatch.setattr(gpu, "triton_available", lambda: True)
    assert gpu.use_triton(FakeCuda())
