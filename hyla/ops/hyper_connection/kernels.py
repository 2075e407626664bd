"""Triton hyper-connection mixing: `dots` (partial products split over S programs per token,
so one decode token still fills the GPU), `finish` (weights, Sinkhorn, collapse, norm) and
`expand`. Rounding follows the reference; no host sync (CUDA-graph safe)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_K = 512
TARGET_PROGRAMS = 256  # minimum T * S of `dots`, while slices remain
EXPAND_BLOCK_D = 256


@triton.jit
def _hc_dots_kernel(
    x_ptr, fn_ptr, dots_ptr, sq_ptr, stride_xt, stride_fn, K, M, S, CHUNK,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
    sq = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k0 in range(s * CHUNK, tl.minimum((s + 1) * CHUNK, K), BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        mask = cols < K
        x = tl.load(x_ptr + t * stride_xt + cols, mask=mask, other=0.0).to(tl.float32)
        wmask = (rows[:, None] < M) & mask[None, :]
        w = tl.load(fn_ptr + rows[:, None] * stride_fn + cols[None, :], mask=wmask, other=0.0)
        acc += w.to(tl.float32) * x[None, :]
        sq += x * x
    out = (t * S + s) * BLOCK_M
    tl.store(dots_ptr + out + rows, tl.sum(acc, axis=1))
    tl.store(sq_ptr + t * S + s, tl.sum(sq, axis=0))


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _hc_finish_kernel(
    x_ptr, dots_ptr, sq_ptr, base_ptr, scale_ptr, w_ptr, out_ptr, post_ptr, comb_ptr,
    stride_xt, stride_xn, D, S, hc_eps, norm_eps, rms_eps, offset, ITERS,
    N: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr, HAS_OFFSET: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    n = tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_N)
    s_mask = offs_s < S
    n_mask = n < N
    tile_mask = n_mask[:, None] & (m < N)[None, :]
    sq = tl.sum(tl.load(sq_ptr + t * S + offs_s, mask=s_mask, other=0.0), axis=0)
    rms = 1.0 / tl.sqrt(sq / (N * D) + norm_eps)
    part = dots_ptr + (t * S + offs_s[:, None]) * BLOCK_M
    vec_mask = s_mask[:, None] & n_mask[None, :]
    pre_w = tl.sum(tl.load(part + n[None, :], mask=vec_mask, other=0.0), axis=0) * rms
    post_w = tl.sum(tl.load(part + N + n[None, :], mask=vec_mask, other=0.0), axis=0) * rms
    tile = 2 * N + n[:, None] * N + m[None, :]
    comb_part = part[:, :, None] + tile[None, :, :]
    comb_mask = s_mask[:, None, None] & tile_mask[None, :, :]
    comb_w = tl.sum(tl.load(comb_part, mask=comb_mask, other=0.0), axis=0) * rms
    pre_s, post_s, comb_s = tl.load(scale_ptr), tl.load(scale_ptr + 1), tl.load(scale_ptr + 2)
    pre = _sigmoid(pre_w * pre_s + tl.load(base_ptr + n, mask=n_mask, other=0.0)) + hc_eps
    post = 2.0 * _sigmoid(post_w * post_s + tl.load(base_ptr + N + n, mask=n_mask, other=0.0))
    logits = comb_w * comb_s + tl.load(base_ptr + tile, mask=tile_mask, other=0.0)
    logits = tl.where(tile_mask, logits, float("-inf"))
    e = tl.exp(logits - tl.max(logits, axis=1)[:, None])
    e = tl.where(tile_mask, e, 0.0)
    comb = tl.where(tile_mask, e / tl.sum(e, axis=1)[:, None] + hc_eps, 0.0)
    comb = comb / (tl.sum(comb, axis=0)[None, :] + hc_eps)
    for _ in range(ITERS - 1):
        comb = comb / (tl.sum(comb, axis=1)[:, None] + hc_eps)
        comb = comb / (tl.sum(comb, axis=0)[None, :] + hc_eps)
    tl.store(post_ptr + t * N + n, post, mask=n_mask)
    tl.store(comb_ptr + t * N * N + n[:, None] * N + m[None, :], comb, mask=tile_mask)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < D
    x = tl.zeros([BLOCK_D], dtype=tl.float32)
    for i in tl.static_range(N):
        p_i = tl.sum(tl.where(n == i, pre, 0.0), axis=0)
        row = tl.load(x_ptr + t * stride_xt + i * stride_xn + d, mask=d_mask, other=0.0)
        x += p_i * row.to(tl.float32)
    x = x.to(out_ptr.dtype.element_ty).to(tl.float32)  # hc_collapse's result, then its norm
    normed = x / tl.sqrt(tl.sum(x * x, axis=0) / D + rms_eps)
    w = tl.load(w_ptr + d, mask=d_mask, other=0.0).to(tl.float32)
    if HAS_OFFSET:
        y = normed * (offset + w)
    else:
        y = w * normed.to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + t * D + d, y.to(out_ptr.dtype.element_ty), mask=d_mask)


def _num_splits(num_tokens: int, k: int) -> int:
    blocks = triton.cdiv(k, BLOCK_K)
    return max(1, min(blocks, triton.cdiv(TARGET_PROGRAMS, max(num_tokens, 1))))


def hc_pre_norm(
    streams: torch.Tensor,
    fn: torch.Tensor,
    base: torch.Tensor,
    scale: torch.Tensor,
    hc_eps: float,
    sinkhorn_iters: int,
    norm_eps: float,
    norm_weight: torch.Tensor,
    rms_eps: float,
    offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`reference.hc_pre_norm` in two launches. Raises ValueError on a streams/fn mismatch."""
    num_tokens, n, d = streams.shape
    m = (2 + n) * n
    if fn.shape != (m, n * d) or base.numel() != m or scale.numel() != 3 or sinkhorn_iters < 1:
        raise ValueError(f"hc_pre_norm: fn {tuple(fn.shape)} / base / scale do not fit N={n}")
    out = torch.empty(num_tokens, d, dtype=streams.dtype, device=streams.device)
    post = torch.empty(num_tokens, n, dtype=torch.float32, device=streams.device)
    comb = torch.empty(num_tokens, n, n, dtype=torch.float32, device=streams.device)
    if num_tokens == 0:
        return out, post, comb
    streams = (
        streams if streams.stride(-1) == 1 and streams.stride(1) == d else streams.contiguous()
    )
    fn = fn.contiguous()
    splits = _num_splits(num_tokens, n * d)
    chunk = triton.cdiv(triton.cdiv(n * d, splits), BLOCK_K) * BLOCK_K
    block_m = triton.next_power_of_2(m)
    dots = torch.empty(num_tokens, splits, block_m, dtype=torch.float32, device=streams.device)
    sq = torch.empty(num_tokens, splits, dtype=torch.float32, device=streams.device)
    _hc_dots_kernel[(num_tokens, splits)](
        streams, fn, dots, sq, streams.stride(0), fn.stride(0), n * d, m, splits, chunk,
        BLOCK_M=block_m, BLOCK_K=BLOCK_K, num_warps=8,
    )  # fmt: skip
    block_d = triton.next_power_of_2(d)
    _hc_finish_kernel[(num_tokens,)](
        streams, dots, sq, base.contiguous(), scale.contiguous(), norm_weight.contiguous(), out,
        post, comb, streams.stride(0), streams.stride(1), d, splits, hc_eps, norm_eps, rms_eps,
        float(offset), sinkhorn_iters, N=n, BLOCK_N=max(2, triton.next_power_of_2(n)),
        BLOCK_S=max(2, triton.next_power_of_2(splits)), BLOCK_M=block_m, BLOCK_D=block_d,
        HAS_OFFSET=bool(offset), num_warps=4 if block_d <= 2048 else 8,
    )  # fmt: skip
    return out, post, comb


