"""N-gram prompt lookup (plain Python): propose the tokens that followed the latest earlier
occurrence of the sequence's last n tokens, longest n first."""

from __future__ import annotations

from collections.abc import Sequence


def propose_ngram(token_ids: Sequence[int], num_drafts: int, min_n: int, max_n: int) -> list[int]:
    """Up to `num_drafts` drafts from the longest `min_n`..`max_n`-gram seen before, or none."""
    total = len(token_ids)
    if num_drafts <= 0:
        return []
    reverse = list(token_ids)[::-1]
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        start = _latest_match(token_ids, reverse, n)
        if start is not None:
            return list(token_ids[start + n : start + n + num_drafts])
    return []


def _latest_match(token_ids: Sequence[int], reverse: list[int], n: int) -> int | None:
    """Start of the latest earlier occurrence of the last `n` tokens (`list.index`: C speed)."""
    total = len(token_ids)
    tail = list(token_ids[total - n :])
    r = 0
    while True:
        try:
            r = reverse.index(tail[-1], r + 1, total - n + 1)  # `end` = total - 1 - r >= n - 1
        except ValueError:
            return None
        end = total - 1 - r
        if list(token_ids[end - n + 1 : end + 1]) == tail:
            return end - n + 1
