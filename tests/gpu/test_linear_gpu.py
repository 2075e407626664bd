"""The Triton GEMV of decode-sized linear projections (`hyla.ops.linear.gemv`) against F.linear
in float64 on the same inputs (`check_gemv` takes a device: test_linear_interpret.py runs it on
CPU tensors under TRITON_INTERPRET=1), with tiles that split N and D unevenly, and replayed from
a CUDA graph."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def check_gemv(
    rows: int, n: int, d: int, dtype: torch.dtype, device, tiles=None, w_dtype=None
) -> float:
    """`gemv.gemv` vs float64 F.linear; returns max |diff| / max |want| (the inputs are
    rounded to `dtype` (the weight to `w_dtype`, default dtype) first, so only the fp32 sums
    and the output rounding differ)."""
    from hyla.ops.linear import gemv

    gen = torch.Generator().manual_seed(rows * 1000 + n + d)
    x = torch.randn(rows, d, generator=gen).to(dtype)
    w = (torch.randn(n, d, generator=gen) / d**0.5).to(w_dtype or dtype)
    want = F.linear(x.double(), w.double())
    got = gemv.gemv(x.to(device), w.to(device), tiles)
    assert got.shape == (rows, n) and got.dtype == torch.promote_types(x.dtype, w.dtype)
    return float((got.double().cpu() - want).abs().max() / want.abs().max())


# fp32: fp32 sums of d products (~d * 2^-24 relative); bf16: the output's rounding (2^-8)
BOUNDS = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 2e-3}


@pytest.mark.parametrize("rows", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n, d", [(6144, 2048), (16, 2048), (2048, 128), (1000, 7168), (33, 70)])
def test_gemv_matches_float64(rows, dtype, n, d) -> None:
    assert check_gemv(rows, n, d, dtype, "cuda") <= BOUNDS[dtype]


def test_bf16_rows_times_a_float32_weight() -> None:
    """A sigmoid router's logits: bf16 x, float32 weight -> float32 sums of x's exact values."""
    assert check_gemv(1, 256, 7168, torch.bfloat16, "cuda", w_dtype=torch.float32) <= 1e-5


@pytest.mark.parametrize("tiles", [(1, 512, 4), (8, 2048, 8), (3, 100, 4)])
def test_gemv_any_tiles(tiles) -> None:
    from hyla.ops.linear.gemv import GemvTiles

    t = GemvTiles(*tiles)
    if t.cols & (t.cols - 1):  # not a power of two: the kernel's tiles must be
        with pytest.raises(Exception):  # noqa: B017 (triton's compile error types vary by version)
            check_gemv(2, 100, 300, torch.float32, "cuda", t)
        return
    assert check_gemv(2, 100, 300, torch.float32, "cuda", t) <= 1e-5


def test_gemv_rejects_what_it_cannot_take() -> None:
    from hyla.ops.linear import gemv

    w = torch.randn(8, 16, device="cuda")
    bad = [torch.randn(5, 16, device="cuda"), torch.randn(1, 16, device="cuda").double(),
           torch.randn(2, 32, device="cuda")[:, ::2], torch.randn(1, 8, device="cuda")]  # fmt: skip
    for x in bad:
        assert not gemv.supports(x, w)
        with pytest.raises(ValueError, match="gemv"):
            gemv.gemv(x, w)


def test_gemv_in_cuda_graph() -> None:
    from hyla.ops.linear import gemv

    w = torch.randn(300, 256, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(2, 256, device="cuda", dtype=torch.bfloat16)
    gemv.gemv(x, w)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gemv.gemv(x, w)
    x.copy_(torch.randn_like(x))
    graph.replay()
    assert torch.equal(out, gemv.gemv(x, w))
