"""DeepSeek-V4's KV compression (paper section 2.3; transformers' `DeepseekV4CSACompressor`,
`DeepseekV4HCACompressor`, `DeepseekV4Indexer`) over one sequence: each window of m = `ratio`
tokens pools into one entry, final once its window closes (a query at p reads w < (p + 1) // m)."""

from __future__ import annotations

import torch


def compress_kv(
    kv: torch.Tensor, gate: torch.Tensor, position_bias: torch.Tensor, ratio: int, overlap: bool
) -> torch.Tensor:
    """Pooled entries [T // m, D] fp32 of complete windows. kv, gate: [T, C]; with `overlap`
    (CSA), C = 2 D and entry w pools window w-1's [:D] and window w's [D:] channels."""
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
        kv = torch.cat([prev_kv, kv[..., width:]], dim=1)
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
    """CSA lightning indexer: each query's best `topk` visible entries. q: [T, Hi, Di]; weights:
    [T, Hi] (pre-scaled by Hi^-0.5); keys: [E, Di]. Returns [T, topk] int64, best first (ties:
    lower index), -1 past the visible entries."""
    scores = torch.relu(torch.einsum("thd,sd->ths", q.float(), keys.float())) * softmax_scale
    scores = (scores * weights.float()[..., None]).sum(dim=1)
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
