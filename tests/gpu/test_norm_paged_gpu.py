"""Triton RMSNorm / fused add+RMSNorm / gated RMSNorm and paged write vs the CPU references.

GPU tests run the kernels on CUDA and the references on CPU copies. Bounds (max-abs error over
max-abs reference value): fp32 1e-5, bf16 1e-2 (the normed row is rounded to bf16 before the
weight multiplies it, so one-ulp flips of that rounding are allowed); the residual sum must be
bit-identical (torch rounds fp32 sums to bf16 the same way). The paged write is exact and must
leave every other row (poisoned) untouched, including slots of -1 tokens.

The interpreter tests run the same kernels on CPU tensors under TRITON_INTERPRET=1 (skipped
without triton, and on CUDA machines where the GPU tests cover them); the interpreter rounds
fp32 -> bf16 by truncation, so its bf16 residual is allowed one ulp.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hyla.ops.norm import fused_add_rms_norm, gated_rms_norm, reference, rms_norm
from hyla.ops.paged import reference as paged_reference
from hyla.ops.paged import write_paged

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
BOUNDS = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]
SHAPES = [
    pytest.param((1, 7), id="1x7"),
    pytest.param((33, 129), id="33x129"),
    pytest.param((3, 5, 1000), id="3x5x1000"),
    pytest.param((257, 2304), id="257x2304"),
    pytest.param((4, 7168), id="4x7168"),
]


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.float().cpu(), want.float().cpu()
    assert torch.isfinite(got).all()
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def _inputs(shape, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen).to(dtype)
    res = (3 * torch.randn(shape, generator=gen)).to(dtype)
    w = (1 + 0.1 * torch.randn(shape[-1], generator=gen)).to(dtype)
    return x.to(device), res.to(device), w.to(device)


@needs_cuda
@pytest.mark.parametrize("offset", [0.0, 1.0], ids=["plain", "offset1"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_cuda_matches_reference(dtype, shape, offset):
    x, _, w = _inputs(shape, dtype, "cuda")
    got = rms_norm(x, w, 1e-6, offset)
    want = reference.rms_norm(x.cpu(), w.cpu(), 1e-6, offset)
    assert got.dtype == dtype and got.shape == x.shape
    assert _rel(got, want) <= BOUNDS[dtype]


@needs_cuda
@pytest.mark.parametrize("offset", [0.0, 1.0], ids=["plain", "offset1"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rms_norm_cuda_matches_reference(dtype, shape, offset):
    x, res, w = _inputs(shape, dtype, "cuda")
    x_before, res_before = x.clone(), res.clone()
    normed, h = fused_add_rms_norm(x, res, w, 1e-6, offset)
    want_normed, want_h = reference.fused_add_rms_norm(x.cpu(), res.cpu(), w.cpu(), 1e-6, offset)
    assert torch.equal(h.cpu(), want_h)
    assert torch.equal(h, res + x)
    assert _rel(normed, want_normed) <= BOUNDS[dtype]
    assert torch.equal(x, x_before) and torch.equal(res, res_before)  # out of place


@needs_cuda
def test_rms_norm_cuda_noncontiguous_rows_and_empty():
    x, _, w = _inputs((16, 256), torch.bfloat16, "cuda")
    view = x[::2]  # row stride 512, unit last-dim stride
    assert _rel(rms_norm(view, w, 1e-6), reference.rms_norm(view.cpu(), w.cpu(), 1e-6)) <= 1e-2
    assert rms_norm(x[:0], w, 1e-6).shape == (0, 256)


@needs_cuda
def test_rms_norm_cuda_mixed_dtypes_fall_back():
    x, _, w = _inputs((4, 64), torch.bfloat16, "cuda")
    got = rms_norm(x, w.float(), 1e-6)  # weight fp32: reference promotion, result fp32
    assert got.dtype == torch.float32
    assert torch.equal(got.cpu(), reference.rms_norm(x.cpu(), w.float().cpu(), 1e-6))


GATED = [  # (activation, weight_in_fp32, weight dtype: None = x's): Kimi-Linear, Qwen3-Next
    pytest.param("sigmoid", True, torch.float32, id="kimi"),
    pytest.param("silu", False, None, id="qwen3next"),
]


def _gated_inputs(shape, dtype, weight_dtype, device, seed=0):
    x, _, w = _inputs(shape, dtype, device, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    gate = (2 * torch.randn(shape, generator=gen)).to(dtype).to(device)
    return x, gate, w.to(weight_dtype or dtype)


def _check_gated(x, gate, w, activation, weight_in_fp32, bound, fn=gated_rms_norm) -> None:
    got = fn(x, gate, w, 1e-6, activation, weight_in_fp32)
    want = reference.gated_rms_norm(x.cpu(), gate.cpu(), w.cpu(), 1e-6, activation,
                                    weight_in_fp32)  # fmt: skip
    assert got.dtype == want.dtype and got.shape == want.shape
    assert _rel(got, want) <= bound


@needs_cuda
@pytest.mark.parametrize("activation,weight_in_fp32,weight_dtype", GATED)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_rms_norm_cuda_matches_reference(dtype, shape, activation, weight_in_fp32,
                                               weight_dtype):  # fmt: skip
    x, gate, w = _gated_inputs(shape, dtype, weight_dtype, "cuda")
    _check_gated(x, gate, w, activation, weight_in_fp32, BOUNDS[dtype])


@needs_cuda
def test_gated_rms_norm_cuda_strided_rows_and_fallback():
    x, gate, w = _gated_inputs((16, 3, 128), torch.bfloat16, None, "cuda")
    _check_gated(x[::2], gate[1::2], w, "silu", False, 1e-2)  # row strides, unit last stride
    # weight fp32 without weight_in_fp32: reference type promotion (fp32 result), not the kernel
    _check_gated(x, gate, w.float(), "silu", False, 1e-6)
    assert gated_rms_norm(x[:0], gate[:0], w, 1e-6).shape == (0, 3, 128)
    # float64: the reference itself (fp32 statistics, float64 products) on the same device, not
    # the fp32 kernel; the CPU's fp32 rsqrt/exp differ from CUDA's in the last bits
    xd, gd, wd = x.double(), gate.double(), w.double()
    _check_gated(xd, gd, wd, "silu", False, 1e-6)
    got = gated_rms_norm(xd, gd, wd, 1e-6, "silu", False)
    assert torch.equal(got, reference.gated_rms_norm(xd, gd, wd, 1e-6, "silu", False))


def _poisoned_cache(shape, dtype, device):
    poison = torch.full(shape, float("nan") if dtype.itemsize == 1 else 1e30)
    return poison.to(dtype).to(device)


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.cpu().contiguous().view(torch.uint8)


def _slots(num_tokens, num_slots, seed, num_skipped):
    gen = torch.Generator().manual_seed(seed)
    slots = torch.randperm(num_slots, generator=gen)[:num_tokens]
    slots[torch.randperm(num_tokens, generator=gen)[:num_skipped]] = -1
    return slots


PAGED = [
    pytest.param((64, 16, 576), torch.bfloat16, 300, id="latent-bf16"),
    pytest.param((8, 16, 4, 7), torch.float32, 50, id="odd-fp32"),
    pytest.param((32, 64, 132), torch.float8_e4m3fn, 1000, id="indexer-fp8"),
    pytest.param((512, 16, 3), torch.bfloat16, 4000, id="many-tokens"),
]


@needs_cuda
@pytest.mark.parametrize("shape,dtype,num_tokens", PAGED)
@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32], ids=["i64", "i32"])
def test_write_paged_cuda_matches_reference(shape, dtype, num_tokens, slot_dtype):
    num_slots = shape[0] * shape[1]
    slots = _slots(num_tokens, num_slots, seed=num_tokens, num_skipped=num_tokens // 5)
    values = torch.randn(num_tokens, *shape[2:], generator=torch.Generator().manual_seed(1))
    cache = _poisoned_cache(shape, dtype, "cuda")
    write_paged(cache, slots.to("cuda", slot_dtype), values.to("cuda", torch.bfloat16))
    want = _poisoned_cache(shape, dtype, "cpu")
    keep = slots >= 0
    paged_reference.write_paged(want, slots[keep], values[keep].to(torch.bfloat16))
    assert torch.equal(_as_bytes(cache), _as_bytes(want))  # -1 rows and unused rows untouched


@needs_cuda
def test_write_paged_cuda_shape_mismatch_raises():
    cache = torch.zeros(4, 16, 8, device="cuda")
    with pytest.raises(ValueError, match="do not fit"):
        write_paged(cache, torch.zeros(3, dtype=torch.long, device="cuda"),
                    torch.zeros(3, 9, device="cuda"))  # fmt: skip


# ---- the same kernels under the Triton interpreter, on CPU tensors ----------------------------
# Run in a child process: TRITON_INTERPRET must be set before triton is first imported (triton's
# own @jit helpers such as tl.sum are created at import).


def _interpreted_norm_checks() -> None:
    from hyla.ops.norm import kernels

    for dtype in (torch.float32, torch.bfloat16):
        ulp = 0.0 if dtype == torch.float32 else 2.0**-7
        for offset in (0.0, 1.0):
            for shape in [(1, 7), (9, 129), (2, 3, 64)]:
                x, res, w = _inputs(shape, dtype, "cpu")
                got = kernels.rms_norm(x, w, 1e-6, offset)
                assert _rel(got, reference.rms_norm(x, w, 1e-6, offset)) <= BOUNDS[dtype]
                normed, h = kernels.fused_add_rms_norm(x, res, w, 1e-6, offset)
                want_normed, want_h = reference.fused_add_rms_norm(x, res, w, 1e-6, offset)
                assert ((h.float() - want_h.float()).abs() <= ulp * want_h.float().abs()).all()
                assert _rel(normed, want_normed) <= 2 * BOUNDS[dtype]


def _interpreted_gated_norm_checks() -> None:
    from hyla.ops.norm import gated_kernels

    for dtype in (torch.float32, torch.bfloat16):
        for activation, in_fp32, weight_dtype in (("sigmoid", True, torch.float32),
                                                   ("silu", False, None)):  # fmt: skip
            for shape in [(1, 7), (9, 129), (2, 3, 64)]:
                x, gate, w = _gated_inputs(shape, dtype, weight_dtype, "cpu")
                assert gated_kernels.supports(x, gate, w, in_fp32)
                _check_gated(x, gate, w, activation, in_fp32, 2 * BOUNDS[dtype],
                             fn=gated_kernels.gated_rms_norm)  # fmt: skip
            x, gate, w = _gated_inputs((4, 2, 32), dtype, weight_dtype, "cpu")
            _check_gated(x[::2], gate[1::2], w, activation, in_fp32, 2 * BOUNDS[dtype],
                         fn=gated_kernels.gated_rms_norm)  # fmt: skip
    # the kernel computes in fp32 (a float64 x keeps float64 products in the reference) and
    # cannot reshape an empty row: both stay on the reference
    x, gate, w = _gated_inputs((4, 32), torch.float64, None, "cpu")
    assert not gated_kernels.supports(x, gate, w, False)
    assert not gated_kernels.supports(x, gate, w.float(), True)
    assert not gated_kernels.supports(x[:, :0], gate[:, :0], w[:0].float(), True)
    assert gated_kernels.supports(x.float(), gate, w.float(), False)  # any gate dtype


def _interpreted_paged_checks() -> None:
    from hyla.ops.paged import kernels

    for dtype in (torch.float32, torch.bfloat16, torch.float8_e4m3fn):
        shape = (6, 4, 3, 5)
        slots = _slots(12, 24, seed=0, num_skipped=3)
        values = torch.randn(12, 3, 5)
        cache, want = _poisoned_cache(shape, dtype, "cpu"), _poisoned_cache(shape, dtype, "cpu")
        kernels.write_paged(cache, slots, values)
        keep = slots >= 0
        paged_reference.write_paged(want, slots[keep], values[keep])
        assert torch.equal(_as_bytes(cache), _as_bytes(want))


def test_kernels_under_triton_interpreter():
    pytest.importorskip("triton")
    if HAS_CUDA:
        pytest.skip("CUDA present: the GPU tests above run these kernels")
    root = Path(__file__).resolve().parents[2]
    code = (
        "import tests.gpu.test_norm_paged_gpu as t; "
        "t._interpreted_norm_checks(); t._interpreted_gated_norm_checks(); "
        "t._interpreted_paged_checks()"
    )
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
