"""Mixture-of-experts routing (as transformers' routers) and experts, the definition. Unlike
`torch.topk`, exact ties go to the lowest expert (group) index, whatever the batch size."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def stable_topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., E] -> (values, indices [..., k]), descending; ties by ascending index."""
    values, indices = torch.sort(x, dim=-1, descending=True, stable=True)
    return values[..., :k], indices[..., :k]


def group_limited_mask(
    scores_for_choice: torch.Tensor, n_group: int, topk_group: int
) -> torch.Tensor:
    """[T, E] -> [T, E] bool: experts in the best `topk_group` groups (a group's score: the sum of
    its two best, as DeepSeek-V3)."""
    T, E = scores_for_choice.shape
    grouped = scores_for_choice.view(T, n_group, E // n_group)
    top2 = stable_topk(grouped, min(2, E // n_group))[0]
    _, group_ids = stable_topk(top2.sum(dim=-1), topk_group)
    group_mask = torch.zeros(T, n_group, dtype=torch.bool, device=scores_for_choice.device)
    group_mask.scatter_(1, group_ids, True)
    return group_mask.unsqueeze(-1).expand(T, n_group, E // n_group).reshape(T, E)


def route_sigmoid(
    router_logits: torch.Tensor,
    correction_bias: torch.Tensor | None,
    top_k: int,
    n_group: int = 1,
    topk_group: int = 1,
    norm_topk_prob: bool = True,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sigmoid grouped top-k (DeepSeek-V3): the bias [E] picks, the unbiased scores weigh.
    router_logits [T, E] float32 -> (topk_weights [T, top_k] float32, topk_ids [T, top_k])."""
    # float64: the fp32 sigmoid's vectorised and tail elements differ in the last bits (ties).
    scores = router_logits.double().sigmoid().float()
    choice = scores if correction_bias is None else scores + correction_bias.float()
    if n_group > 1:
        eligible = group_limited_mask(choice, n_group, topk_group)
        choice = choice.masked_fill(~eligible, float("-inf"))
    _, topk_ids = stable_topk(choice, top_k)
    weights = scores.gather(1, topk_ids)
    if norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * routed_scaling_factor, topk_ids


def route_softmax(
    router_logits: torch.Tensor, top_k: int, norm_topk_prob: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax top-k (Qwen3-Next): router_logits [T, E] -> (weights [T, top_k], ids [T, top_k])."""
    # Select on the logits (softmax is monotonic) so exact ties stay exact whatever the batch.
    _, topk_ids = stable_topk(router_logits, top_k)
    probs = F.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights = probs.gather(1, topk_ids)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(router_logits.dtype), topk_ids


def moe_experts(
    hidden_states: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """SwiGLU experts summed in ascending expert order: hidden_states [T, D], gate_up_proj
    [E, 2I, D] (gate | up), down_proj [E, D, I], topk_weights / topk_ids [T, k] -> [T, D]."""
    out = torch.zeros_like(hidden_states)
    for e in torch.unique(topk_ids).tolist():
        token_idx, slot = torch.nonzero(topk_ids == e, as_tuple=True)
        x = hidden_states.index_select(0, token_idx)
        gate, up = F.linear(x, gate_up_proj[e]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, down_proj[e])
        y = y * topk_weights[token_idx, slot].unsqueeze(-1)
        out.index_add_(0, token_idx, y.to(out.dtype))
    return out


def route_sqrt_softplus(
    router_logits: torch.Tensor,
    correction_bias: torch.Tensor | None,
    top_k: int,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """sqrt(softplus), bias-corrected top-k (DeepSeek-V4); shapes as `route_sigmoid`."""
    scores = F.softplus(router_logits.float()).sqrt()
    choice = scores if correction_bias is None else scores + correction_bias.float()
    _, topk_ids = stable_topk(choice, top_k)
    return _renormalised(scores, topk_ids, routed_scaling_factor), topk_ids


def route_hash(
    router_logits: torch.Tensor,
    token_ids: torch.Tensor,
    tid2eid: torch.Tensor,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V4 hash routing: token_ids [T] pick experts from tid2eid [V, top_k]."""
    scores = F.softplus(router_logits.float()).sqrt()
    topk_ids = tid2eid[token_ids].long()
    return _renormalised(scores, topk_ids, routed_scaling_factor), topk_ids


def _renormalised(scores: torch.Tensor, topk_ids: torch.Tensor, scaling: float) -> torch.Tensor:
    weights = scores.gather(1, topk_ids)
    return weights / (weights.sum(dim=-1, keepdim=True) + 1e-20) * scaling
