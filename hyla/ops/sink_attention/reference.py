"""DeepSeek-V4's attention (transformers' `DeepseekV4Attention` with eager attention), readable
PyTorch over one sequence: shared-KV multi-query attention (one head read as keys and values)
over a sliding window of the sequence's own tokens plus compressed entries, with a learned
per-head "sink" logit that takes probability mass but contributes no value (gpt-oss's sinks).

    query at position p reads   tokens j with p - W < j <= p          (sliding window W)
                                entries w it may see (`selected`, or all w < (p + 1) // m)
    probs = softmax([q.k_1 .. q.k_n] * scale ++ [sink_h]) without its last column
"""

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
    """Attention of one sequence's queries.

    Args:
        q: [T, H, D]; kv: [S, D] the sequence's tokens 0..S-1 (keys = values); entries: [E, D]
        compressed entries, or None (a sliding-only layer); positions: [T] int64 (< S);
        sinks: [H] float32; window: W; ratio: m (entries visible once their window closed);
        selected: [T, k] int64 entry indices (-1: none) that replace "every visible entry"
        (CSA's indexer top-k), or None.
    Returns: [T, H, D] float32.
    """
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
