"""The hyper-connection kernels (`hyla.ops.hyper_connection.kernels`) against their PyTorch
definition (`reference.hc_pre_norm`, `reference.hc_expand`) on the same device, and inside a
CUDA graph. The checks take a device: test_hyper_connection_interpret.py runs them on CPU
tensors under TRITON_INTERPRET=1.

Bounds: fp32 to 1e-5 (the kernel sums the dot products in another order and scales by the RMS
after them, not before); bf16 to 2 ulps (x and the streams are rounded to bf16 once, as in the
reference, so a 1-ulp-apart fp32 value may round to the neighbour)."""

from __future__ import annotations

import pytest
import torch

from hyla.ops.hyper_connection import reference

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

SHAPES = [(1, 4, 64), (5, 4, 96), (3, 2, 128), (33, 4, 256)]  # (T, N, D)


def hc_inputs(T: int, N: int, D: int, dtype, device, seed: int = 0):
    """streams [T, N, D], fn [(2 + N) N, N D], base, scale (fp32), norm weight [D]: a model's
    values (fn small, as the checkpoints' ~N D^-0.5 rows)."""
    gen = torch.Generator().manual_seed(seed)
    streams = torch.randn(T, N, D, generator=gen)
    fn = torch.randn((2 + N) * N, N * D, generator=gen) * (N * D) ** -0.5
    base = torch.randn((2 + N) * N, generator=gen) * 0.5
    scale = torch.rand(3, generator=gen) + 0.5
    weight = torch.rand(D, generator=gen) + 0.5
    cast = [t.to(dtype).to(device) for t in (streams, fn, weight)]
    return cast[0], cast[1], base.to(device), scale.to(device), cast[2]


def _tol(dtype) -> dict:
    return dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2**-6, atol=2**-6)


def check_pre_norm(T: int, N: int, D: int, dtype, device: str, offset: float = 0.0) -> None:
    from hyla.ops.hyper_connection import kernels

    streams, fn, base, scale, weight = hc_inputs(T, N, D, dtype, device)
    args = (streams, fn, base, scale, 1e-6, 20, 1e-5, weight, 1e-5, offset)
    got, want = kernels.hc_pre_norm(*args), reference.hc_pre_norm(*args)
    assert got[0].dtype == dtype and got[0].shape == (T, D)
    torch.testing.assert_close(got[0].float(), want[0].float(), **_tol(dtype))
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[2], want[2], rtol=1e-4, atol=1e-5)


def check_expand(T: int, N: int, D: int, dtype, device: str) -> None:
    from hyla.ops.hyper_connection import kernels

    streams, fn, base, scale, weight = hc_inputs(T, N, D, dtype, device, seed=1)
    _, post, comb = reference.hc_weights(streams, fn, base, scale, 1e-6, 20, 1e-5)
    out = torch.randn(T, D, generator=torch.Generator().manual_seed(2)).to(dtype).to(device)
    got, want = (
        kernels.hc_expand(out, streams, post, comb),
        reference.hc_expand(out, streams, post, comb),
    )
    assert got.dtype == dtype and got.shape == (T, N, D) and got.is_contiguous()
    torch.testing.assert_close(got.float(), want.float(), **_tol(dtype))


DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


@DTYPES
@pytest.mark.parametrize(("T", "N", "D"), SHAPES)
def test_pre_norm(T: int, N: int, D: int, dtype: torch.dtype) -> None:
    check_pre_norm(T, N, D, dtype, "cuda")


@pytest.mark.parametrize(("T", "N", "D"), [(64, 4, 2048), (1, 4, 4096)])
def test_pre_norm_model_sizes(T: int, N: int, D: int) -> None:
    check_pre_norm(T, N, D, torch.bfloat16, "cuda")
    check_pre_norm(T, N, D, torch.float32, "cuda", offset=1.0)


@DTYPES
@pytest.mark.parametrize(("T", "N", "D"), [*SHAPES, (64, 4, 2048)])
def test_expand(T: int, N: int, D: int, dtype: torch.dtype) -> None:
    check_expand(T, N, D, dtype, "cuda")


def test_pre_norm_and_expand_in_a_cuda_graph() -> None:
    from hyla.ops.hyper_connection import kernels

    streams, fn, base, scale, weight = hc_inputs(4, 4, 512, torch.bfloat16, "cuda")
    args = (fn, base, scale, 1e-6, 20, 1e-5, weight, 1e-5)
    x, post, comb = kernels.hc_pre_norm(streams, *args)  # compile outside the capture
    kernels.hc_expand(x, streams, post, comb)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        x, post, comb = kernels.hc_pre_norm(streams, *args)
        y = kernels.hc_expand(x, streams, post, comb)
    streams.copy_(torch.randn_like(streams))
    graph.replay()
    want = reference.hc_pre_norm(streams, *args)
    torch.testing.assert_close(x.float(), want[0].float(), **_tol(torch.bfloat16))
    want_y = reference.hc_expand(want[0], streams, want[1], want[2])
    torch.testing.assert_close(y.float(), want_y.float(), **_tol(torch.bfloat16))
