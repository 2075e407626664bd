"""Triton block-scaled fp8 GEMV and GEMM (`reference.fp8_linear`), x quantized in the kernel;
split-K partials summed in split order (deterministic, unlike atomics)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyla.ops.fp8.reference import FP8
from hyla.ops.fp8.tiles import (
    FUSED_ROWS,  # noqa: F401 (re-exported: the docstring names it)
    GEMV_ROWS,
    GemmConfig,
    GemvConfig,
    default_linear,
    pick_linear,
)

FLOATS = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _round_e4m3(v):
    """v (|v| <= 448) rounded to e4m3, ties to even, in fp32: the interpreter's direct
    f32 -> e4m3 conversion mis-rounds across binades."""
    bits = v.to(tl.int32, bitcast=True)
    e = tl.maximum((bits >> 23) & 0xFF, 127 - 6)  # e4m3 normals from 2^-6
    step = ((e - 3) << 23).to(tl.float32, bitcast=True)
    inv = ((254 - e + 3) << 23).to(tl.float32, bitcast=True)
    magic = 12582912.0  # 1.5 * 2^23: adding it rounds to an integer, half to even
    r = ((tl.abs(v) * inv + magic) - magic) * step
    return (r.to(tl.int32, bitcast=True) | (bits & -2147483648)).to(tl.float32, bitcast=True)


@triton.jit
def _quantize_groups(x, AXIS: tl.constexpr):
    amax = tl.max(tl.abs(x), axis=AXIS)
    scale = tl.where(amax > 0, tl.math.div_rn(amax, 448.0), 1.0)
    v = tl.math.div_rn(x, tl.expand_dims(scale, AXIS))
    return _round_e4m3(tl.minimum(tl.maximum(v, -448.0), 448.0)), scale


@triton.jit
def _w_tile(w_rows, k0, depth, mask_n, k_rem):
    kk = k0 + depth
    return tl.load(w_rows + kk[None, :], mask=mask_n[:, None] & (kk < k_rem)[None, :], other=0.0)


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, ws_ptr, o_ptr,
    M, N, K, STEPS_SPLIT,
    stride_xm, stride_wn, stride_wsn, stride_om, stride_os,
    BN_SCALE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    GROUP: tl.constexpr, GROUPS: tl.constexpr, NUM_STAGES: tl.constexpr, PREFETCH: tl.constexpr,
):  # fmt: skip
    # Weight scales fold into x (BLOCK_N divides bn): a [BLOCK_N, G, bk] tile took 1.5x the
    # registers. Splits move pointers: a runtime loop lower bound cost ~80 registers.
    pid_n, pid_m, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    offs_g = tl.arange(0, GROUPS)
    cols = offs_g[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    depth = tl.arange(0, GROUPS * GROUP)
    i0 = pid_s * STEPS_SPLIT
    k_rem = tl.minimum(K - i0 * (GROUPS * GROUP), STEPS_SPLIT * (GROUPS * GROUP))
    x_ptr += i0 * (GROUPS * GROUP)
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + i0 * (GROUPS * GROUP)
    ws_row = ws_ptr + ((pid_n * BLOCK_N) // BN_SCALE).to(tl.int64) * stride_wsn + i0 * GROUPS
    num_groups = tl.cdiv(k_rem, GROUP)
    o_ptr += pid_s.to(tl.int64) * stride_os
    if PREFETCH:
        w_next = _w_tile(w_rows, 0, depth, mask_n, k_rem)
    if BLOCK_M == 1:
        m = pid_m.to(tl.int64)
        acc = tl.zeros([BLOCK_N], tl.float32)
        for i in tl.range(0, tl.cdiv(k_rem, GROUPS * GROUP), num_stages=NUM_STAGES):
            k0 = i * (GROUPS * GROUP)
            k = k0 + cols
            x = tl.load(x_ptr + m * stride_xm + k, mask=k < k_rem, other=0.0).to(tl.float32)
            xq, xs = _quantize_groups(x, 1)
            j = k0 // GROUP + offs_g
            ws = tl.load(ws_row + j, mask=j < num_groups, other=0.0)
            xe = tl.reshape(xq * (xs * ws)[:, None], [GROUPS * GROUP])
            if PREFETCH:
                w = w_next
                w_next = _w_tile(w_rows, k0 + GROUPS * GROUP, depth, mask_n, k_rem)
            else:
                w = _w_tile(w_rows, k0, depth, mask_n, k_rem)
            acc += tl.sum(w.to(tl.float32) * xe[None, :], axis=1)
        tl.store(o_ptr + m * stride_om + offs_n, acc.to(o_ptr.dtype.element_ty), mask=mask_n)
    else:
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        mask_m = offs_m < M
        x_rows = x_ptr + offs_m.to(tl.int64) * stride_xm
        acc2 = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for i in tl.range(0, tl.cdiv(k_rem, GROUPS * GROUP), num_stages=NUM_STAGES):
            k0 = i * (GROUPS * GROUP)
            k = k0 + cols
            x_mask = mask_m[:, None, None] & (k < k_rem)[None, :, :]
            x = tl.load(x_rows[:, None, None] + k[None, :, :], mask=x_mask, other=0.0)
            xq, xs = _quantize_groups(x.to(tl.float32), 2)
            j = k0 // GROUP + offs_g
            ws = tl.load(ws_row + j, mask=j < num_groups, other=0.0)
            xe = tl.reshape(xq * (xs * ws[None, :])[:, :, None], [BLOCK_M, GROUPS * GROUP])
            if PREFETCH:
                w = w_next
                w_next = _w_tile(w_rows, k0 + GROUPS * GROUP, depth, mask_n, k_rem)
            else:
                w = _w_tile(w_rows, k0, depth, mask_n, k_rem)
            acc2 += tl.sum(w.to(tl.float32)[None, :, :] * xe[:, None, :], axis=2)
        out = o_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :]
        out_mask = mask_m[:, None] & mask_n[None, :]
        tl.store(out, acc2.to(o_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _gemm_kernel(
    x_ptr, xs_ptr, w_ptr, ws_ptr, o_ptr,
    M, N, K, J_SPLIT,
    stride_xm, stride_xsm, stride_wn, stride_wsn, stride_om, stride_os,
    BN_SCALE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    QUANTIZE: tl.constexpr, DOT_FP8: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m, mask_n = offs_m < M, offs_n < N
    j0 = pid_s * J_SPLIT
    k_rem = tl.minimum(K - j0 * BLOCK_K, J_SPLIT * BLOCK_K)
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + j0 * BLOCK_K
    xs_rows = xs_ptr + offs_m.to(tl.int64) * stride_xsm + j0
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + j0 * BLOCK_K
    ws_rows = ws_ptr + (offs_n // BN_SCALE).to(tl.int64) * stride_wsn + j0
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for j in range(0, tl.cdiv(k_rem, BLOCK_K)):
        k = j * BLOCK_K + offs_k
        mask_k = k < k_rem
        a = tl.load(x_rows + k[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        if QUANTIZE:
            a, xs = _quantize_groups(a.to(tl.float32), 1)
        else:
            xs = tl.load(xs_rows + j, mask=mask_m, other=0.0)
        b = tl.load(w_rows + k[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0)
        if DOT_FP8:
            part = tl.dot(a.to(w_ptr.dtype.element_ty), tl.trans(b))
        else:  # before sm_89: e4m3 values are exact in tf32
            part = tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)))
        ws = tl.load(ws_rows + j, mask=mask_n, other=0.0)
        acc += part * xs[:, None] * ws[None, :]
    out = o_ptr + pid_s.to(tl.int64) * stride_os + offs_m[:, None].to(tl.int64) * stride_om
    out += offs_n[None, :]
    tl.store(out, acc.to(o_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _sum_splits_kernel(p_ptr, o_ptr, SPLITS, SIZE, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < SIZE
    acc = tl.zeros([BLOCK], tl.float32)
    for s in range(0, SPLITS):
        acc += tl.load(p_ptr + s * SIZE + offs, mask=mask, other=0.0)
    tl.store(o_ptr + offs, acc.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _quantize_rows_kernel(
    x_ptr, q_ptr, s_ptr, K, stride_xm, stride_qm, stride_sm,
    GROUP: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    m, j = tl.program_id(0).to(tl.int64), tl.program_id(1)
    offs = j * GROUP + tl.arange(0, BLOCK)
    mask = (offs < K) & (tl.arange(0, BLOCK) < GROUP)
    x = tl.load(x_ptr + m * stride_xm + offs, mask=mask, other=0.0).to(tl.float32)
    q, scale = _quantize_groups(x[None, :], 1)
    q_out = q_ptr + m * stride_qm + offs[None, :]
    tl.store(q_out, q.to(q_ptr.dtype.element_ty), mask=mask[None, :])
    tl.store(s_ptr + m * stride_sm + j + tl.arange(0, 1), scale)


def supports(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, block_size) -> bool:
    """Whether the kernels take x [..., K], weight [N, K] or [E, N, K] fp8 with these scales."""
    bn, bk = block_size
    return (
        x.dtype in FLOATS
        and weight.dtype == FP8
        and weight_scale.dtype == torch.float32
        and weight.dim() in (2, 3)
        and weight.stride(-1) == 1
        and x.shape[-1] == weight.shape[-1]
        and 16 <= bk <= 256
        and bk & (bk - 1) == 0
        and bn >= 1
        and x.device == weight.device == weight_scale.device
    )


def dot_fp8(device: torch.device) -> bool:
    """fp8 tensor-core dots: sm_89+, and the interpreter."""
    return device.type != "cuda" or torch.cuda.get_device_capability(device) >= (8, 9)


def quantize_rows(x: torch.Tensor, bk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference.quantize_activation`: x [..., K] -> (x_q [M, K] fp8, x_s [M, ceil(K/bk)])."""
    x2 = _rows(x)
    m, k = x2.shape
    q = torch.empty(m, k, dtype=FP8, device=x.device)
    s = torch.empty(m, triton.cdiv(k, bk), dtype=torch.float32, device=x.device)
    if m:
        _quantize_rows_kernel[(m, s.shape[1])](
            x2, q, s, k, x2.stride(0), q.stride(0), s.stride(0),
            GROUP=bk, BLOCK=triton.next_power_of_2(bk), num_warps=1,
        )  # fmt: skip
    return q, s


