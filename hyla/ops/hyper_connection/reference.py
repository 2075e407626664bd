"""Manifold-constrained hyper-connections (mHC; GLM-5.3-Flash, transformers'
`Glm5NextTextHyperConnection`): N residual streams per token instead of one.

Around each block (mixer or FFN) the N streams [T, N, D] give three per-token weights through
one linear map of their flattened, RMS-normalised values:

    pre  [T, N]     sigmoid(...) + eps           collapses the streams into the block's input
    post [T, N]     2 sigmoid(...)               spreads the block's output over the streams
    comb [T, N, N]  Sinkhorn(softmax(...) + eps) mixes the input streams into the output ones

    x = sum_n pre[n] * streams[n]                        (block input [T, D])
    streams'[m] = post[m] * block(x) + sum_n comb[n, m] * streams[n]

comb is made (nearly) doubly stochastic by alternating column and row normalisation, so the
streams' norm cannot grow through depth. Everything is per token: no state crosses tokens, so
decode keeps only the N streams of the tokens in flight (hidden state, not cache).
"""

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
    """The mixing weights of one hyper-connection.

    Args:
        streams: [T, N, D]; fn: [(2 + N) * N, N * D]; base: [(2 + N) * N] float32;
        scale: [3] float32 (pre, post, comb); hc_eps: floor of pre and comb and of the
        Sinkhorn denominators; sinkhorn_iters: >= 1; norm_eps: the unweighted RMSNorm's eps.
    Returns: (pre [T, N], post [T, N], comb [T, N, N]), float32.
    """
    num_streams = streams.shape[1]
    flat = streams.flatten(1).float()
    flat = flat * torch.rsqrt(flat.square().mean(-1, keepdim=True) + norm_eps)
    mixed = flat @ fn.float().t()  # [T, (2 + N) N]
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
    """Sinkhorn-Knopp on positive [..., N, N]: columns first, then `iters - 1` rounds of rows
    and columns (transformers' order), each sum offset by eps."""
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return comb


def hc_collapse(streams: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """streams [T, N, D], pre [T, N] -> block input [T, D] in streams' dtype."""
    return (pre.unsqueeze(-1) * streams).sum(dim=1).to(streams.dtype)


def hc_expand(
    block_out: torch.Tensor, streams: torch.Tensor, post: torch.Tensor, comb: torch.Tensor
) -> torch.Tensor:
    """block_out [T, D], streams [T, N, D] (the block's input streams), post [T, N],
    comb [T, N, N] -> next streams [T, N, D] in streams' dtype."""
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
    """A block's normed input from its streams: `hc_weights`, `hc_collapse` by pre, then the
    block's RMSNorm (`norm_weight` [D], `rms_eps`, `offset`, as `hyla.ops.norm.rms_norm`).
    Returns (x [T, D] in streams' dtype, post [T, N], comb [T, N, N] float32)."""
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
    """DeepSeek-V4's final collapse weights (`DeepseekV4HyperHead`; GLM-5.3-Flash takes the
    plain mean instead): pre = sigmoid(fn . rmsnorm(flat streams) * scale + base) + eps.

    Args:
        streams: [T, N, D]; fn: [N, N * D]; base: [N]; scale: [1].
    Returns: pre [T, N] float32 (collapse with `hc_collapse`).
    """
    flat = streams.flatten(1).float()
    flat = flat * torch.rsqrt(flat.square().mean(-1, keepdim=True) + norm_eps)
    return torch.sigmoid(flat @ fn.float().t() * scale.float() + base.float()) + hc_eps
