"""The encoder budget of one scheduler step (vLLM's `max_num_encoder_input_tokens`): a chunk
reaching an unencoded image pays its rows or is cut before it (encoded whole later)."""

from __future__ import annotations

from collections.abc import Callable

from hyla.cache.mm_spans import spans_in
from hyla.request import Request


class EncoderBudget:
    """`max_tokens`: placeholder rows per step; `is_cached(hash)`: rows already encoded."""

    def __init__(self, max_tokens: int, is_cached: Callable[[str], bool]) -> None:
        self.max_tokens = max_tokens
        self.is_cached = is_cached
        self.remaining = max_tokens
        self._planned: set[str] = set()

    def reset(self) -> None:
        self.remaining = self.max_tokens
        self._planned.clear()

    def fit(self, req: Request, num_new_tokens: int) -> int:
        """How many of `num_new_tokens` fit: each image reached is paid once per step and hash,
        or the chunk stops before it (0: an unpaid image starts before the chunk)."""
        start = req.num_computed_tokens
        for span in spans_in(req.mm_spans, start, start + num_new_tokens):
            if self.is_cached(span.hash) or span.hash in self._planned:
                continue
            if span.length > self.remaining:
                return max(0, span.offset - start)
            self.remaining -= span.length
            self._planned.add(span.hash)
        return num_new_tokens