@triton.jit
def _hc_expand_kernel(
    out_ptr, x_ptr, post_ptr, comb_ptr, y_ptr, stride_ot, stride_xt, stride_xn, D,
    N: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    d_mask, n_mask = d < D, n < N
    dtype = y_ptr.dtype.element_ty
    tile_mask = n_mask[:, None] & d_mask[None, :]
    x = tl.load(
        x_ptr + t * stride_xt + n[:, None] * stride_xn + d[None, :], mask=tile_mask, other=0.0
    ).to(tl.float32)  # fmt: skip  [n, d]
    comb_mask = n_mask[:, None] & n_mask[None, :]
    comb = tl.load(comb_ptr + t * N * N + n[:, None] * N + n[None, :], mask=comb_mask, other=0.0)
    comb = comb.to(dtype).to(tl.float32)
    mix = tl.sum(comb[:, :, None] * x[:, None, :], axis=0)
    post = tl.load(post_ptr + t * N + n, mask=n_mask, other=0.0).to(dtype).to(tl.float32)
    out = tl.load(out_ptr + t * stride_ot + d, mask=d_mask, other=0.0).to(tl.float32)
    spread = (post[:, None] * out[None, :]).to(dtype).to(tl.float32)
    y = spread + mix.to(dtype).to(tl.float32)
    tl.store(y_ptr + t * N * D + n[:, None] * D + d[None, :], y.to(dtype), mask=tile_mask)


def hc_expand(
    block_out: torch.Tensor, streams: torch.Tensor, post: torch.Tensor, comb: torch.Tensor
) -> torch.Tensor:
    """`reference.hc_expand` in one launch; the result is contiguous."""
    num_tokens, n, d = streams.shape
    y = torch.empty(num_tokens, n, d, dtype=streams.dtype, device=streams.device)
    if num_tokens == 0:
        return y
    if streams.stride(-1) != 1:
        streams = streams.contiguous()
    block_out = block_out if block_out.stride(-1) == 1 else block_out.contiguous()
    grid = (num_tokens, triton.cdiv(d, EXPAND_BLOCK_D))
    _hc_expand_kernel[grid](
        block_out, streams, post.contiguous(), comb.contiguous(), y, block_out.stride(0),
        streams.stride(0), streams.stride(1), d, N=n, BLOCK_N=max(2, triton.next_power_of_2(n)),
        BLOCK_D=EXPAND_BLOCK_D,
    )  # fmt: skip
    return y
