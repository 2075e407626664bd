"""Forget gate g (log-space decay) and write strength beta of the delta-rule mixers, as in the
source models: KDA (Kimi-Linear `KimiDeltaAttention`), bounded KDA (`Glm5NextTextForgetGate`)
and Gated DeltaNet (`Qwen3NextGatedDeltaNet`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def kda_log_decay(
    f_b_out: torch.Tensor, dt_bias: torch.Tensor, A_log: torch.Tensor
) -> torch.Tensor:
    """f_b_out [T, HV*K], dt_bias [HV*K], A_log: HV elements -> g [T, HV, K] fp32."""
    num_heads = A_log.numel()
    raw = f_b_out.float() + dt_bias.float()
    raw = raw.view(f_b_out.shape[0], num_heads, -1)
    # log(1 + exp(x)), not log1p: rounds as KimiLinearForgetGate does
    softplus = torch.where(raw > 20.0, raw, torch.log(1.0 + torch.exp(raw)))
    return -A_log.float().view(num_heads, 1).exp() * softplus


def kda_gates(
    f_b_out: torch.Tensor, dt_bias: torch.Tensor, A_log: torch.Tensor, b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return kda_log_decay(f_b_out, dt_bias, A_log), b.sigmoid()


def kda_log_decay_bounded(
    f_b_out: torch.Tensor, dt_bias: torch.Tensor, A_log: torch.Tensor, lower_bound: float
) -> torch.Tensor:
    """`kda_log_decay` kept in (lower_bound, 0): lb * sigmoid(exp(A_log) * raw)."""
    num_heads = A_log.numel()
    raw = (f_b_out.float() + dt_bias.float()).view(f_b_out.shape[0], num_heads, -1)
    return lower_bound * torch.sigmoid(A_log.float().view(num_heads, 1).exp() * raw)


def gdn_gates(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """a, b [T, HV], A_log, dt_bias [HV] -> (g [T, HV] fp32, beta [T, HV] in b's dtype)."""
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias)
    return g, b.sigmoid()
