"""Triton GEMM for decode batches of a few dozen rows: out = x W^T for x of 2 to `MAX_ROWS` rows,
every row of x in each program's tile (tensor-core `tl.dot`, rows padded to 16), the weight
streamed once by programs that each own `cols` output columns.

    program n0 (columns n0 .. n0 + cols of N):
        for k0 in 0, depth, ..:  acc[:, n] += x[:, k0:k0 + depth] @ W[n, k0:k0 + depth]^T  (fp32)
        out[:, n] = round(acc[:, n])

Same result as `reference.linear` (F.linear, no bias) up to the order of the fp32 sums. Why: at
64 rows cuBLAS picked kernels that moved the e2e model's projection weights at well under half of
the H200's copy bandwidth (bench/results/gpu_profile_decode_B64_h200.txt: 4.1 us a call for 2048
x 128..2048 weights). Not dispatched yet (`dispatch.SKINNY_ROWS` is None) until
bench/gpu_gemv_sweep.py (parts skinny16, skinny64) measures it against cuBLAS on a GPU.
fp16 / bf16 only: fp32 inputs would make `tl.dot` use TF32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from hyla.ops.linear.gemv import fits_rows

MAX_ROWS = 64


@triton.jit
def _skinny_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    M,
    N,
    D,
    stride_xm,
    stride_wn,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, D, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < D
        x = tl.load(x_rows + offs_k[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        w = tl.load(w_rows + offs_k[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
    out = out_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@dataclass(frozen=True)
class SkinnyTiles:
    """Tile sizes of `skinny_linear` (tuning only): `cols` output columns per program (>= 16),
    `depth` of D per step (>= 16), `warps` and `stages` per program."""

    cols: int = 16
    depth: int = 128
    warps: int = 4
    stages: int = 3


def supports(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """True when `skinny_linear` takes (x, weight): `gemv.fits_rows` with MAX_ROWS, one
    fp16/bf16 dtype."""
    half = (torch.float16, torch.bfloat16)
    return fits_rows(x, weight, MAX_ROWS) and x.dtype == weight.dtype and x.dtype in half


def skinny_linear(
    x: torch.Tensor, weight: torch.Tensor, tiles: SkinnyTiles | None = None
) -> torch.Tensor:
    """x W^T (`reference.linear` without bias) for a few dozen rows.

    Args:
        x: [..., D] with 1 to MAX_ROWS rows in all; weight: [N, D] in x's dtype (fp16 / bf16),
            unit-stride rows; tiles: the tile sizes (default `SkinnyTiles()`).
    Returns: [..., N] in x's dtype.
    Raises: ValueError when `supports(x, weight)` is false or a tile is below 16.
    """
    if not supports(x, weight):
        raise ValueError(f"skinny_linear: unsupported x {tuple(x.shape)} {x.dtype} / weight "
                         f"{tuple(weight.shape)} {weight.dtype} "
                         f"(1-{MAX_ROWS} rows, one fp16/bf16 dtype)")  # fmt: skip
    t = tiles or SkinnyTiles()
    if t.cols < 16 or t.depth < 16:
        raise ValueError(f"skinny_linear: tiles below 16 (tl.dot's minimum): {t}")
    n, d = weight.shape
    x2 = x.reshape(-1, d)
    out = torch.empty(x2.shape[0], n, dtype=x.dtype, device=x.device)
    _skinny_kernel[(triton.cdiv(n, t.cols),)](
        x2, weight, out, x2.shape[0], n, d, x2.stride(0), weight.stride(0), out.stride(0),
        BLOCK_M=max(16, triton.next_power_of_2(x2.shape[0])), BLOCK_N=t.cols,
        BLOCK_K=min(t.depth, max(16, triton.next_power_of_2(d))), num_warps=t.warps,
        num_stages=t.stages,
    )  # fmt: skip
    return out.view(*x.shape[:-1], n)
