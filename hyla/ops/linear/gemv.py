"""Triton GEMV for decode-sized projections, where cuBLAS's tiles (made for larger M) lag."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

FLOATS = (torch.float16, torch.bfloat16, torch.float32)
MAX_ROWS = 4  # the [rows, BLOCK_N, BLOCK_D] product lives in registers


@triton.jit
def _gemv_kernel(
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
    BLOCK_D: tl.constexpr,
):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    offs_m = tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for d0 in range(0, D, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        mask_d = offs_d < D
        w = tl.load(w_rows + offs_d[None, :], mask=mask_n[:, None] & mask_d[None, :], other=0.0)
        x = tl.load(x_rows + offs_d[None, :], mask=mask_m[:, None] & mask_d[None, :], other=0.0)
        acc += tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
    out = out_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@dataclass(frozen=True)
class GemvTiles:
    """`gemv` tiles: output columns per program, D per load, warps."""

    cols: int = 4
    depth: int = 2048
    warps: int = 4


def pick_tiles(rows: int, out_features: int, in_features: int) -> GemvTiles:
    """H200 sweep picks; one column per program below 512 outputs, where 4 leave SMs idle."""
    return GemvTiles(cols=4 if out_features >= 512 else 1, depth=2048, warps=4)


def fits_rows(x: torch.Tensor, weight: torch.Tensor, max_rows: int) -> bool:
    """x [..., D] of 1 to max_rows rows, weight [N, D], unit last strides, one device."""
    rows = x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0
    return (
        0 < rows <= max_rows
        and weight.dim() == 2
        and weight.shape[1] == x.shape[-1]
        and x.stride(-1) == 1
        and weight.stride(-1) == 1
        and x.device == weight.device
    )


def supports(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return fits_rows(x, weight, MAX_ROWS) and x.dtype in FLOATS and weight.dtype in FLOATS


def gemv(x: torch.Tensor, weight: torch.Tensor, tiles: GemvTiles | None = None) -> torch.Tensor:
    """x [..., D] (1 to MAX_ROWS rows) @ weight [N, D]^T -> [..., N] in the promoted dtype."""
    if not supports(x, weight):
        raise ValueError(f"gemv: unsupported x {tuple(x.shape)} {x.dtype} / weight "
                         f"{tuple(weight.shape)} {weight.dtype} "
                         f"(1-{MAX_ROWS} rows, fp16/bf16/fp32)")  # fmt: skip
    n, d = weight.shape
    x2 = x.reshape(-1, d)
    out_dtype = torch.promote_types(x.dtype, weight.dtype)
    out = torch.empty(x2.shape[0], n, dtype=out_dtype, device=x.device)
    t = tiles or pick_tiles(x2.shape[0], n, d)
    _gemv_kernel[(triton.cdiv(n, t.cols),)](
        x2, weight, out, x2.shape[0], n, d, x2.stride(0), weight.stride(0), out.stride(0),
        BLOCK_M=max(1, triton.next_power_of_2(x2.shape[0])), BLOCK_N=t.cols,
        BLOCK_D=min(t.depth, triton.next_power_of_2(d)), num_warps=t.warps,
    )  # fmt: skip
    return out.view(*x.shape[:-1], n)
