"""The forget gate g (log-space decay) and the write strength beta of the delta-rule mixers,
as the PyTorch expressions of the source models. `kernels.py` fuses each pair into one Triton
kernel with the same numerics; these stay the definition (and the CPU / autograd path).

    KDA (Kimi-Linear `KimiDeltaAttention`, fla's kda gate), per channel:
        raw = float(f_b(f_a(x))) + float(dt_bias)                  [T, HV*K]
        g = -exp(A_log) * (raw if raw > 20 else log(1 + exp(raw)))   [T, HV, K]
    KDA with a lower bound lb < 0 (GLM-5.3-Flash `linear_lower_bound`, fla's safe gate):
        g = lb * sigmoid(exp(A_log) * raw)                           [T, HV, K]
    Gated DeltaNet (Qwen3-Next `Qwen3NextGatedDeltaNet`), per head:
        g = -exp(A_log) * softplus(float(a) + float(dt_bias))        [T, HV]
    both: beta = sigmoid(b) in b's dtype                              [T, HV]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def kda_log_decay(
    f_b_out: torch.Tensor, dt_bias: torch.Tensor, A_log: torch.Tensor
) -> torch.Tensor:
    """f_b_out [T, HV*K] (any float dtype), dt_bias [HV*K], A_log [HV] (any shape of HV
    elements, e.g. the stored [1, 1, HV, 1]) -> g [T, HV, K] fp32."""
    num_heads = A_log.numel()
    raw = f_b_out.float() + dt_bias.float()
    raw = raw.view(f_b_out.shape[0], num_heads, -1)  # [T, HV, K]
    # log(1 + exp(x)) rather than log1p, rounding exactly as KimiLinearForgetGate does
    softplus = torch.where(raw > 20.0, raw, torch.log(1.0 + torch.exp(raw)))
    return -A_log.float().view(num_heads, 1).exp() * softplus


def kda_gates(
    f_b_out: torch.Tensor, dt_bias: torch.Tensor, A_log: torch.Tensor, b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(`kda_log_decay` [T, HV, K] fp32, sigmoid(b) [T, HV] in b's dtype)."""
    return kda_log_decay(f_b_out, dt_bias, A_log), b.sigmoid()


def kda_log_decay_bounded(
    f_b_out: torch.Tensor, dt_bias: torch.Tensor, A_log: torch.Tensor, lower_bound: float
) -> torch.Tensor:
    """`kda_log_decay` with the decay kept in (lower_bound, 0): lb * sigmoid(exp(A_log) * raw)
    (transformers' `Glm5NextTextForgetGate`) -> g [T, HV, K] fp32."""
    num_heads = A_log.numel()
    raw = (f_b_out.float() + dt_bias.float()).view(f_b_out.shape[0], num_heads, -1)
    return lower_bound * torch.sigmoid(A_log.float().view(num_heads, 1).exp() * raw)


def gdn_gates(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """a, b [T, HV] (any float dtype), A_log, dt_bias [HV] -> (g [T, HV] fp32, beta [T, HV] in
    b's dtype). F.softplus: x if x > 20 else log1p(exp(x))."""
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias)
    return g, b.sigmoid()
