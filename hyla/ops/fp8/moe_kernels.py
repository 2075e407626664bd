"""fp8 routed experts on CUDA: `reference.fp8_moe_experts` through the kernels of `kernels.py`.

decode-sized (T k <= MAX_GEMV_ROWS): every (token, slot) row runs the GEMV against its own
    expert's weight in place (`expert_ids`), gate and up as two row blocks of gate_up_proj
    (each has its own block grid), then silu(gate) * up, then down: no host sync, capturable
larger (prefill): tokens grouped by expert on the host (one sync), one GEMM per expert
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hyla.ops.fp8 import kernels

MAX_GEMV_ROWS = 256


def rows_path(num_tokens: int, top_k: int, num_experts: int) -> bool:
    """Whether the sync-free GEMV rows run: up to MAX_GEMV_ROWS rows, and every batch for which
    the bf16 experts are sync-free (`hyla.ops.moe.kernels.sync_free`: T k <= E or
    T E <= 8192), so each batch size the decode graphs capture stays capturable."""
    rows = num_tokens * top_k
    return rows <= max(MAX_GEMV_ROWS, num_experts) or num_tokens * num_experts <= 8192


def supports(hidden_states, gate_up_proj, gate_up_scale, down_proj, down_scale, topk_weights,
             topk_ids, block_size) -> bool:  # fmt: skip
    """True when both products fit the kernels (see `kernels.supports`)."""
    return kernels.supports(hidden_states, gate_up_proj, gate_up_scale, block_size) and (
        kernels.supports(
            hidden_states.new_empty(0, down_proj.shape[-1]), down_proj, down_scale, block_size
        )  # fmt: skip
    )


def _halves(weight: torch.Tensor, scale: torch.Tensor):
    rows, scale_rows = weight.shape[-2] // 2, scale.shape[-2] // 2
    return ((weight[..., :rows, :], scale[..., :scale_rows, :]),
            (weight[..., rows:, :], scale[..., scale_rows:, :]))  # fmt: skip


def _swiglu(gate: torch.Tensor, up: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (F.silu(gate.float()) * up.float()).to(dtype)


def _rows_gemv(hidden, gate_up_proj, gate_up_scale, down_proj, down_scale, topk_ids, block):
    dtype, k = hidden.dtype, topk_ids.shape[1]
    xq, xs = kernels.quantize_rows(hidden, block[1])
    tok = torch.arange(hidden.shape[0], device=hidden.device).repeat_interleave(k)
    ids = topk_ids.reshape(-1)
    xq, xs = xq.index_select(0, tok), xs.index_select(0, tok)
    gate, up = (kernels.fp8_gemv(xq, xs, w, s, block, dtype, ids)
                for w, s in _halves(gate_up_proj, gate_up_scale))  # fmt: skip
    aq, as_ = kernels.quantize_rows(_swiglu(gate, up, dtype), block[1])
    return kernels.fp8_gemv(aq, as_, down_proj, down_scale, block, dtype, ids)  # [T k, D]


def _grouped_gemm(hidden, gate_up_proj, gate_up_scale, down_proj, down_scale, topk_ids, block):
    dtype, k = hidden.dtype, topk_ids.shape[1]
    out = hidden.new_empty(topk_ids.numel(), hidden.shape[1])
    flat = topk_ids.reshape(-1)
    xq, xs = kernels.quantize_rows(hidden, block[1])
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=gate_up_proj.shape[0]).tolist()  # host sync
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        rows = order[start : start + n]
        start += n
        tq, ts = xq.index_select(0, rows // k), xs.index_select(0, rows // k)
        gate, up = (kernels.fp8_gemm(tq, ts, w[e], s[e], block, dtype)
                    for w, s in _halves(gate_up_proj, gate_up_scale))  # fmt: skip
        aq, as_ = kernels.quantize_rows(_swiglu(gate, up, dtype), block[1])
        out[rows] = kernels.fp8_gemm(aq, as_, down_proj[e], down_scale[e], block, dtype)
    return out


def fp8_moe_experts(hidden_states, gate_up_proj, gate_up_scale, down_proj, down_scale,
                    topk_weights, topk_ids, block_size) -> torch.Tensor:  # fmt: skip
    """`reference.fp8_moe_experts` (same arguments and result up to fp32 summation order)."""
    num_tokens, k = topk_ids.shape
    args = (hidden_states, gate_up_proj, gate_up_scale, down_proj, down_scale, topk_ids,
            tuple(block_size))  # fmt: skip
    rows = _rows_gemv(*args) if rows_path(num_tokens, k, gate_up_proj.shape[0]) else (
        _grouped_gemm(*args))  # fmt: skip
    weighted = rows.float().view(num_tokens, k, -1) * topk_weights.float()[..., None]
    return weighted.sum(1).to(hidden_states.dtype)
