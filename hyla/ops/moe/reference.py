"""Mixture-of-experts routing and expert computation, readable PyTorch (the definition).

Routing follows the Hugging Face routers of each family:
  - sigmoid + correction bias + grouped top-k: DeepSeek-V3 report section 2.1.2 ("auxiliary-loss-
    free load balancing"), `DeepseekV32TopkRouter` / `KimiLinearTopkRouter` in transformers;
  - softmax top-k: `Qwen3NextTopKRouter` in transformers.
Unlike `torch.topk`, every selection here is deterministic on exact ties: the lowest expert index
wins (for groups, the lowest group index), independent of the batch size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def stable_topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k along the last dim; equal values are ordered by ascending index.

    Args:
        x: [..., E] float (may hold -inf).
        k: number of entries to keep, 1 <= k <= E.
    Returns: (values [..., k], indices [..., k] int64), sorted by descending value.
    """
    values, indices = torch.sort(x, dim=-1, descending=True, stable=True)
    return values[..., :k], indices[..., :k]


def group_limited_mask(
    scores_for_choice: torch.Tensor, n_group: int, topk_group: int
) -> torch.Tensor:
    """Which experts stay eligible after keeping the best `topk_group` of `n_group` groups.

    A group's score is the sum of its two best biased scores (DeepSeek-V3; one score when a group
    holds a single expert).

    Args:
        scores_for_choice: [T, E] float32 biased scores.
    Returns: [T, E] bool, True for experts in a selected group.
    """
    T, E = scores_for_choice.shape
    grouped = scores_for_choice.view(T, n_group, E // n_group)
    top2 = stable_topk(grouped, min(2, E // n_group))[0]  # [T, G, 2]
    _, group_ids = stable_topk(top2.sum(dim=-1), topk_group)  # [T, topk_group]
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
    """Sigmoid scoring, bias-corrected grouped top-k (DeepSeek-V3 / Kimi-Linear).

    The bias only decides *which* experts are chosen; the weights come from the unbiased sigmoid
    scores, renormalised over the chosen k (plus 1e-20, as the reference) when `norm_topk_prob`,
    then multiplied by `routed_scaling_factor`. Experts outside the selected groups are masked
    with -inf, so they lose even when every biased score is negative.

    Args:
        router_logits: [T, E] float32.
        correction_bias: [E] float32 `e_score_correction_bias`, or None.
        top_k: experts per token.
    Returns: (topk_weights [T, top_k] float32, topk_ids [T, top_k] int64).
    """
    # float64 then round: the fp32 sigmoid kernel gives vectorised and tail elements different
    # last bits, which would break exact ties differently depending on the batch size.
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
    """Softmax scoring, plain top-k (Qwen3-Next `Qwen3NextTopKRouter`).

    Args:
        router_logits: [T, E] any float dtype; the softmax runs in float32.
    Returns: (topk_weights [T, top_k] in router_logits' dtype, topk_ids [T, top_k] int64).
    """
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
    """Weighted sum of the chosen SwiGLU experts, one expert at a time.

    For token t: `sum_j w[t, j] * down_e(silu(gate_e(x_t)) * up_e(x_t))` with `e = topk_ids[t, j]`.
    Experts are visited in ascending index order, so each token's sum is accumulated in a fixed
    order that does not depend on its batch neighbours.

    Args:
        hidden_states: [T, D].
        gate_up_proj: [E, 2 * I, D] (gate rows first, then up rows).
        down_proj: [E, D, I].
        topk_weights: [T, k] (float32 or the hidden dtype).
        topk_ids: [T, k] int64 in [0, E).
    Returns: [T, D] in hidden_states' dtype.
    """
    out = torch.zeros_like(hidden_states)
    for e in torch.unique(topk_ids).tolist():
        token_idx, slot = torch.nonzero(topk_ids == e, as_tuple=True)
        x = hidden_states.index_select(0, token_idx)  # [n, D]
        gate, up = F.linear(x, gate_up_proj[e]).chunk(2, dim=-1)  # [n, I] each
        y = F.linear(F.silu(gate) * up, down_proj[e])  # [n, D]
        y = y * topk_weights[token_idx, slot].unsqueeze(-1)
        out.index_add_(0, token_idx, y.to(out.dtype))
    return out


def route_sqrt_softplus(
    router_logits: torch.Tensor,
    correction_bias: torch.Tensor | None,
    top_k: int,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """sqrt(softplus) scoring, bias-corrected plain top-k (DeepSeek-V4 `DeepseekV4TopKRouter`):
    the bias picks the experts, the unbiased scores renormalised over them (plus 1e-20) and
    times `routed_scaling_factor` weight them.

    Args:
        router_logits: [T, E] float32; correction_bias: [E] float32 or None.
    Returns: (topk_weights [T, top_k] float32, topk_ids [T, top_k] int64).
    """
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
    """Hash routing (DeepSeek-V4 `DeepseekV4HashRouter`): a frozen token-id -> experts table
    picks the experts, the sqrt(softplus) scores weight them as in `route_sqrt_softplus`.

    Args:
        router_logits: [T, E] float32; token_ids: [T] int64; tid2eid: [V, top_k] int64.
    Returns: (topk_weights [T, top_k] float32, topk_ids [T, top_k] int64).
    """
    scores = F.softplus(router_logits.float()).sqrt()
    topk_ids = tid2eid[token_ids].long()
    return _renormalised(scores, topk_ids, routed_scaling_factor), topk_ids


def _renormalised(scores: torch.Tensor, topk_ids: torch.Tensor, scaling: float) -> torch.Tensor:
    weights = scores.gather(1, topk_ids)
    return weights / (weights.sum(dim=-1, keepdim=True) + 1e-20) * scaling
