"""Triton block-scaled fp8 GEMM and GEMV: the CUDA path of `reference.fp8_linear`.

The activation is quantized per token and bk columns in one launch (`quantize_rows`, equal to
`reference.quantize_activation`: round to nearest even as torch); the kernels then take
x_q [M, K] e4m3 with x_s [M, ceil(K/bk)] and W_q [N, K] e4m3 with W_s [ceil(N/bn), ceil(K/bk)]:

    for each k-block j (BLOCK_K = bk columns):
        acc[m, n] += (sum_k x_q[m, k] W_q[n, k]) * x_s[m, j] * W_s[n // bn, j]   (fp32)

GEMM (`_gemm_kernel`, more than GEMV_ROWS rows): BLOCK_M x BLOCK_N tiles, the k-block product
on tensor cores in fp8 (sm_89+ and the interpreter; tf32 before sm_89, exact for e4m3 values).
GEMV (`_gemv_kernel`, decode rows): one program per row and BLOCK_N columns streams the fp8
weight once per row at half bf16's bytes; `expert_ids` lets each row read another
weight of a stacked [E, N, K] tensor (the MoE experts, `moe_kernels.py`). Edges (K, N not
multiples of the block) are masked loads. No host sync: capturable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyla.ops.fp8.reference import FP8

GEMV_ROWS = 4
FLOATS = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _gemm_kernel(
    x_ptr, xs_ptr, w_ptr, ws_ptr, o_ptr,
    M, N, K,
    stride_xm, stride_xsm, stride_wn, stride_wsn, stride_om,
    BN_SCALE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_FP8: tl.constexpr,
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
        b = tl.load(w_rows + k[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0)
        if DOT_FP8:
            part = tl.dot(a, tl.trans(b))
        else:  # before sm_89: e4m3 values are exact in tf32
            part = tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)))
        xs = tl.load(xs_ptr + offs_m.to(tl.int64) * stride_xsm + j, mask=mask_m, other=0.0)
        ws = tl.load(ws_rows + j, mask=mask_n, other=0.0)
        acc += part * xs[:, None] * ws[None, :]
    out = o_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    tl.store(out, acc.to(o_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _gemv_kernel(
    x_ptr, xs_ptr, w_ptr, ws_ptr, o_ptr, eid_ptr,
    N, K,
    stride_xm, stride_xsm, stride_we, stride_wn, stride_wse, stride_wsn, stride_om,
    BN_SCALE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_EXPERTS: tl.constexpr,
):  # fmt: skip
    pid_n, m = tl.program_id(0), tl.program_id(1).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_n = offs_n < N
    w_base, ws_base = w_ptr, ws_ptr
    if HAS_EXPERTS:
        e = tl.load(eid_ptr + m).to(tl.int64)
        w_base = w_ptr + e * stride_we
        ws_base = ws_ptr + e * stride_wse
    w_rows = w_base + offs_n[:, None].to(tl.int64) * stride_wn
    ws_rows = ws_base + (offs_n // BN_SCALE).to(tl.int64) * stride_wsn
    acc = tl.zeros([BLOCK_N], tl.float32)
    for j in range(0, tl.cdiv(K, BLOCK_K)):
        k = j * BLOCK_K + offs_k
        mask_k = k < K
        x = tl.load(x_ptr + m * stride_xm + k, mask=mask_k, other=0.0).to(tl.float32)
        w = tl.load(w_rows + k[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0)
        part = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
        xs = tl.load(xs_ptr + m * stride_xsm + j)
        ws = tl.load(ws_rows + j, mask=mask_n, other=0.0)
        acc += part * xs * ws
    tl.store(o_ptr + m * stride_om + offs_n, acc.to(o_ptr.dtype.element_ty), mask=mask_n)


@triton.jit
def _quantize_rows_kernel(
    x_ptr, q_ptr, s_ptr, K, stride_xm, stride_qm, stride_sm,
    GROUP: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """One (row, group) per program: scale = amax / 448 (1 for zeros), q = RNE_e4m3(x / scale)
    rounded in fp32 with exact power-of-two steps (the interpreter's direct f32 -> e4m3
    conversion mis-rounds across binades), so q equals torch's `.to(float8_e4m3fn)`."""
    m, j = tl.program_id(0).to(tl.int64), tl.program_id(1)
    offs = j * GROUP + tl.arange(0, BLOCK)
    mask = (offs < K) & (tl.arange(0, BLOCK) < GROUP)
    x = tl.load(x_ptr + m * stride_xm + offs, mask=mask, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=0)
    scale = tl.where(amax > 0, tl.math.div_rn(amax, 448.0), 1.0)
    v = tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -448.0), 448.0)
    bits = v.to(tl.int32, bitcast=True)
    e = tl.maximum((bits >> 23) & 0xFF, 127 - 6)  # biased exponent; e4m3 normals from 2^-6
    step = ((e - 3) << 23).to(tl.float32, bitcast=True)  # 2^(exp - 3): 3 mantissa bits
    inv = ((254 - e + 3) << 23).to(tl.float32, bitcast=True)
    magic = 12582912.0  # 1.5 * 2^23: adding it rounds to an integer, half to even
    r = ((tl.abs(v) * inv + magic) - magic) * step
    v = (r.to(tl.int32, bitcast=True) | (bits & -2147483648)).to(tl.float32, bitcast=True)
    tl.store(q_ptr + m * stride_qm + offs, v.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + m * stride_sm + j, scale)


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


