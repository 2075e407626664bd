"""`reference.route_sigmoid` / `route_softmax`, one Triton program per row: an iterated arg-max
(lowest index on ties) picks what `reference.stable_topk` picks."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_EXPERTS = 1024  # a row's E scores live in registers


@triton.jit
def _take_best(values, avail, offs):
    vals = tl.where(avail, values, float("-inf"))
    best = tl.max(tl.max(vals, axis=1), axis=0)
    hit = avail & (vals == best)
    return tl.min(tl.min(tl.where(hit, offs, 1 << 30), axis=1), axis=0)


@triton.jit
def _select_store(
    choice, scores, valid, offs, w_ptr, ids_ptr, t, scale,
    TOPK: tl.constexpr, BLOCK_K: tl.constexpr, NORM: tl.constexpr, NORM_EPS: tl.constexpr,
):  # fmt: skip
    offs_k = tl.arange(0, BLOCK_K)
    mask_k = offs_k < TOPK
    weights = tl.zeros([BLOCK_K], tl.float32)
    ids = tl.zeros([BLOCK_K], tl.int64)
    avail = valid
    for j in tl.static_range(TOPK):
        idx = _take_best(choice, avail, offs)
        is_idx = offs == idx
        w = tl.sum(tl.sum(tl.where(is_idx, scores, 0.0), axis=1), axis=0)
        avail = avail & ~is_idx
        weights = tl.where(offs_k == j, w, weights)
        ids = tl.where(offs_k == j, idx.to(tl.int64), ids)
    if NORM:
        weights = weights / (tl.sum(tl.where(mask_k, weights, 0.0), axis=0) + NORM_EPS)
    weights = weights * scale
    tl.store(ids_ptr + t * TOPK + offs_k, ids, mask=mask_k)
    tl.store(w_ptr + t * TOPK + offs_k, weights.to(w_ptr.dtype.element_ty), mask=mask_k)


@triton.jit
def _group_limit(
    choice, valid, offs_s, offs_g,
    GROUP_SIZE: tl.constexpr, TOPK_GROUP: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_G: tl.constexpr,
):  # fmt: skip
    """`reference.group_limited_mask` applied (-inf outside the chosen groups)."""
    vals = tl.where(valid, choice, float("-inf"))
    top1 = tl.max(vals, axis=1)
    group_score = top1
    if GROUP_SIZE > 1:
        hit = valid & (vals == top1[:, None])
        first = tl.min(tl.where(hit, offs_s[None, :], BLOCK_S), axis=1)
        rest = valid & (offs_s[None, :] != first[:, None])
        group_score = top1 + tl.max(tl.where(rest, vals, float("-inf")), axis=1)
    group_valid = tl.max(valid.to(tl.int32), axis=1) > 0
    avail = group_valid
    chosen = offs_g < 0
    for _ in tl.static_range(TOPK_GROUP):
        vals_g = tl.where(avail, group_score, float("-inf"))
        best = tl.max(vals_g, axis=0)
        g = tl.min(tl.where(avail & (vals_g == best), offs_g, BLOCK_G), axis=0)
        chosen = chosen | (offs_g == g)
        avail = avail & (offs_g != g)
    return tl.where(chosen[:, None], choice, float("-inf"))


@triton.jit
def _route_sigmoid_kernel(
    logits_ptr, bias_ptr, w_ptr, ids_ptr,
    stride_t, scale,
    GROUP_SIZE: tl.constexpr, N_GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr,
    TOPK: tl.constexpr, HAS_BIAS: tl.constexpr, NORM: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    offs_g = tl.arange(0, BLOCK_G)
    offs_s = tl.arange(0, BLOCK_S)
    offs = offs_g[:, None] * GROUP_SIZE + offs_s[None, :]
    valid = (offs_g[:, None] < N_GROUP) & (offs_s[None, :] < GROUP_SIZE)
    x = tl.load(logits_ptr + t * stride_t + offs, mask=valid, other=0.0).to(tl.float64)
    scores = (1.0 / (1.0 + tl.exp(-x))).to(tl.float32)
    choice = scores
    if HAS_BIAS:
        choice = choice + tl.load(bias_ptr + offs, mask=valid, other=0.0)
    if N_GROUP > 1:
        choice = _group_limit(
            choice, valid, offs_s, offs_g, GROUP_SIZE, TOPK_GROUP, BLOCK_S, BLOCK_G
        )
    _select_store(
        choice, scores, valid, offs, w_ptr, ids_ptr, t, scale,
        TOPK, BLOCK_K, NORM, 1e-20,
    )  # fmt: skip


@triton.jit
def _route_softmax_kernel(
    logits_ptr, w_ptr, ids_ptr,
    E, stride_t,
    TOPK: tl.constexpr, NORM: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_E)[None, :]
    valid = offs < E
    x = tl.load(logits_ptr + t * stride_t + offs, mask=valid, other=float("-inf")).to(tl.float32)
    e = tl.exp(x - tl.max(tl.max(x, axis=1), axis=0))
    probs = e / tl.sum(tl.sum(e, axis=1), axis=0)
    _select_store(x, probs, valid, offs, w_ptr, ids_ptr, t, 1.0, TOPK, BLOCK_K, NORM, 0.0)


def supports(router_logits: torch.Tensor, top_k: int) -> bool:
    num_experts = router_logits.shape[-1]
    return router_logits.dim() == 2 and 1 <= top_k <= num_experts <= MAX_EXPERTS


def _outputs(logits: torch.Tensor, top_k: int, dtype: torch.dtype) -> tuple:
    T = logits.shape[0]
    weights = torch.empty(T, top_k, dtype=dtype, device=logits.device)
    return weights, torch.empty(T, top_k, dtype=torch.int64, device=logits.device)


def route_sigmoid(
    router_logits: torch.Tensor,
    correction_bias: torch.Tensor | None,
    top_k: int,
    n_group: int = 1,
    topk_group: int = 1,
    norm_topk_prob: bool = True,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference.route_sigmoid`; needs `supports`. Raises ValueError unless n_group divides E
    and 1 <= topk_group <= n_group."""
    T, E = router_logits.shape
    if E % n_group or not 1 <= topk_group <= n_group:
        raise ValueError(f"n_group {n_group} / topk_group {topk_group} do not fit E = {E}")
    logits = router_logits.float().contiguous()
    weights, ids = _outputs(logits, top_k, torch.float32)
    if T == 0:
        return weights, ids
    bias = logits if correction_bias is None else correction_bias.float().contiguous()
    group_size = E // n_group
    _route_sigmoid_kernel[(T,)](
        logits, bias, weights, ids,
        logits.stride(0), float(routed_scaling_factor),
        GROUP_SIZE=group_size, N_GROUP=n_group, TOPK_GROUP=topk_group if n_group > 1 else 1,
        TOPK=top_k, HAS_BIAS=correction_bias is not None, NORM=bool(norm_topk_prob),
        BLOCK_G=triton.next_power_of_2(n_group), BLOCK_S=triton.next_power_of_2(group_size),
        BLOCK_K=triton.next_power_of_2(top_k),
        num_warps=1,
    )  # fmt: skip
    return weights, ids


def route_softmax(
    router_logits: torch.Tensor, top_k: int, norm_topk_prob: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference.route_softmax`; needs `supports`."""
    T, E = router_logits.shape
    logits = router_logits.contiguous()
    weights, ids = _outputs(logits, top_k, logits.dtype)
    if T == 0:
        return weights, ids
    _route_softmax_kernel[(T,)](
        logits, weights, ids, E, logits.stride(0),
        TOPK=top_k, NORM=bool(norm_topk_prob),
        BLOCK_E=triton.next_power_of_2(E), BLOCK_K=triton.next_power_of_2(top_k),
        num_warps=1,
    )  # fmt: skip
    return weights, ids
