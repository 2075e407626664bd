"""Manifold-constrained hyper-connections (transformers `Glm5NextTextHyperConnection`): N streams
per token; comb is made doubly stochastic (Sinkhorn) so their norm cannot grow through depth."""

from __future__ import annotations

import torch

from hyla.ops.norm.reference import rms_norm


def hc_weights(
    streams: torch.Tensor,
    fn: torch.Tensor,
    base: torch.Tensor,
    scale: torch.Tensor,
    hc_eps: float,
    sinkhorn_iters: int,
    norm_eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mixing weights of one hyper-connection. streams: [T, N, D]; fn: [(2 + N) N, N D];
    base: [(2 + N) N]; scale: [3] (pre, post, comb). Returns fp32 (pre, post, comb)."""
    num_streams = streams.shape[1]
    flat = streams.flatten(1).float()
    flat = flat * torch.rsqrt(flat.square().mean(-1, keepdim=True) + norm_eps)
    mixed = flat @ fn.float().t()
    n = num_streams
    pre_w, post_w, comb_w = mixed.split([n, n, n * n], dim=-1)
    pre_b, post_b, comb_b = base.float().split([n, n, n * n])
    pre_s, post_s, comb_s = scale.float().unbind(0)
    pre = torch.sigmoid(pre_w * pre_s + pre_b) + hc_eps
    post = 2 * torch.sigmoid(post_w * post_s + post_b)
    logits = comb_w.view(-1, n, n) * comb_s + comb_b.view(n, n)
    comb = sinkhorn(torch.softmax(logits, dim=-1) + hc_eps, sinkhorn_iters, hc_eps)
    return pre, post, comb


def sinkhorn(comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """Sinkhorn-Knopp on [..., N, N], columns first (transformers' order)."""
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return comb


def hc_collapse(streams: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    return (pre.unsqueeze(-1) * streams).sum(dim=1).to(streams.dtype)


def hc_expand(
    block_out: torch.Tensor, streams: torch.Tensor, post: torch.Tensor, comb: torch.Tensor
) -> torch.Tensor:
    """block_out [T, D], streams [T, N, D], post [T, N], comb [T, N, N] -> [T, N, D]."""
    dtype = streams.dtype
    spread = post.to(dtype).unsqueeze(-1) * block_out.unsqueeze(-2)
    return spread + comb.to(dtype).transpose(-1, -2) @ streams


def hc_pre_norm(
    streams: torch.Tensor,
    fn: torch.Tensor,
    base: torch.Tensor,
    scale: torch.Tensor,
    hc_eps: float,
    sinkhorn_iters: int,
    norm_eps: float,
    norm_weight: torch.Tensor,
    rms_eps: float,
    offset: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`hc_weights`, `hc_collapse`, then the block's RMSNorm -> (x [T, D], post, comb)."""
    pre, post, comb = hc_weights(streams, fn, base, scale, hc_eps, sinkhorn_iters, norm_eps)
    x = hc_collapse(streams, pre)
    return rms_norm(x, norm_weight, rms_eps, offset), post, comb


def hc_head_weights(
    streams: torch.Tensor,
    fn: torch.Tensor,
    base: torch.Tensor,
    scale: torch.Tensor,
    hc_eps: float,
    norm_eps: float,
) -> torch.Tensor:
    """DeepSeek-V4 final collapse weights (`DeepseekV4HyperHead`). streams: [T, N, D];
    fn: [N, N D]; base: [N]; scale: [1]. Returns pre [T, N] fp32."""
    flat = streams.flatten(1).float()
    flat = flat * torch.rsqrt(flat.square().mean(-1, keepdim=True) + norm_eps)
    return torch.sigmoid(flat @ fn.float().t() * scale.float() + base.float()) + hc_eps