def _dot_fp8(device: torch.device) -> bool:
    """fp8 tensor-core dots: sm_89+, and the interpreter (CPU tensors)."""
    return device.type != "cuda" or torch.cuda.get_device_capability(device) >= (8, 9)


def quantize_rows(x: torch.Tensor, bk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference.quantize_activation` in one launch: x [..., K] -> (x_q [M, K] fp8,
    x_s [M, ceil(K/bk)] float32)."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m, k = x2.shape
    q = torch.empty(m, k, dtype=FP8, device=x.device)
    s = torch.empty(m, triton.cdiv(k, bk), dtype=torch.float32, device=x.device)
    if m:
        _quantize_rows_kernel[(m, s.shape[1])](
            x2, q, s, k, x2.stride(0), q.stride(0), s.stride(0),
            GROUP=bk, BLOCK=triton.next_power_of_2(bk), num_warps=1,
        )  # fmt: skip
    return q, s


def fp8_gemm(
    xq: torch.Tensor, xs: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
    block_size, out_dtype: torch.dtype,
) -> torch.Tensor:  # fmt: skip
    """[M, K] fp8 rows (scales xs) times weight [N, K]^T -> [M, N] in out_dtype."""
    (m, k), n = xq.shape, weight.shape[0]
    bn, bk = block_size
    out = torch.empty(m, n, dtype=out_dtype, device=xq.device)
    if m == 0:
        return out
    block_m = 64 if m >= 64 else max(16, triton.next_power_of_2(m))
    block_n = 128 if n >= 128 else max(16, triton.next_power_of_2(n))
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _gemm_kernel[grid](
        xq, xs, weight, weight_scale, out, m, n, k,
        xq.stride(0), xs.stride(0), weight.stride(0), weight_scale.stride(0), out.stride(0),
        BN_SCALE=bn, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=bk,
        DOT_FP8=_dot_fp8(xq.device), num_warps=4, num_stages=3,
    )  # fmt: skip
    return out


def fp8_gemv(
    xq: torch.Tensor, xs: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
    block_size, out_dtype: torch.dtype, expert_ids: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """Row m of xq [M, K] times weight [N, K]^T (or weight[expert_ids[m]] of [E, N, K]) ->
    [M, N] in out_dtype."""
    m, k = xq.shape
    n = weight.shape[-2]
    bn, bk = block_size
    out = torch.empty(m, n, dtype=out_dtype, device=xq.device)
    if m == 0:
        return out
    has_experts = expert_ids is not None
    we = weight.stride(0) if has_experts else 0
    wse = weight_scale.stride(0) if has_experts else 0
    block_n = 16 if n >= 512 else 8
    _gemv_kernel[(triton.cdiv(n, block_n), m)](
        xq, xs, weight, weight_scale, out, expert_ids if has_experts else xs,
        n, k, xq.stride(0), xs.stride(0), we, weight.stride(-2), wse,
        weight_scale.stride(-2), out.stride(0),
        BN_SCALE=bn, BLOCK_N=block_n, BLOCK_K=bk, HAS_EXPERTS=has_experts, num_warps=4,
    )  # fmt: skip
    return out


def fp8_linear(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, block_size
) -> torch.Tensor:
    """`reference.fp8_linear` without bias: x [..., K] -> [..., N] in x's dtype (fp32 sums in
    another order)."""
    xq, xs = quantize_rows(x, block_size[1])
    fn = fp8_gemv if xq.shape[0] <= GEMV_ROWS else fp8_gemm
    out = fn(xq, xs, weight, weight_scale, block_size, x.dtype)
    return out.view(*x.shape[:-1], weight.shape[0])
