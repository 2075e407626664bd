"""Triton block-scaled fp8 GEMV and GEMM: the CUDA path of `reference.fp8_linear` (W8A8).

Both take x [M, K] in its float dtype and quantize it inside the kernel, per row and bk
columns, exactly as `reference.quantize_activation` (`_quantize_groups`: scale = amax / 448,
values rounded to e4m3 in fp32, round to nearest even), then with W_q [N, K] e4m3 and
W_s [ceil(N/bn), ceil(K/bk)]:

    for each k-block j (bk columns):
        acc[m, n] += (sum_k x_q[m, k] W_q[n, k]) * x_s[m, j] * W_s[n // bn, j]   (fp32)

GEMV (`_gemv_kernel`, up to GEMV_ROWS rows): program (n0, m) owns BLOCK_N output columns of
row m and loads DEPTH = G * bk columns of its weight rows at once as a [BLOCK_N, DEPTH] tile:
one load of the whole K <= 2048 (8 KiB of fp8 per program at 4 columns), as the bf16 GEMV of
`hyla/ops/linear/gemv.py` does, so a projection's weight is in flight in one wave over ~4 N / 4
programs. (The first form looped over K in bk = 128 steps of 16 x 128 bytes with N / 16
programs: ~16 dependent DRAM round trips per program, ~250 GB/s on the H200, 3.96x bf16's step
time; bench/results/gpu_fp8_h200.json.)

GEMM (`_gemm_kernel`, more rows): BLOCK_M x BLOCK_N tiles, BLOCK_K = bk, the k-block product on
fp8 tensor cores (sm_89+ and the interpreter; tf32 before sm_89, exact for e4m3 values); up to
FUSED_ROWS rows it quantizes x in registers too (one launch per projection), beyond that x is
quantized once by `quantize_rows` (each N-block program would redo it: ALU-bound at prefill
sizes). Edges (K, N not multiples of the block) are masked loads; no host sync: capturable.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from hyla.ops.fp8.reference import FP8

GEMV_ROWS = 4  # rows the GEMV takes; more rows run the GEMM
FUSED_ROWS = 64  # rows up to which the GEMM quantizes x in registers
FLOATS = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _round_e4m3(v):
    """v (fp32, |v| <= 448) rounded to the nearest e4m3 value, ties to even, in fp32: exact
    power-of-two steps (the interpreter's direct f32 -> e4m3 conversion mis-rounds across
    binades), so the result equals torch's `.to(float8_e4m3fn)` and converts exactly."""
    bits = v.to(tl.int32, bitcast=True)
    e = tl.maximum((bits >> 23) & 0xFF, 127 - 6)  # biased exponent; e4m3 normals from 2^-6
    step = ((e - 3) << 23).to(tl.float32, bitcast=True)  # 2^(exp - 3): 3 mantissa bits
    inv = ((254 - e + 3) << 23).to(tl.float32, bitcast=True)
    magic = 12582912.0  # 1.5 * 2^23: adding it rounds to an integer, half to even
    r = ((tl.abs(v) * inv + magic) - magic) * step
    return (r.to(tl.int32, bitcast=True) | (bits & -2147483648)).to(tl.float32, bitcast=True)


