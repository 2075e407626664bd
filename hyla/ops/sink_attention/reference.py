"""DeepSeek-V4's attention (transformers' `DeepseekV4Attention`, eager) over one sequence:
shared-KV MQA over a sliding window plus compressed entries, with per-head sink logits
(gpt-oss's) that take probability mass but add no value."""

from __future__ import annotations

import torch

from hyla.ops.kv_compress.reference import visible_entries


def sink_window_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    entries: torch.Tensor | None,
    positions: torch.Tensor,
    sinks: torch.Tensor,
    scale: float,
    window: int,
    ratio: int = 1,
    selected: torch.Tensor | None = None,
) -> torch.Tensor:
    """Position p reads tokens p - W < j <= p and its visible entries. q: [T, H, D]; kv: [S, D]
    (keys = values); entries: [E, D] or None; selected: [T, k] entry indices (-1: none) replacing
    "all visible" (CSA's top-k). Returns [T, H, D] fp32."""
    keys = kv.float()
    token = torch.arange(kv.shape[0], device=q.device)
    mask = (token[None, :] <= positions[:, None]) & (token[None, :] > positions[:, None] - window)
    if entries is not None and entries.shape[0]:
        keys = torch.cat([keys, entries.float()])
        entry = torch.arange(entries.shape[0], device=q.device)
        if selected is None:
            seen = entry[None, :] < visible_entries(positions, ratio)[:, None]
        else:
            seen = torch.zeros(q.shape[0], entries.shape[0] + 1, dtype=torch.bool, device=q.device)
            seen.scatter_(1, torch.where(selected >= 0, selected, entries.shape[0]), True)
            seen = seen[:, :-1]
        mask = torch.cat([mask, seen], dim=1)
    logits = torch.einsum("thd,sd->ths", q.float(), keys) * scale
    logits = logits.masked_fill(~mask[:, None, :], float("-inf"))
    sink = sinks.float()[None, :, None].expand(q.shape[0], -1, 1)
    probs = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
    return torch.einsum("ths,sd->thd", probs, keys)
