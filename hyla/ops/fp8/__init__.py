"""FP8 (e4m3) ops: Triton kernels for CUDA tensors where they exist, else the reference."""

from __future__ import annotations

import torch

from hyla.ops.fp8 import reference
from hyla.ops.fp8.reference import (
    FP8,
    FP8_MAX,
    dequantize_activation,
    dequantize_per_token,
    dequantize_stacked,
    dequantize_weight_blockwise,
    fake_quantize_activation,
    quantize_activation,
    quantize_per_token,
    quantize_weight_blockwise,
)
from hyla.ops.gpu import needs_grad, use_triton


def fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    block_size: tuple[int, int],
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [..., K], weight [N, K] fp8, weight_scale [ceil(N/bn), ceil(K/bk)] -> [..., N]."""
    if use_triton(x) and not needs_grad(x):
        from hyla.ops.fp8 import kernels

        if kernels.supports(x, weight, weight_scale, block_size):
            out = kernels.fp8_linear(x, weight, weight_scale, block_size)
            return out if bias is None else out + bias
    return reference.fp8_linear(x, weight, weight_scale, block_size, bias)


def fp8_moe_experts(
    hidden_states: torch.Tensor,
    gate_up_proj: torch.Tensor,
    gate_up_scale: torch.Tensor,
    down_proj: torch.Tensor,
    down_scale: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    block_size: tuple[int, int],
) -> torch.Tensor:
    """`reference.fp8_moe_experts` (shapes there)."""
    args = (hidden_states, gate_up_proj, gate_up_scale, down_proj, down_scale, topk_weights,
            topk_ids, block_size)  # fmt: skip
    if use_triton(hidden_states):
        from hyla.ops.fp8 import moe_kernels

        if moe_kernels.supports(*args):
            return moe_kernels.fp8_moe_experts(*args)
    return reference.fp8_moe_experts(*args)


def fp8_moe_experts_and_shared(
    hidden_states: torch.Tensor,
    gate_up_proj: torch.Tensor,
    gate_up_scale: torch.Tensor,
    down_proj: torch.Tensor,
    down_scale: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    block_size: tuple[int, int],
    shared: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
) -> torch.Tensor:
    """`fp8_moe_experts` plus an ungated fp8 shared expert `shared` = (gate_up [2I, D], scale,
    down [D, I], scale), each rounded to the hidden dtype before the sum."""
    args = (hidden_states, gate_up_proj, gate_up_scale, down_proj, down_scale, topk_weights,
            topk_ids, block_size)  # fmt: skip
    if fuses_shared(*args, shared):
        from hyla.ops.fp8 import moe_kernels

        return moe_kernels.fp8_moe_experts_and_shared(*args, shared)
    routed = fp8_moe_experts(*args)
    return routed + reference.fp8_shared_expert(hidden_states, *shared, block_size)


def fuses_shared(hidden_states, gate_up_proj, gate_up_scale, down_proj, down_scale, topk_weights,
                 topk_ids, block_size, shared) -> bool:  # fmt: skip
    """Whether the shared expert runs inside the routed experts' GEMV launches."""
    if not use_triton(hidden_states) or needs_grad(hidden_states):
        return False
    from hyla.ops.fp8 import moe_kernels

    num_tokens, topk = topk_ids.shape
    args = (hidden_states, gate_up_proj, gate_up_scale, down_proj, down_scale, topk_weights,
            topk_ids, block_size)  # fmt: skip
    return (
        moe_kernels.gemv_form(num_tokens, topk, gate_up_proj.shape[0])
        and moe_kernels.supports(*args)
        and moe_kernels.shared_fits(gate_up_proj, gate_up_scale, down_proj, down_scale, shared)
    )


__all__ = [
    "FP8",
    "FP8_MAX",
    "dequantize_activation",
    "dequantize_per_token",
    "dequantize_stacked",
    "dequantize_weight_blockwise",
    "fake_quantize_activation",
    "fp8_linear",
    "fp8_moe_experts",
    "fp8_moe_experts_and_shared",
    "fuses_shared",
    "quantize_activation",
    "quantize_per_token",
    "quantize_weight_blockwise",
]
