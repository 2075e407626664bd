"""Linear-attention mixers: Kimi Delta Attention ("kda", in the Moonshot checkpoint layout) and
Gated DeltaNet ("gdn"): short conv over q|k|v, gated delta rule, gated RMSNorm."""

from __future__ import annotations

import math

import torch
from torch import nn

from hyla.config import ModelConfig
from hyla.forward_batch import ForwardBatch
from hyla.layers.linear import Linear, stacked_linear
from hyla.layers.state_slots import delta_rule_step, short_conv_step
from hyla.ops.gates import gdn_gates, kda_gates, kda_gates_bounded
from hyla.ops.gates import reference as gates_reference
from hyla.ops.gdn import chunk_gated_delta_rule, recurrent_gated_delta_rule
from hyla.ops.kda import chunk_kda, recurrent_kda
from hyla.ops.linear import Prepacked, adjacent_rows
from hyla.ops.norm import gated_rms_norm


class GatedRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, activation: str, weight_in_fp32: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.activation = activation
        self.weight_in_fp32 = weight_in_fp32

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return gated_rms_norm(x, gate, self.weight, self.eps, self.activation, self.weight_in_fp32)


def _depthwise_conv(channels: int, width: int) -> nn.Conv1d:
    # a weight holder only ([C, 1, W], as HF stores it)
    return nn.Conv1d(channels, channels, width, groups=channels, padding=width - 1, bias=False)


