"""DeepSeek-V4's KV compression (paper section 2.3; transformers' `DeepseekV4CSACompressor`,
`DeepseekV4HCACompressor`, `DeepseekV4Indexer`), readable PyTorch over one sequence.

Every `ratio` = m source tokens close a window; window w pools its tokens into one entry by a
per-channel softmax over the window's gate logits (plus a learned per-slot `position_bias`):

    entry_w = sum_j softmax_j(gate_j + bias_j) * kv_j          HCA (m = 128): tokens of window w
    entry_w over 2m slots: Ca of window w-1 | Cb of window w     CSA (m = 4): overlapping windows

With `overlap` (CSA) each token projects to 2 x D channels: Ca = [:D] feeds the *next*
window's entry, Cb = [D:] its own; window 0 has no Ca half (weight 0). An entry depends only on
the tokens of its own (and the previous) window, so it can be written once when its window
closes and never changes: a paged cache of entries, one per m tokens.

A query at position p may read entry w only once its window has closed: w < (p + 1) // m.
The CSA indexer ranks those entries (`compressed_indexer_topk`); HCA reads them all.
"""

from __future__ import annotations

import torch


def compress_kv(
    kv: torch.Tensor, gate: torch.Tensor, position_bias: torch.Tensor, ratio: int, overlap: bool
) -> torch.Tensor:
    """The pooled entries of the complete windows of one sequence (before norm and rope).

    Args:
        kv, gate: [T, C] the tokens' projections from position 0; C = D, or 2 D with `overlap`.
        position_bias: [ratio, C] float32, added to the gate of each window slot.
        ratio: m, tokens per window.
        overlap: CSA's two-series windows (entry w over window w-1's Ca and window w's Cb).
    Returns: [T // m, D] float32, entry w for window w.
    """
    num_windows = kv.shape[0] // ratio
    width = kv.shape[1] // 2 if overlap else kv.shape[1]
    channels = kv.shape[1]
    kv = kv[: num_windows * ratio].float().view(num_windows, ratio, channels)
    gate = gate[: num_windows * ratio].float().view(num_windows, ratio, channels)
    gate = gate + position_bias.float()
    if overlap:
        prev_kv = kv.new_zeros(num_windows, ratio, width)
        prev_gate = gate.new_full((num_windows, ratio, width), float("-inf"))
        prev_kv[1:], prev_gate[1:] = kv[:-1, :, :width], gate[:-1, :, :width]
        kv = torch.cat([prev_kv, kv[..., width:]], dim=1)  # [W, 2m, D]
        gate = torch.cat([prev_gate, gate[..., width:]], dim=1)
    return (kv * gate.softmax(dim=1)).sum(dim=1)


def visible_entries(positions: torch.Tensor, ratio: int) -> torch.Tensor:
    """positions [T] int64 -> [T] the number of entries each query may read ((p + 1) // m)."""
    return (positions + 1) // ratio


def compressed_indexer_topk(
    q: torch.Tensor,
    weights: torch.Tensor,
    keys: torch.Tensor,
    positions: torch.Tensor,
    ratio: int,
    topk: int,
    softmax_scale: float,
) -> torch.Tensor:
    """The CSA lightning indexer over compressed keys: each query's best `topk` visible entries.

        score[t, s] = sum_h weights[t, h] * relu(q[t, h] . keys[s]) * softmax_scale

    Args:
        q: [T, Hi, Di] roped indexer queries; weights: [T, Hi] float32 (already scaled by
        Hi^-0.5); keys: [E, Di] the normed, roped compressed indexer keys; positions: [T].
    Returns: [T, topk] int64 entry indices, best first (equal scores: lower index first),
        -1 where a query sees fewer than `topk` entries.
    """
    scores = torch.relu(torch.einsum("thd,sd->ths", q.float(), keys.float())) * softmax_scale
    scores = (scores * weights.float()[..., None]).sum(dim=1)  # [T, E]
    visible = visible_entries(positions, ratio)
    entry = torch.arange(keys.shape[0], device=q.device)
    scores = scores.masked_fill(entry[None, :] >= visible[:, None], float("-inf"))
    out = torch.full((q.shape[0], topk), -1, dtype=torch.long, device=q.device)
    k = min(topk, keys.shape[0])
    if k:
        order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :k]
        valid = torch.arange(k, device=q.device)[None, :] < visible[:, None].clamp(max=k)
        out[:, :k] = torch.where(valid, order, -1)
    return out