@triton.jit
def _quantize_groups(x, AXIS: tl.constexpr):
    """x (fp32) with one quantization group along AXIS -> (q: e4m3 values in fp32, scale with
    AXIS reduced): `reference.quantize_activation` of each group (zeros: scale 1)."""
    amax = tl.max(tl.abs(x), axis=AXIS)
    scale = tl.where(amax > 0, tl.math.div_rn(amax, 448.0), 1.0)
    v = tl.math.div_rn(x, tl.expand_dims(scale, AXIS))
    return _round_e4m3(tl.minimum(tl.maximum(v, -448.0), 448.0)), scale


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, ws_ptr, o_ptr,
    N, K,
    stride_xm, stride_wn, stride_wsn, stride_om,
    BN_SCALE: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr, GROUPS: tl.constexpr,
):  # fmt: skip
    # BLOCK_N divides bn: the program's rows share one row of weight scales, which folds into
    # x with x's own scales (xe = x_q * x_s * W_s per column), leaving a plain [BLOCK_N, DEPTH]
    # weight tile as in the bf16 GEMV (a [BLOCK_N, G, bk] tile took ~1.5x the registers)
    pid_n, m = tl.program_id(0), tl.program_id(1).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    offs_g = tl.arange(0, GROUPS)
    cols = offs_g[:, None] * GROUP + tl.arange(0, GROUP)[None, :]  # [G, C]
    depth = tl.arange(0, GROUPS * GROUP)
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn
    ws_row = ws_ptr + ((pid_n * BLOCK_N) // BN_SCALE).to(tl.int64) * stride_wsn
    num_groups = tl.cdiv(K, GROUP)
    acc = tl.zeros([BLOCK_N], tl.float32)
    for k0 in range(0, K, GROUPS * GROUP):
        k = k0 + cols
        x = tl.load(x_ptr + m * stride_xm + k, mask=k < K, other=0.0).to(tl.float32)
        xq, xs = _quantize_groups(x, 1)  # [G, C], [G]
        j = k0 // GROUP + offs_g
        ws = tl.load(ws_row + j, mask=j < num_groups, other=0.0)
        xe = tl.reshape(xq * (xs * ws)[:, None], [GROUPS * GROUP])
        kk = k0 + depth
        w = tl.load(w_rows + kk[None, :], mask=mask_n[:, None] & (kk < K)[None, :], other=0.0)
        acc += tl.sum(w.to(tl.float32) * xe[None, :], axis=1)
    tl.store(o_ptr + m * stride_om + offs_n, acc.to(o_ptr.dtype.element_ty), mask=mask_n)


@triton.jit
def _gemm_kernel(
    x_ptr, xs_ptr, w_ptr, ws_ptr, o_ptr,
    M, N, K,
    stride_xm, stride_xsm, stride_wn, stride_wsn, stride_om,
    BN_SCALE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    QUANTIZE: tl.constexpr, DOT_FP8: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m, mask_n = offs_m < M, offs_n < N
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn
    ws_rows = ws_ptr + (offs_n // BN_SCALE).to(tl.int64) * stride_wsn
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for j in range(0, tl.cdiv(K, BLOCK_K)):
        k = j * BLOCK_K + offs_k
        mask_k = k < K
        a = tl.load(x_rows + k[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        if QUANTIZE:  # x in its float dtype: one group per row of the tile
            a, xs = _quantize_groups(a.to(tl.float32), 1)  # e4m3 values in fp32
        else:
            xs = tl.load(xs_ptr + offs_m.to(tl.int64) * stride_xsm + j, mask=mask_m, other=0.0)
        b = tl.load(w_rows + k[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0)
        if DOT_FP8:  # (a quantized here converts exactly)
            part = tl.dot(a.to(w_ptr.dtype.element_ty), tl.trans(b))
        else:  # before sm_89: e4m3 values are exact in tf32
            part = tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)))
        ws = tl.load(ws_rows + j, mask=mask_n, other=0.0)
        acc += part * xs[:, None] * ws[None, :]
    out = o_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    tl.store(out, acc.to(o_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _quantize_rows_kernel(
    x_ptr, q_ptr, s_ptr, K, stride_xm, stride_qm, stride_sm,
    GROUP: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """One (row, group) per program: `_quantize_groups` of one group, stored."""
    m, j = tl.program_id(0).to(tl.int64), tl.program_id(1)
    offs = j * GROUP + tl.arange(0, BLOCK)
    mask = (offs < K) & (tl.arange(0, BLOCK) < GROUP)
    x = tl.load(x_ptr + m * stride_xm + offs, mask=mask, other=0.0).to(tl.float32)
    q, scale = _quantize_groups(x[None, :], 1)
    q_out = q_ptr + m * stride_qm + offs[None, :]
    tl.store(q_out, q.to(q_ptr.dtype.element_ty), mask=mask[None, :])
    tl.store(s_ptr + m * stride_sm + j + tl.arange(0, 1), scale)


@dataclass(frozen=True)
class Fp8Tiles:
    """Tile sizes (tuning only: results differ by fp32 summation order at most). GEMV:
    `cols` output columns per program, `depth` columns of K per load, `warps`; GEMM:
    `block_m` x `block_n` tiles (BLOCK_K = bk), `warps`, `stages`."""

    cols: int = 4
    depth: int = 2048
    warps: int = 4
    block_m: int = 64
    block_n: int = 128
    stages: int = 3


def pick_tiles(rows: int, out_features: int, in_features: int) -> Fp8Tiles:
    """GEMV: 4 columns per program (2 below 512 outputs, so that small projections still spread
    over the SMs), all of K <= 2048 per load; GEMM: BLOCK_M the rows rounded up to a power of two
    (16 .. 64), BLOCK_N the widest of 128 / 64 / 32 that still gives >= 132 programs (one per
    H200 SM), else 32. First picks from byte counts; bench/gpu_fp8_gemv.py measures them."""
    block_m = min(64, max(16, triton.next_power_of_2(rows)))
    m_blocks = triton.cdiv(rows, block_m)
    block_n = next((b for b in (128, 64) if m_blocks * triton.cdiv(out_features, b) >= 132), 32)
    return Fp8Tiles(cols=4 if out_features >= 512 else 2, block_m=block_m, block_n=block_n)


def supports(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, block_size) -> bool:
    """True when the kernels take the call: x float [..., K], weight fp8 [N, K] (or [E, N, K])
    with unit-stride rows, float32 scales, bk a power of two in 16 .. 256, one device."""
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
    """fp8 tensor-core dots: sm_89+, and the interpreter (CPU tensors)."""
    return device.type != "cuda" or torch.cuda.get_device_capability(device) >= (8, 9)


def quantize_rows(x: torch.Tensor, bk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference.quantize_activation` in one launch: x [..., K] -> (x_q [M, K] fp8,
    x_s [M, ceil(K/bk)] float32)."""
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


def fp8_gemv(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, block_size,
    tiles: Fp8Tiles | None = None,
) -> torch.Tensor:  # fmt: skip
    """x [M, K] float (unit-stride rows) times weight [N, K]^T -> [M, N] in x's dtype, x
    quantized in the kernel; one program per (tiles.cols columns, row)."""
    (m, k), n = x.shape, weight.shape[0]
    bn, bk = block_size
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    t = tiles or pick_tiles(m, n, k)
    groups = max(1, min(t.depth, triton.next_power_of_2(k)) // bk)
    cols = min(t.cols, bn & -bn)  # a power of two dividing bn: one scale row per program
    _gemv_kernel[(triton.cdiv(n, cols), m)](
        x, weight, weight_scale, out, n, k,
        x.stride(0), weight.stride(0), weight_scale.stride(0), out.stride(0),
        BN_SCALE=bn, BLOCK_N=cols, GROUP=bk, GROUPS=groups, num_warps=t.warps,
    )  # fmt: skip
    return out


def fp8_gemm(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, block_size,
    tiles: Fp8Tiles | None = None, quantize: bool | None = None,
) -> torch.Tensor:  # fmt: skip
    """x [M, K] float (unit-stride rows) times weight [N, K]^T -> [M, N] in x's dtype; x is
    quantized in the kernel when `quantize` (default: M <= FUSED_ROWS), else by one
    `quantize_rows` launch first."""
    (m, k), n = x.shape, weight.shape[0]
    bn, bk = block_size
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    t = tiles or pick_tiles(m, n, k)
    fused = m <= FUSED_ROWS if quantize is None else quantize
    xq, xs = (x, x) if fused else quantize_rows(x, bk)
    grid = (triton.cdiv(m, t.block_m), triton.cdiv(n, t.block_n))
    _gemm_kernel[grid](
        xq, xs, weight, weight_scale, out, m, n, k,
        xq.stride(0), xs.stride(0), weight.stride(0), weight_scale.stride(0), out.stride(0),
        BN_SCALE=bn, BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=bk, QUANTIZE=fused,
        DOT_FP8=dot_fp8(x.device), num_warps=t.warps, num_stages=t.stages,
    )  # fmt: skip
    return out


def fp8_linear(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, block_size,
    tiles: Fp8Tiles | None = None,
) -> torch.Tensor:  # fmt: skip
    """`reference.fp8_linear` without bias: x [..., K] -> [..., N] in x's dtype (fp32 sums in
    another order); one launch up to FUSED_ROWS rows. `tiles` overrides `pick_tiles`."""
    x2 = _rows(x)
    fn = fp8_gemv if x2.shape[0] <= GEMV_ROWS else fp8_gemm
    out = fn(x2, weight, weight_scale, block_size, tiles)
    return out.view(*x.shape[:-1], weight.shape[0])
