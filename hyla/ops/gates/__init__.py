"""Fused gates of the delta-rule mixers: g (log-space decay, fp32) and beta = sigmoid(b)
(`reference.py`); CUDA tensors outside autograd take the Triton kernels."""

from __future__ import annotations

import torch

from hyla.ops.gates import reference
from hyla.ops.gpu import needs_grad, use_triton

__all__ = ["gdn_gates", "kda_gates", "kda_gates_bounded"]


def _use_kernel(*tensors: torch.Tensor) -> bool:
    return use_triton(tensors[0]) and not needs_grad(*tensors)


def kda_gates(
    f_b_out: torch.Tensor, dt_bias: torch.Tensor, A_log: torch.Tensor, b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """KDA's forget gate and beta (`reference.kda_gates`)."""
    if _use_kernel(f_b_out, dt_bias, A_log, b):
        from hyla.ops.gates import kernels

        return kernels.kda_gates(f_b_out, dt_bias, A_log, b)
    return reference.kda_gates(f_b_out, dt_bias, A_log, b)


def kda_gates_bounded(
    f_b_out: torch.Tensor,
    dt_bias: torch.Tensor,
    A_log: torch.Tensor,
    b: torch.Tensor,
    lower_bound: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`kda_gates` with the lower-bounded decay (`reference.kda_log_decay_bounded`)."""
    if _use_kernel(f_b_out, dt_bias, A_log, b):
        from hyla.ops.gates import kernels

        return kernels.kda_gates(f_b_out, dt_bias, A_log, b, lower_bound)
    return reference.kda_log_decay_bounded(f_b_out, dt_bias, A_log, lower_bound), b.sigmoid()


def gdn_gates(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated DeltaNet's decay and beta (`reference.gdn_gates`)."""
    if _use_kernel(a, b, A_log, dt_bias):
        from hyla.ops.gates import kernels

        return kernels.gdn_gates(a, b, A_log, dt_bias)
    return reference.gdn_gates(a, b, A_log, dt_bias)
