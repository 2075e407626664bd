"""Triton gates of `reference.py`, one launch for g and beta, following the reference in fp32.
exp / log / log1p are libdevice's (what torch's CUDA kernels call, not Triton's approximate
`ex2` / `lg2`), division IEEE `div_rn`; the interpreter has no libdevice and uses `tl.exp`."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

MAX_KDA_CHANNELS = 16384  # HV * K of one program
GDN_BLOCK_ELEMENTS = 1024


def _precise() -> bool:
    return os.environ.get("TRITON_INTERPRET") != "1"


@triton.jit
def _exp(x, PRECISE: tl.constexpr):
    if PRECISE:
        return libdevice.exp(x)
    else:
        return tl.exp(x)


@triton.jit
def _log(x, PRECISE: tl.constexpr):
    if PRECISE:
        return libdevice.log(x)
    else:
        return tl.log(x)


@triton.jit
def _log1p(x, PRECISE: tl.constexpr):
    if PRECISE:
        return libdevice.log1p(x)
    else:
        u = 1.0 + x  # Goldberg: exact where u rounds to 1, else log(u) scaled by x / (u - 1)
        return tl.where(u == 1.0, x, tl.log(u) * tl.math.div_rn(x, u - 1.0))


@triton.jit
def _sigmoid(x, PRECISE: tl.constexpr):
    return tl.math.div_rn(1.0, 1.0 + _exp(-x, PRECISE))


@triton.jit
def _kda_gates_kernel(
    f_ptr,
    dt_bias_ptr,
    a_log_ptr,
    b_ptr,
    g_ptr,
    beta_ptr,
    stride_f,
    stride_b_t,
    stride_b_h,
    HV,
    K,
    lower_bound,
    BLOCK_C: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PRECISE: tl.constexpr,
    BOUNDED: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_C)
    mask = cols < HV * K
    f = tl.load(f_ptr + t * stride_f + cols, mask=mask, other=0.0).to(tl.float32)
    raw = f + tl.load(dt_bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    a_log = tl.load(a_log_ptr + cols // K, mask=mask, other=0.0).to(tl.float32)
    if BOUNDED:
        g = lower_bound * _sigmoid(_exp(a_log, PRECISE) * raw, PRECISE)
    else:
        # log(1 + exp(x)), not log1p: the rounding of KimiLinearForgetGate
        softplus = tl.where(raw > 20.0, raw, _log(1.0 + _exp(raw, PRECISE), PRECISE))
        g = -_exp(a_log, PRECISE) * softplus
    tl.store(g_ptr + t * HV * K + cols, g, mask=mask)
    heads = tl.arange(0, BLOCK_H)
    head_mask = heads < HV
    b = tl.load(b_ptr + t * stride_b_t + heads * stride_b_h, mask=head_mask, other=0.0)
    beta = _sigmoid(b.to(tl.float32), PRECISE)
    tl.store(beta_ptr + t * HV + heads, beta.to(beta_ptr.dtype.element_ty), mask=head_mask)


@triton.jit
def _gdn_gates_kernel(
    a_ptr,
    b_ptr,
    a_log_ptr,
    dt_bias_ptr,
    g_ptr,
    beta_ptr,
    T,
    HV,
    stride_a_t,
    stride_a_h,
    stride_b_t,
    stride_b_h,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PRECISE: tl.constexpr,
):
    rows = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)[:, None]
    heads = tl.arange(0, BLOCK_H)[None, :]
    mask = (rows < T) & (heads < HV)
    a = tl.load(a_ptr + rows * stride_a_t + heads * stride_a_h, mask=mask, other=0.0)
    dt_bias = tl.load(dt_bias_ptr + heads, mask=heads < HV, other=0.0).to(tl.float32)
    x = a.to(tl.float32) + dt_bias
    softplus = tl.where(x > 20.0, x, _log1p(_exp(x, PRECISE), PRECISE))
    a_log = tl.load(a_log_ptr + heads, mask=heads < HV, other=0.0).to(tl.float32)
    tl.store(g_ptr + rows * HV + heads, -_exp(a_log, PRECISE) * softplus, mask=mask)
    b = tl.load(b_ptr + rows * stride_b_t + heads * stride_b_h, mask=mask, other=0.0)
    beta = _sigmoid(b.to(tl.float32), PRECISE)
    tl.store(beta_ptr + rows * HV + heads, beta.to(beta_ptr.dtype.element_ty), mask=mask)


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


def kda_gates(
    f_b_out: torch.Tensor,
    dt_bias: torch.Tensor,
    A_log: torch.Tensor,
    b: torch.Tensor,
    lower_bound: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference.kda_gates` in one launch (`lower_bound`: `kda_log_decay_bounded`).
    Raises ValueError on inconsistent shapes or HV * K > MAX_KDA_CHANNELS."""
    T, num_heads = b.shape
    channels = f_b_out.shape[-1]
    _check(f_b_out.dim() == 2 and f_b_out.shape[0] == T, "f_b_out must be [T, HV*K]")
    _check(A_log.numel() == num_heads, "A_log must hold HV elements")
    _check(channels % num_heads == 0 and dt_bias.numel() == channels, "dt_bias must be [HV*K]")
    _check(channels <= MAX_KDA_CHANNELS, f"HV*K = {channels} > {MAX_KDA_CHANNELS}")
    K = channels // num_heads
    g = torch.empty(T, num_heads, K, dtype=torch.float32, device=f_b_out.device)
    beta = torch.empty(T, num_heads, dtype=b.dtype, device=b.device)
    if T == 0:
        return g, beta
    f_b_out = f_b_out if f_b_out.stride(-1) == 1 else f_b_out.contiguous()
    block = triton.next_power_of_2(channels)
    _kda_gates_kernel[(T,)](
        f_b_out,
        dt_bias.reshape(-1),
        A_log.reshape(-1),
        b,
        g,
        beta,
        f_b_out.stride(0),
        b.stride(0),
        b.stride(1),
        num_heads,
        K,
        0.0 if lower_bound is None else float(lower_bound),
        BLOCK_C=block,
        BLOCK_H=triton.next_power_of_2(num_heads),
        PRECISE=_precise(),
        BOUNDED=lower_bound is not None,
        num_warps=4 if block <= 2048 else 8,
    )
    return g, beta


def gdn_gates(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference.gdn_gates` in one launch. Raises ValueError on inconsistent shapes or
    HV > GDN_BLOCK_ELEMENTS."""
    _check(a.dim() == 2 and a.shape == b.shape, "a and b must both be [T, HV]")
    T, num_heads = a.shape
    _check(A_log.numel() == num_heads and dt_bias.numel() == num_heads, "A_log, dt_bias: [HV]")
    _check(num_heads <= GDN_BLOCK_ELEMENTS, f"HV = {num_heads} > {GDN_BLOCK_ELEMENTS}")
    g = torch.empty(T, num_heads, dtype=torch.float32, device=a.device)
    beta = torch.empty(T, num_heads, dtype=b.dtype, device=b.device)
    if T == 0:
        return g, beta
    block_h = triton.next_power_of_2(num_heads)
    block_t = min(GDN_BLOCK_ELEMENTS // block_h, triton.next_power_of_2(T))
    _gdn_gates_kernel[(triton.cdiv(T, block_t),)](
        a,
        b,
        A_log.reshape(-1),
        dt_bias.reshape(-1),
        g,
        beta,
        T,
        num_heads,
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        BLOCK_T=block_t,
        BLOCK_H=block_h,
        PRECISE=_precise(),
    )
    return g, beta