class KimiDeltaAttention(nn.Module):
    """Kimi Delta Attention mixer (Kimi Linear report, section 3): per-channel forget gate,
    sigmoid-gated output RMSNorm. With `linear.gate_lower_bound` (GLM-5.3-Flash) A_log is [HV]."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        lin = config.linear
        self.layer_idx = layer_idx
        self.num_k_heads, self.num_v_heads = lin.num_k_heads, lin.num_v_heads
        self.head_k_dim, self.head_v_dim = lin.head_k_dim, lin.head_v_dim
        D, W = config.hidden_size, lin.conv_kernel_size
        key_dim, value_dim = lin.num_k_heads * lin.head_k_dim, lin.num_v_heads * lin.head_v_dim
        self.q_proj = Linear(D, key_dim, bias=False)
        self.k_proj = Linear(D, key_dim, bias=False)
        self.v_proj = Linear(D, value_dim, bias=False)
        self.q_conv1d = _depthwise_conv(key_dim, W)
        self.k_conv1d = _depthwise_conv(key_dim, W)
        self.v_conv1d = _depthwise_conv(value_dim, W)
        self.f_a_proj = Linear(D, lin.head_k_dim, bias=False)
        self.f_b_proj = Linear(lin.head_k_dim, lin.num_v_heads * lin.head_k_dim, bias=False)
        # fla's init: A in [1, 16]; dt in [1e-3, 1e-1] stored as its inverse softplus
        self.A_log = nn.Parameter(torch.empty(1, 1, lin.num_v_heads, 1).uniform_(1, 16).log())
        self.gate_lower_bound = lin.gate_lower_bound
        if lin.gate_lower_bound is not None:
            self.A_log = nn.Parameter(torch.zeros(lin.num_v_heads))
        dt = torch.empty(lin.num_v_heads * lin.head_k_dim).uniform_(math.log(1e-3), math.log(0.1))
        self.dt_bias = nn.Parameter(dt.exp() + torch.log(-torch.expm1(-dt.exp())))
        self.b_proj = Linear(D, lin.num_v_heads, bias=False)
        self.g_a_proj = Linear(D, lin.head_v_dim, bias=False)
        self.g_b_proj = Linear(lin.head_v_dim, value_dim, bias=False)
        self.o_norm = GatedRMSNorm(lin.head_v_dim, config.rms_norm_eps, "sigmoid", True)
        self.o_proj = Linear(value_dim, D, bias=False)
        self.input_packed = Prepacked()

    def forget_gate(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Log-space decay g [T, HV, K] fp32 (PyTorch, differentiable)."""
        return self._log_decay(self.f_a_proj(hidden_states))

    def _log_decay(self, f_a: torch.Tensor) -> torch.Tensor:
        if self.gate_lower_bound is not None:
            return gates_reference.kda_log_decay_bounded(
                self.f_b_proj(f_a), self.dt_bias, self.A_log, self.gate_lower_bound
            )
        return gates_reference.kda_log_decay(self.f_b_proj(f_a), self.dt_bias, self.A_log)

    def _gates(self, f_b_out: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.gate_lower_bound is not None:
            return kda_gates_bounded(f_b_out, self.dt_bias, self.A_log, b, self.gate_lower_bound)
        return kda_gates(f_b_out, self.dt_bias, self.A_log, b)

    def stacked_projections(self) -> tuple[nn.Linear, ...]:
        """The input projections run as one matmul (`HybridModel.stack_projections`)."""
        return (self.q_proj, self.k_proj, self.v_proj, self.f_a_proj, self.g_a_proj, self.b_proj)

    def stacked_convolutions(self) -> tuple[nn.Conv1d, ...]:
        return (self.q_conv1d, self.k_conv1d, self.v_conv1d)

    def _conv_weight(self) -> torch.Tensor:
        weights = [conv.weight.squeeze(1) for conv in self.stacked_convolutions()]
        block = adjacent_rows(weights)
        return torch.cat(weights) if block is None else block

    def forward(
        self, hidden_states: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        x, T = hidden_states, hidden_states.shape[0]
        cache = batch.caches[self.layer_idx]
        key_dim, value_dim = self.num_k_heads * self.head_k_dim, self.num_v_heads * self.head_v_dim
        inputs = self.stacked_projections()
        mixed, f_a, g_a, b = stacked_linear(x, inputs, self.input_packed).split(
            [2 * key_dim + value_dim, self.head_k_dim, self.head_v_dim, self.num_v_heads], dim=-1
        )
        conv_weight = self._conv_weight()
        mixed = short_conv_step(mixed, conv_weight, cache, batch)
        q, k, v = mixed.split([key_dim, key_dim, value_dim], dim=-1)
        q = q.reshape(T, self.num_k_heads, self.head_k_dim)
        k = k.reshape(T, self.num_k_heads, self.head_k_dim)
        v = v.reshape(T, self.num_v_heads, self.head_v_dim)
        g, beta = self._gates(self.f_b_proj(f_a), b)
        o = delta_rule_step(chunk_kda, recurrent_kda, q, k, v, g, beta, cache, batch)
        gate = self.g_b_proj(g_a).view(T, self.num_v_heads, self.head_v_dim)
        return self.o_proj(self.o_norm(o, gate).reshape(T, -1))


class GatedDeltaNet(nn.Module):
    """Gated DeltaNet mixer (transformers' `Qwen3NextGatedDeltaNet`; `projection_layout` "flat":
    Qwen3.5's separate in_proj_qkv / z / b / a instead of the per-key-head grouped rows)."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        lin = config.linear
        self.layer_idx = layer_idx
        self.num_k_heads, self.num_v_heads = lin.num_k_heads, lin.num_v_heads
        self.head_k_dim, self.head_v_dim = lin.head_k_dim, lin.head_v_dim
        D = config.hidden_size
        key_dim, value_dim = lin.num_k_heads * lin.head_k_dim, lin.num_v_heads * lin.head_v_dim
        self.is_flat = lin.projection_layout == "flat"
        if self.is_flat:
            self.in_proj_qkv = Linear(D, 2 * key_dim + value_dim, bias=False)
            self.in_proj_z = Linear(D, value_dim, bias=False)
            self.in_proj_b = Linear(D, lin.num_v_heads, bias=False)
            self.in_proj_a = Linear(D, lin.num_v_heads, bias=False)
        else:
            self.in_proj_qkvz = Linear(D, 2 * key_dim + 2 * value_dim, bias=False)
            self.in_proj_ba = Linear(D, 2 * lin.num_v_heads, bias=False)
        self.conv1d = _depthwise_conv(2 * key_dim + value_dim, lin.conv_kernel_size)
        self.dt_bias = nn.Parameter(torch.ones(lin.num_v_heads))
        self.A_log = nn.Parameter(torch.empty(lin.num_v_heads).uniform_(0.01, 16).log())
        self.norm = GatedRMSNorm(lin.head_v_dim, config.rms_norm_eps, "silu", False)
        self.out_proj = Linear(value_dim, D, bias=False)

    def _split_projections(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """q, k [T, H*K]; v, z [T, HV*V]; b, a [T, HV]."""
        if self.is_flat:
            key_dim = self.num_k_heads * self.head_k_dim
            value_dim = self.num_v_heads * self.head_v_dim
            q, k, v = self.in_proj_qkv(x).split([key_dim, key_dim, value_dim], dim=-1)
            return q, k, v, self.in_proj_z(x), self.in_proj_b(x), self.in_proj_a(x)
        T, H = x.shape[0], self.num_k_heads
        group_v = self.num_v_heads // H * self.head_v_dim
        qkvz = self.in_proj_qkvz(x).view(T, H, -1)
        q, k, v, z = qkvz.split([self.head_k_dim, self.head_k_dim, group_v, group_v], dim=-1)
        b, a = self.in_proj_ba(x).view(T, H, -1).chunk(2, dim=-1)
        return tuple(t.reshape(T, -1) for t in (q, k, v, z, b, a))

    def forward(
        self, hidden_states: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        T = hidden_states.shape[0]
        cache = batch.caches[self.layer_idx]
        q, k, v, z, b, a = self._split_projections(hidden_states)
        mixed = short_conv_step(
            torch.cat([q, k, v], dim=-1), self.conv1d.weight.squeeze(1), cache, batch
        )
        q, k, v = mixed.split([q.shape[-1], k.shape[-1], v.shape[-1]], dim=-1)
        q = q.reshape(T, self.num_k_heads, self.head_k_dim)
        k = k.reshape(T, self.num_k_heads, self.head_k_dim)
        v = v.reshape(T, self.num_v_heads, self.head_v_dim)
        g, beta = gdn_gates(a, b, self.A_log, self.dt_bias)
        o = delta_rule_step(
            chunk_gated_delta_rule, recurrent_gated_delta_rule, q, k, v, g, beta, cache, batch
        )
        o = self.norm(o, z.view(T, self.num_v_heads, self.head_v_dim))
        return self.out_proj(o.reshape(T, -1))