def _rows(x: torch.Tensor) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def device_name(device: torch.device) -> str:
    """The key of `tiles.TABLES`."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def _splits(steps: int, split_k: int) -> tuple[int, int]:
    per = triton.cdiv(steps, max(1, min(split_k, steps)))
    return triton.cdiv(steps, per), per


def _partials(splits: int, out: torch.Tensor) -> torch.Tensor:
    if splits == 1:
        return out
    return torch.empty(splits, *out.shape, dtype=torch.float32, device=out.device)


def _sum_splits(partials: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    if partials is out:
        return out
    size, block = out.numel(), 1024
    _sum_splits_kernel[(triton.cdiv(size, block),)](
        partials, out, partials.shape[0], size, BLOCK=block, num_warps=4
    )  # fmt: skip
    return out


def fp8_gemv(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, block_size,
    config: GemvConfig | None = None,
) -> torch.Tensor:  # fmt: skip
    """x [M, K] (unit-stride rows) @ weight [N, K]^T -> [M, N] in x's dtype."""
    (m, k), n = x.shape, weight.shape[0]
    bn, bk = block_size
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    c = config or default_linear(1, n, k)
    groups = max(1, min(c.depth, triton.next_power_of_2(k)) // bk)
    cols = min(c.cols, bn & -bn)  # divides bn: one scale row per program
    rows = min(c.rows, triton.next_power_of_2(m))
    splits, per = _splits(triton.cdiv(k, groups * bk), c.split_k)
    part = _partials(splits, out)
    _gemv_kernel[(triton.cdiv(n, cols), triton.cdiv(m, rows), splits)](
        x, weight, weight_scale, part, m, n, k, per,
        x.stride(0), weight.stride(0), weight_scale.stride(0), part.stride(-2),
        part.stride(0) if splits > 1 else 0,
        BN_SCALE=bn, BLOCK_M=rows, BLOCK_N=cols, GROUP=bk, GROUPS=groups,
        NUM_STAGES=c.stages, PREFETCH=c.prefetch and groups * bk < k, num_warps=c.warps,
    )  # fmt: skip
    return _sum_splits(part, out)


def fp8_gemm(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, block_size,
    config: GemmConfig | None = None,
) -> torch.Tensor:  # fmt: skip
    """`fp8_gemv` for more rows; x is quantized by `quantize_rows` first unless config.fused
    (default: M <= FUSED_ROWS)."""
    (m, k), n = x.shape, weight.shape[0]
    bn, bk = block_size
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    c = config or default_linear(max(m, GEMV_ROWS + 1), n, k)
    xq, xs = (x, x) if c.fused else quantize_rows(x, bk)
    splits, per = _splits(triton.cdiv(k, bk), c.split_k)
    part = _partials(splits, out)
    grid = (triton.cdiv(m, c.block_m), triton.cdiv(n, c.block_n), splits)
    _gemm_kernel[grid](
        xq, xs, weight, weight_scale, part, m, n, k, per,
        xq.stride(0), xs.stride(0), weight.stride(0), weight_scale.stride(0), part.stride(-2),
        part.stride(0) if splits > 1 else 0,
        BN_SCALE=bn, BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=bk, QUANTIZE=c.fused,
        DOT_FP8=dot_fp8(x.device), num_warps=c.warps, num_stages=c.stages,
    )  # fmt: skip
    return _sum_splits(part, out)


def fp8_linear(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, block_size,
    config: GemvConfig | GemmConfig | None = None,
) -> torch.Tensor:  # fmt: skip
    """`reference.fp8_linear` without bias; `config` overrides `tiles.pick_linear`."""
    x2 = _rows(x)
    (m, k), n = x2.shape, weight.shape[0]
    c = config or pick_linear(m, n, k, device_name(x.device))
    fn = fp8_gemv if isinstance(c, GemvConfig) else fp8_gemm
    out = fn(x2, weight, weight_scale, block_size, c)
    return out.view(*x.shape[:-1], n)
