"""Triton `reference.fp8_moe_experts`, no host sync: two GEMV launches for T k <= E, else grouped
GEMMs over pairs sorted by expert (each expert's weights read once per block)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyla.ops.fp8 import kernels
from hyla.ops.fp8.kernels import _quantize_groups, device_name
from hyla.ops.fp8.tiles import MoeTiles, pick_moe


@triton.jit
def _gate_up_gemv_kernel(
    x_ptr, w_ptr, ws_ptr, sw_ptr, ss_ptr, ids_ptr, h_ptr,
    P, D, I, I_BLOCKS,
    stride_xt, stride_we, stride_wr, stride_wse, stride_wsr, stride_hp,
    TOPK: tl.constexpr, BN_SCALE: tl.constexpr, BLOCK_I: tl.constexpr,
    GROUP: tl.constexpr, GROUPS: tl.constexpr,
):  # fmt: skip
    # programs p >= P: token p - P through the shared expert (sw_ptr, ss_ptr)
    p = tl.program_id(0).to(tl.int64)
    routed = p < P
    t = tl.where(routed, p // TOPK, p - P)
    e = tl.load(ids_ptr + p, mask=routed, other=0).to(tl.int64)
    i0 = tl.program_id(1) * BLOCK_I
    offs_i = i0 + tl.arange(0, BLOCK_I)
    mask_i = offs_i < I
    offs_g = tl.arange(0, GROUPS)
    cols = offs_g[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    depth = tl.arange(0, GROUPS * GROUP)
    w_gate = (
        tl.where(routed, w_ptr + e * stride_we, sw_ptr) + offs_i[:, None].to(tl.int64) * stride_wr
    )
    w_up = w_gate + I * stride_wr
    s_gate = (
        tl.where(routed, ws_ptr + e * stride_wse, ss_ptr)
        + (i0 // BN_SCALE).to(tl.int64) * stride_wsr
    )
    s_up = s_gate + I_BLOCKS * stride_wsr
    num_groups = tl.cdiv(D, GROUP)
    acc_g = tl.zeros([BLOCK_I], tl.float32)
    acc_u = tl.zeros([BLOCK_I], tl.float32)
    for k0 in range(0, D, GROUPS * GROUP):
        k = k0 + cols
        x = tl.load(x_ptr + t * stride_xt + k, mask=k < D, other=0.0).to(tl.float32)
        xq, xs = _quantize_groups(x, 1)
        j = k0 // GROUP + offs_g
        sg = tl.load(s_gate + j, mask=j < num_groups, other=0.0) * xs
        su = tl.load(s_up + j, mask=j < num_groups, other=0.0) * xs
        xg = tl.reshape(xq * sg[:, None], [GROUPS * GROUP])
        xu = tl.reshape(xq * su[:, None], [GROUPS * GROUP])
        kk = k0 + depth
        mask = mask_i[:, None] & (kk < D)[None, :]
        wg = tl.load(w_gate + kk[None, :], mask=mask, other=0.0)
        wu = tl.load(w_up + kk[None, :], mask=mask, other=0.0)
        acc_g += tl.sum(wg.to(tl.float32) * xg[None, :], axis=1)
        acc_u += tl.sum(wu.to(tl.float32) * xu[None, :], axis=1)
    dtype = h_ptr.dtype.element_ty
    g = acc_g.to(dtype).to(tl.float32)
    u = acc_u.to(dtype).to(tl.float32)
    tl.store(h_ptr + p * stride_hp + offs_i, (g / (1.0 + tl.exp(-g)) * u).to(dtype), mask=mask_i)


@triton.jit
def _down_gemv_kernel(
    h_ptr, w_ptr, ws_ptr, sw_ptr, ss_ptr, ids_ptr, wts_ptr, out_ptr,
    P, D, I,
    stride_hp, stride_we, stride_wr, stride_wse, stride_wsr, stride_ot,
    TOPK: tl.constexpr, BLOCK_K: tl.constexpr, BN_SCALE: tl.constexpr, BLOCK_D: tl.constexpr,
    GROUP: tl.constexpr, GROUPS: tl.constexpr, SHARED: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_K)
    mask_s = offs_s < TOPK
    ids = tl.load(ids_ptr + t * TOPK + offs_s, mask=mask_s, other=0).to(tl.int64)
    wts = tl.load(wts_ptr + t * TOPK + offs_s, mask=mask_s, other=0.0).to(tl.float32)
    d0 = tl.program_id(1) * BLOCK_D
    offs_d = d0 + tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    offs_g = tl.arange(0, GROUPS)
    cols = offs_g[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    depth = tl.arange(0, GROUPS * GROUP)
    w_rows = w_ptr + ids[:, None] * stride_we + offs_d[None, :].to(tl.int64) * stride_wr
    s_rows = ws_ptr + ids * stride_wse + (d0 // BN_SCALE).to(tl.int64) * stride_wsr
    h_rows = h_ptr + (t * TOPK + offs_s) * stride_hp
    num_groups = tl.cdiv(I, GROUP)
    acc = tl.zeros([BLOCK_K, BLOCK_D], tl.float32)
    for k0 in range(0, I, GROUPS * GROUP):
        k = k0 + cols
        h_mask = mask_s[:, None, None] & (k < I)[None, :, :]
        h = tl.load(h_rows[:, None, None] + k[None, :, :], mask=h_mask, other=0.0)
        hq, hs = _quantize_groups(h.to(tl.float32), 2)
        j = k0 // GROUP + offs_g
        s_mask = mask_s[:, None] & (j < num_groups)[None, :]
        ws = tl.load(s_rows[:, None] + j[None, :], mask=s_mask, other=0.0)
        he = tl.reshape(hq * (hs * ws)[:, :, None], [BLOCK_K, GROUPS * GROUP])
        kk = k0 + depth
        w_mask = (mask_s[:, None] & mask_d[None, :])[:, :, None] & (kk < I)[None, None, :]
        w = tl.load(w_rows[:, :, None] + kk[None, None, :], mask=w_mask, other=0.0)
        acc += tl.sum(w.to(tl.float32) * he[:, None, :], axis=2)
    dtype = out_ptr.dtype.element_ty
    terms = acc.to(dtype).to(tl.float32) * wts[:, None]
    out = tl.sum(terms, axis=0).to(dtype)
    if SHARED:
        s_row = ss_ptr + (d0 // BN_SCALE).to(tl.int64) * stride_wsr
        sw_rows = sw_ptr + offs_d[:, None].to(tl.int64) * stride_wr
        acc_s = tl.zeros([BLOCK_D], tl.float32)
        for k0 in range(0, I, GROUPS * GROUP):
            k = k0 + cols
            h = tl.load(h_ptr + (P + t) * stride_hp + k, mask=k < I, other=0.0)
            hq, hs = _quantize_groups(h.to(tl.float32), 1)
            j = k0 // GROUP + offs_g
            hs = hs * tl.load(s_row + j, mask=j < num_groups, other=0.0)
            he = tl.reshape(hq * hs[:, None], [GROUPS * GROUP])
            kk = k0 + depth
            w = tl.load(sw_rows + kk[None, :], mask=mask_d[:, None] & (kk < I)[None, :], other=0.0)
            acc_s += tl.sum(w.to(tl.float32) * he[None, :], axis=1)
        out = (out.to(tl.float32) + acc_s.to(dtype).to(tl.float32)).to(dtype)
    tl.store(out_ptr + t * stride_ot + offs_d, out, mask=mask_d)


@triton.jit
def _gate_up_grouped_kernel(
    x_ptr, xs_ptr, w_ptr, ws_ptr, pairs_ptr, block_expert_ptr, h_ptr,
    P, D, I, I_BLOCKS,
    stride_xt, stride_xst, stride_we, stride_wr, stride_wse, stride_wsr, stride_hp,
    TOPK: tl.constexpr, BN_SCALE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_FP8: tl.constexpr,
    QUANTIZE: tl.constexpr,
):  # fmt: skip
    block = tl.program_id(0)
    e = tl.load(block_expert_ptr + block).to(tl.int64)
    if e < 0:
        return
    pairs = tl.load(pairs_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    valid = pairs < P
    x_rows = x_ptr + (pairs // TOPK)[:, None] * stride_xt
    xs_rows = xs_ptr + (pairs // TOPK) * stride_xst
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < I
    w_gate = w_ptr + e * stride_we + rows[:, None].to(tl.int64) * stride_wr
    w_up = w_gate + I * stride_wr
    s_gate = ws_ptr + e * stride_wse + (rows // BN_SCALE).to(tl.int64) * stride_wsr
    s_up = s_gate + I_BLOCKS * stride_wsr
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for j in range(0, tl.cdiv(D, BLOCK_K)):
        k = j * BLOCK_K + tl.arange(0, BLOCK_K)
        k_ok = k < D
        a = tl.load(x_rows + k[None, :], mask=valid[:, None] & k_ok[None, :], other=0.0)
        if QUANTIZE:
            aq, xs = _quantize_groups(a.to(tl.float32), 1)
        else:
            aq, xs = a.to(tl.float32), tl.load(xs_rows + j, mask=valid, other=0.0)
        w_mask = row_ok[:, None] & k_ok[None, :]
        wg = tl.load(w_gate + k[None, :], mask=w_mask, other=0.0)
        wu = tl.load(w_up + k[None, :], mask=w_mask, other=0.0)
        if DOT_FP8:
            a8 = aq.to(w_ptr.dtype.element_ty)
            pg, pu = tl.dot(a8, tl.trans(wg)), tl.dot(a8, tl.trans(wu))
        else:
            pg = tl.dot(aq, tl.trans(wg.to(tl.float32)))
            pu = tl.dot(aq, tl.trans(wu.to(tl.float32)))
        sg = tl.load(s_gate + j, mask=row_ok, other=0.0)
        su = tl.load(s_up + j, mask=row_ok, other=0.0)
        acc_g += pg * xs[:, None] * sg[None, :]
        acc_u += pu * xs[:, None] * su[None, :]
    dtype = h_ptr.dtype.element_ty
    g = acc_g.to(dtype).to(tl.float32)
    u = acc_u.to(dtype).to(tl.float32)
    h = (g / (1.0 + tl.exp(-g)) * u).to(dtype)
    out = h_ptr + pairs[:, None] * stride_hp + rows[None, :]
    tl.store(out, h, mask=valid[:, None] & row_ok[None, :])


@triton.jit
def _down_grouped_kernel(
    h_ptr, hs_ptr, w_ptr, ws_ptr, pairs_ptr, block_expert_ptr, wts_ptr, y_ptr,
    P, D, I,
    stride_hp, stride_hsp, stride_we, stride_wr, stride_wse, stride_wsr, stride_yp,
    BN_SCALE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_FP8: tl.constexpr,
    QUANTIZE: tl.constexpr, OUT_DTYPE: tl.constexpr,
):  # fmt: skip
    block = tl.program_id(0)
    e = tl.load(block_expert_ptr + block).to(tl.int64)
    if e < 0:
        return
    pairs = tl.load(pairs_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    valid = pairs < P
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < D
    w_rows = w_ptr + e * stride_we + rows[:, None].to(tl.int64) * stride_wr
    s_rows = ws_ptr + e * stride_wse + (rows // BN_SCALE).to(tl.int64) * stride_wsr
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for j in range(0, tl.cdiv(I, BLOCK_K)):
        k = j * BLOCK_K + tl.arange(0, BLOCK_K)
        k_ok = k < I
        a = tl.load(h_ptr + pairs[:, None] * stride_hp + k[None, :],
                    mask=valid[:, None] & k_ok[None, :], other=0.0)  # fmt: skip
        if QUANTIZE:
            aq, hs = _quantize_groups(a.to(tl.float32), 1)
        else:
            aq, hs = (
                a.to(tl.float32),
                tl.load(hs_ptr + pairs * stride_hsp + j, mask=valid, other=0.0),
            )
        b = tl.load(w_rows + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        if DOT_FP8:
            part = tl.dot(aq.to(w_ptr.dtype.element_ty), tl.trans(b))
        else:
            part = tl.dot(aq, tl.trans(b.to(tl.float32)))
        ws = tl.load(s_rows + j, mask=row_ok, other=0.0)
        acc += part * hs[:, None] * ws[None, :]
    w = tl.load(wts_ptr + pairs, mask=valid, other=0.0).to(tl.float32)
    y = acc.to(OUT_DTYPE).to(tl.float32) * w[:, None]
    tl.store(y_ptr + pairs[:, None] * stride_yp + rows[None, :], y,
             mask=valid[:, None] & row_ok[None, :])  # fmt: skip


_TL_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


def gemv_form(num_tokens: int, top_k: int, num_experts: int) -> bool:
    return num_tokens * top_k <= num_experts


def supports(hidden_states, gate_up_proj, gate_up_scale, down_proj, down_scale, topk_weights,
             topk_ids, block_size) -> bool:  # fmt: skip
    return kernels.supports(hidden_states, gate_up_proj, gate_up_scale, block_size) and (
        kernels.supports(
            hidden_states.new_empty(0, down_proj.shape[-1]), down_proj, down_scale, block_size
        )  # fmt: skip
    )


def _groups(depth: int, k: int, bk: int) -> int:
    return max(1, min(depth, triton.next_power_of_2(k)) // bk)


def _gemv(x, gate_up_proj, gate_up_scale, down_proj, down_scale, wts, ids, block, t: MoeTiles,
          shared=None):  # fmt: skip
    (num_tokens, dim), (num_pairs, topk) = x.shape, (ids.numel(), ids.shape[1])
    inter, (bn, bk) = down_proj.shape[2], block
    s_gu, s_gus, s_dn, s_dns = shared or (gate_up_proj, gate_up_scale, down_proj, down_scale)
    h = x.new_empty(num_pairs + (num_tokens if shared else 0), inter)
    rows, cols = min(t.gate_rows, bn & -bn), min(t.down_cols, bn & -bn)
    _gate_up_gemv_kernel[(h.shape[0], triton.cdiv(inter, rows))](
        x, gate_up_proj, gate_up_scale, s_gu, s_gus, ids, h, num_pairs, dim, inter,
        triton.cdiv(inter, bn),
        x.stride(0), gate_up_proj.stride(0), gate_up_proj.stride(1),
        gate_up_scale.stride(0), gate_up_scale.stride(1), h.stride(0),
        TOPK=topk, BN_SCALE=bn, BLOCK_I=rows, GROUP=bk,
        GROUPS=_groups(t.depth, dim, bk), num_warps=t.gate_warps,
    )  # fmt: skip
    out = x.new_empty(num_tokens, dim)
    _down_gemv_kernel[(num_tokens, triton.cdiv(dim, cols))](
        h, down_proj, down_scale, s_dn, s_dns, ids, wts, out, num_pairs, dim, inter,
        h.stride(0), down_proj.stride(0), down_proj.stride(1),
        down_scale.stride(0), down_scale.stride(1), out.stride(0),
        TOPK=topk, BLOCK_K=max(2, triton.next_power_of_2(topk)), BN_SCALE=bn,
        BLOCK_D=cols, GROUP=bk, GROUPS=_groups(t.down_depth, inter, bk), SHARED=bool(shared),
        num_warps=t.down_warps,
    )  # fmt: skip
    return out


def _grouped(x, gate_up_proj, gate_up_scale, down_proj, down_scale, wts, ids, block,
             t: MoeTiles):  # fmt: skip
    from hyla.ops.fp8 import align_kernel
    from hyla.ops.moe import grouped

    (num_tokens, dim), (num_pairs, topk) = x.shape, (ids.numel(), ids.shape[1])
    num_experts, inter, (bn, bk) = gate_up_proj.shape[0], down_proj.shape[2], block
    block_m = t.block_m if num_pairs <= 1024 else 64
    align = align_kernel.align if align_kernel.fits(num_pairs, num_experts) else grouped.align
    sorted_pairs, block_expert = align(ids, num_experts, block_m)
    num_blocks, fp8_dot = block_expert.numel(), kernels.dot_fp8(x.device)
    launch = dict(DOT_FP8=fp8_dot, QUANTIZE=t.grouped_fused, num_warps=t.grouped_warps,
                  num_stages=t.grouped_stages)  # fmt: skip
    xq, xs = (x, x) if t.grouped_fused else kernels.quantize_rows(x, bk)
    h = x.new_empty(num_pairs, inter)
    _gate_up_grouped_kernel[(num_blocks, triton.cdiv(inter, t.block_n))](
        xq, xs, gate_up_proj, gate_up_scale, sorted_pairs, block_expert, h,
        num_pairs, dim, inter, triton.cdiv(inter, bn),
        xq.stride(0), xs.stride(0), gate_up_proj.stride(0), gate_up_proj.stride(1),
        gate_up_scale.stride(0), gate_up_scale.stride(1), h.stride(0),
        TOPK=topk, BN_SCALE=bn, BLOCK_M=block_m, BLOCK_N=t.block_n, BLOCK_K=bk, **launch,
    )  # fmt: skip
    hq, hs = (h, h) if t.grouped_fused else kernels.quantize_rows(h, bk)
    y = torch.empty(num_pairs, dim, dtype=torch.float32, device=x.device)
    _down_grouped_kernel[(num_blocks, triton.cdiv(dim, t.block_n))](
        hq, hs, down_proj, down_scale, sorted_pairs, block_expert, wts.reshape(-1), y,
        num_pairs, dim, inter,
        hq.stride(0), hs.stride(0), down_proj.stride(0), down_proj.stride(1),
        down_scale.stride(0), down_scale.stride(1), y.stride(0),
        BN_SCALE=bn, BLOCK_M=block_m, BLOCK_N=t.block_n, BLOCK_K=bk,
        OUT_DTYPE=_TL_DTYPES[x.dtype], **launch,
    )  # fmt: skip
    return y.view(num_tokens, topk, dim).sum(1).to(x.dtype)


def fp8_moe_experts(hidden_states, gate_up_proj, gate_up_scale, down_proj, down_scale,
                    topk_weights, topk_ids, block_size, tiles: MoeTiles | None = None,
                    grouped: bool | None = None) -> torch.Tensor:  # fmt: skip
    """`reference.fp8_moe_experts`; `grouped` forces a form, `tiles` overrides `tiles.pick_moe`."""
    num_tokens, topk = topk_ids.shape
    if topk_ids.numel() == 0:
        return torch.zeros_like(hidden_states)
    if grouped is None:
        grouped = not gemv_form(num_tokens, topk, gate_up_proj.shape[0])
    x = hidden_states if hidden_states.stride(-1) == 1 else hidden_states.contiguous()
    tiles = tiles or _pick(x, topk_ids, down_proj)
    args = (x, gate_up_proj, gate_up_scale, down_proj, down_scale, topk_weights.contiguous(),
            topk_ids.contiguous(), tuple(block_size), tiles)  # fmt: skip
    return _grouped(*args) if grouped else _gemv(*args)


def _pick(x: torch.Tensor, topk_ids: torch.Tensor, down_proj: torch.Tensor) -> MoeTiles:
    (num_tokens, topk), (num_experts, dim, inter) = topk_ids.shape, down_proj.shape
    return pick_moe(num_tokens, num_experts, topk, inter, dim, device_name(x.device))


def shared_fits(gate_up_proj, gate_up_scale, down_proj, down_scale, shared) -> bool:
    """Whether `shared` has the routed experts' shapes, dtypes, strides and device."""
    s_gu, s_gus, s_dn, s_dns = shared
    return (
        s_gu.shape == gate_up_proj.shape[1:] and s_dn.shape == down_proj.shape[1:]
        and s_gus.shape == gate_up_scale.shape[1:] and s_dns.shape == down_scale.shape[1:]
        and s_gu.dtype == s_dn.dtype == gate_up_proj.dtype
        and s_gus.dtype == s_dns.dtype == torch.float32
        and s_gu.stride() == gate_up_proj.stride()[1:] and s_dn.stride() == down_proj.stride()[1:]
        and s_gus.stride() == gate_up_scale.stride()[1:]
        and s_dns.stride() == down_scale.stride()[1:]
        and len({t.device for t in (*shared, gate_up_proj)}) == 1
    )  # fmt: skip


def fp8_moe_experts_and_shared(hidden_states, gate_up_proj, gate_up_scale, down_proj,
                               down_scale, topk_weights, topk_ids, block_size, shared,
                               tiles: MoeTiles | None = None) -> torch.Tensor:  # fmt: skip
    """`fp8_moe_experts` + the shared expert in the GEMV launches; needs `shared_fits`."""
    x = hidden_states if hidden_states.stride(-1) == 1 else hidden_states.contiguous()
    tiles = tiles or _pick(x, topk_ids, down_proj)
    args = (x, gate_up_proj, gate_up_scale, down_proj, down_scale, topk_weights.contiguous(),
            topk_ids.contiguous(), tuple(block_size), tiles)  # fmt: skip
    return _gemv(*args, shared=tuple(shared))
