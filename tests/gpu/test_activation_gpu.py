"""Triton `silu_and_mul` vs the reference (`F.silu(gate) * up`): on CUDA against CPU copies,
and under the Triton interpreter on CPU tensors (a child process: TRITON_INTERPRET must be set
before triton is first imported; skipped without triton, and where CUDA runs the GPU tests).

Bounds (max-abs error over max-abs reference value): fp32 1e-6; bf16 / fp16 one ulp of the
result (silu is rounded to the storage dtype before the product, as torch rounds it, and exp's
last bit may flip that rounding); under the interpreter bf16 gets two ulps (it truncates
fp32 -> bf16 in both roundings where the GPU rounds to nearest)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hyla.ops.activation import reference, silu_and_mul

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
BOUNDS = {torch.float32: 1e-6, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}
SHAPES = [(1, 2), (3, 34), (5, 2 * 1024), (2, 3, 2 * 1100), (64, 2 * 512)]


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.float().cpu(), want.float().cpu()
    assert torch.isfinite(got).all()
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def check(fn, device: str, bf16_ulps: int = 1, limit: float | None = None) -> None:
    """fn vs `reference.silu_and_mul` (with `limit`: `silu_and_mul_clamped`; x ~ 3 N(0, 1), so
    a limit of 1.5 clamps most values)."""
    bounds = {**BOUNDS, torch.bfloat16: bf16_ulps * BOUNDS[torch.bfloat16]}
    ref = reference.silu_and_mul
    if limit is not None:
        ref = lambda x: reference.silu_and_mul_clamped(x, limit)  # noqa: E731
    for dtype in bounds:
        for i, shape in enumerate(SHAPES):
            x = (3 * torch.randn(shape, generator=torch.Generator().manual_seed(i))).to(dtype)
            x = x.to(device)
            got = fn(x)
            want = ref(x.cpu())
            assert got.dtype == dtype and got.shape == want.shape
            assert _rel(got, want) <= bounds[dtype], (dtype, shape)
        rows = torch.randn(8, 2 * 40, dtype=dtype, device=device)[::2]  # strided rows
        assert _rel(fn(rows), ref(rows.cpu())) <= bounds[dtype]
        assert fn(x[:0]).shape == (0, *want.shape[1:])


def test_dispatch_keeps_float64_and_empty_width_on_the_reference(monkeypatch) -> None:
    # The kernel computes in fp32: a float64 x (and an empty last dim, which it cannot reshape)
    # must stay on the reference even where triton would run. Without triton, a dispatch to the
    # kernel fails to import it; with it, the fp32 result differs from the float64 reference.
    import hyla.ops.activation as act

    monkeypatch.setattr(act, "use_triton", lambda x: True)
    x = 3 * torch.randn(3, 2 * 40, dtype=torch.float64)
    assert torch.equal(act.silu_and_mul(x), reference.silu_and_mul(x))
    assert act.silu_and_mul(torch.zeros(3, 0)).shape == (3, 0)
    assert act.kernel_supports(x.float()) and act.kernel_supports(x.bfloat16())
    assert not act.kernel_supports(x.float()[:, :-1]) and not act.kernel_supports(x.float().t())


def test_reference_rejects_odd_width() -> None:
    with pytest.raises(ValueError, match="even"):
        reference.silu_and_mul(torch.zeros(2, 5))


@needs_cuda
def test_silu_and_mul_cuda_matches_reference() -> None:
    check(silu_and_mul, "cuda")


@needs_cuda
def test_silu_and_mul_clamped_cuda_matches_reference() -> None:
    from hyla.ops.activation import silu_and_mul_clamped

    check(lambda x: silu_and_mul_clamped(x, 1.5), "cuda", limit=1.5)


@needs_cuda
def test_silu_and_mul_cuda_graph_replay() -> None:
    x = torch.randn(4, 2 * 256, device="cuda", dtype=torch.bfloat16)
    silu_and_mul(x)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = silu_and_mul(x)
    x.copy_(torch.randn_like(x))
    graph.replay()
    assert torch.equal(y, silu_and_mul(x))


def _interpreted_checks() -> None:
    from hyla.ops.activation import kernels

    check(kernels.silu_and_mul, "cpu", bf16_ulps=2)
    check(lambda x: kernels.silu_and_mul(x, 1.5), "cpu", bf16_ulps=2, limit=1.5)
    with pytest.raises(ValueError, match="even"):
        kernels.silu_and_mul(torch.zeros(2, 5))


def test_kernel_under_triton_interpreter() -> None:
    pytest.importorskip("triton")
    if HAS_CUDA:
        pytest.skip("CUDA present: the GPU tests above run the kernel")
    root = Path(__file__).resolve().parents[2]
    code = "import tests.gpu.test_activation_gpu as t; t._interpreted_checks()"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
