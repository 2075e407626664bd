"""Mixture-of-experts FFN: router, routed experts (fused `gate_up_proj` [E, 2I, D], gate rows
then up rows: the transformers 5 layout) and optional shared experts."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from hyla.config import ModelConfig, MoEConfig
from hyla.layers.fp8_experts import Fp8Experts
from hyla.layers.linear import Fp8Linear, Linear
from hyla.layers.mlp import GatedMLP
from hyla.ops.fp8 import fp8_moe_experts_and_shared
from hyla.ops.fp8 import fuses_shared as fp8_fuses_shared
from hyla.ops.gpu import use_triton
from hyla.ops.linear import Prepacked, adjacent_rows, prepacked_linear, usable
from hyla.ops.linear.dispatch import linear_fp32
from hyla.ops.moe import (
    fuses_shared,
    moe_experts,
    moe_experts_and_shared,
    route_hash,
    route_sigmoid,
    route_softmax,
    route_sqrt_softplus,
)
from hyla.ops.moe_clamped import moe_experts_clamped


def shared_width(moe: MoEConfig) -> int:
    """Width of the fused shared-expert MLP (all shared experts); 0 = none."""
    if moe.num_shared_experts == 0:
        return 0
    return moe.shared_intermediate_size or moe.num_shared_experts * moe.moe_intermediate_size


class Router(nn.Module):
    def __init__(self, hidden_size: int, moe: MoEConfig, vocab_size: int | None = None) -> None:
        super().__init__()
        self.moe = moe
        self.weight = nn.Parameter(torch.empty(moe.num_experts, hidden_size))
        if vocab_size is not None:  # hash routing (DeepSeek-V4): experts by token id
            self.register_buffer(
                "tid2eid", torch.zeros(vocab_size, moe.num_experts_per_tok, dtype=torch.long)
            )
        if moe.has_correction_bias:
            self.register_buffer(
                "e_score_correction_bias", torch.zeros(moe.num_experts, dtype=torch.float32)
            )
        else:
            self.e_score_correction_bias = None
        self._weight_fp32: tuple[tuple, torch.Tensor] | None = None
        self.packed = Prepacked()  # fp32 CPU: row-count-independent logits

    def weight_fp32(self) -> torch.Tensor:
        """`weight` as fp32, a copy kept until the parameter changes (a cast per step would
        rewrite the whole router weight at every layer); not kept under autograd."""
        w = self.weight
        if w.dtype == torch.float32 or (w.requires_grad and torch.is_grad_enabled()):
            return w.float()
        key = (w.data_ptr(), w._version, w.dtype, w.device)
        if self._weight_fp32 is None or self._weight_fp32[0] != key:
            self._weight_fp32 = (key, w.detach().float())
        return self._weight_fp32[1]

    def forward(
        self, hidden_states: torch.Tensor, token_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden_states [T, D] (token_ids [T] when hash-routed) -> (weights, ids) [T, k].
        Sigmoid logits are fp32 (DeepSeek-V3); softmax's in the hidden dtype (Qwen3-Next)."""
        moe = self.moe
        if moe.scoring == "softmax":
            logits = prepacked_linear(hidden_states, self.weight, self.packed)
            return route_softmax(logits, moe.num_experts_per_tok, moe.norm_topk_prob)
        if usable(hidden_states, (self.weight,)):
            logits = prepacked_linear(hidden_states, self.weight, self.packed)
        else:
            logits = linear_fp32(hidden_states, self.weight_fp32())
        if hasattr(self, "tid2eid"):
            return route_hash(logits, token_ids, self.tid2eid, moe.routed_scaling_factor)
        if moe.scoring == "sqrt_softplus":
            bias, k = self.e_score_correction_bias, moe.num_experts_per_tok
            return route_sqrt_softplus(logits, bias, k, moe.routed_scaling_factor)
        return route_sigmoid(
            logits,
            self.e_score_correction_bias,
            moe.num_experts_per_tok,
            moe.n_group,
            moe.topk_group,
            moe.norm_topk_prob,
            moe.routed_scaling_factor,
        )


class Experts(nn.Module):
    """E SwiGLU experts stored fused; `packed` holds oneDNN copies for fp32 CPU inference."""

    def __init__(self, hidden_size: int, moe: MoEConfig) -> None:
        super().__init__()
        E, I = moe.num_experts, moe.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(E, 2 * I, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(E, hidden_size, I))
        self.packed = (Prepacked(), Prepacked())

    def forward(
        self, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        return moe_experts(
            hidden_states,
            self.gate_up_proj,
            self.down_proj,
            topk_weights,
            topk_ids,
            packed=self.packed,
        )


class MoE(nn.Module):
    """Routed plus shared experts: `experts(x) + [sigmoid(g(x)) *] shared_experts(x)`."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        moe = config.moe
        self.layer_idx = layer_idx
        self.routes_by_token = config.ffn_pattern[layer_idx] == "hash_moe"
        if self.routes_by_token:  # the table picks the experts: no correction bias
            moe = dataclasses.replace(moe, has_correction_bias=False)
        vocab = config.vocab_size if self.routes_by_token else None
        self.gate = Router(config.hidden_size, moe, vocab)
        self.experts = Experts(config.hidden_size, moe)
        width = shared_width(moe)
        self.shared_experts = GatedMLP(config, layer_idx, width) if width else None
        self.shared_expert_gate = (
            Linear(config.hidden_size, 1, bias=False) if width and moe.shared_expert_gate else None
        )
        self.swiglu_limit = config.swiglu_limit

    def forward(
        self, hidden_states: torch.Tensor, token_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        topk_weights, topk_ids = self.gate(hidden_states, token_ids)
        if self.swiglu_limit is not None:
            return self._forward_clamped(hidden_states, topk_weights, topk_ids)
        if isinstance(self.experts, Fp8Experts):
            fused_fp8 = self._fp8_with_shared(hidden_states, topk_weights, topk_ids)
            if fused_fp8 is not None:
                return fused_fp8
        fused = self._fused_shared(hidden_states, topk_ids)
        if fused is not None:
            e = self.experts
            return moe_experts_and_shared(
                hidden_states, e.gate_up_proj, e.down_proj, topk_weights, topk_ids, *fused
            )
        out = self.experts(hidden_states, topk_weights, topk_ids)
        if self.shared_experts is not None:
            shared = self.shared_experts(hidden_states)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(hidden_states)) * shared
            out = out + shared
        return out

    def _forward_clamped(
        self, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        e = self.experts
        route = getattr(e, "local_routing", None)
        if route is not None:
            topk_weights, topk_ids = route(topk_weights, topk_ids)
        fused = None if route is not None else self._fused_shared(hidden_states, topk_ids)
        if fused is not None:
            return moe_experts_and_shared(
                hidden_states, e.gate_up_proj, e.down_proj, topk_weights, topk_ids, *fused,
                limit=self.swiglu_limit,
            )  # fmt: skip
        out = moe_experts_clamped(
            hidden_states, e.gate_up_proj, e.down_proj, topk_weights, topk_ids, self.swiglu_limit
        )
        if self.shared_experts is not None:  # a GatedMLP: clamped by the same config field
            out = out + self.shared_experts(hidden_states)
        return out

    def _fused_shared(
        self, hidden_states: torch.Tensor, topk_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(shared gate_up, down) when the shared expert can run inside the routed GEMVs."""
        mlp, e = self.shared_experts, self.experts
        if mlp is None or self.shared_expert_gate is not None or torch.is_grad_enabled():
            return None
        if not isinstance(e, Experts):
            return None
        if not use_triton(hidden_states) or topk_ids.numel() > e.gate_up_proj.shape[0]:
            return None  # cheap checks first: CPU and prefill steps skip the weight lookup
        gate_up = adjacent_rows([m.weight for m in mlp.stacked_projections()])
        if gate_up is None:
            return None
        down = mlp.down_proj.weight
        if fuses_shared(hidden_states, e.gate_up_proj, e.down_proj, topk_ids, gate_up, down):
            return gate_up, down
        return None

    def _fp8_with_shared(
        self, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor | None:
        """Routed fp8 experts plus the shared expert in two GEMV launches, or None."""
        mlp, e = self.shared_experts, self.experts
        if mlp is None or self.shared_expert_gate is not None or torch.is_grad_enabled():
            return None
        parts = (*mlp.stacked_projections(), mlp.down_proj)
        if not all(isinstance(m, Fp8Linear) and m.block_size == e.block_size for m in parts):
            return None
        gate_up = adjacent_rows([m.weight for m in parts[:2]])
        gate_up_scale = adjacent_rows([m.weight_scale_inv for m in parts[:2]])
        if gate_up is None or gate_up_scale is None:
            return None
        shared = (gate_up, gate_up_scale, mlp.down_proj.weight, mlp.down_proj.weight_scale_inv)
        args = (hidden_states, e.gate_up_proj, e.gate_up_proj_scale_inv, e.down_proj,
                e.down_proj_scale_inv, topk_weights, topk_ids, e.block_size)  # fmt: skip
        if not fp8_fuses_shared(*args, shared):
            return None
        return fp8_moe_experts_and_shared(*args, shared)
