"""The encoder budget of one scheduler step (vLLM's `max_num_encoder_input_tokens`), plain
Python: a chunk that reaches an image not encoded yet pays the image's placeholder rows from
the step's budget; when they do not fit, the chunk is cut before the image (the image is
encoded whole, in a later step), so a step never encodes more than the budget and text-only
requests beside it are scheduled as usual.

    computed c        image (not cached, 6 rows)      chunk end
    |-----------------[IIIIII]------------------------)    budget 4: cut to [c, image offset)
"""

from __future__ import annotations

from collections.abc import Callable

from hyla.multimodal.spans import spans_in
from hyla.request import Request


class EncoderBudget:
    """Args:
    max_tokens: placeholder rows the encoder may produce per step.
    is_cached: whether an image hash's rows are in the encoder cache (no encoding needed).
    """

    def __init__(self, max_tokens: int, is_cached: Callable[[str], bool]) -> None:
        self.max_tokens = max_tokens
        self.is_cached = is_cached
        self.remaining = max_tokens
        self._planned: set[str] = set()

    def reset(self) -> None:
        """A new step: the full budget, nothing planned."""
        self.remaining = self.max_tokens
        self._planned.clear()

    def fit(self, req: Request, num_new_tokens: int) -> int:
        """How many of `num_new_tokens` (from `req.num_computed_tokens`) this step can compute:
        every image they reach is paid for (once per step and hash) or the chunk stops before
        it; 0 when the first unpaid image starts before the chunk (a prefix hit inside it)."""
        start = req.num_computed_tokens
        for span in spans_in(req.mm_spans, start, start + num_new_tokens):
            if self.is_cached(span.hash) or span.hash in self._planned:
                continue
            if span.length > self.remaining:
                return max(0, span.offset - start)
            self.remaining -= span.length
            self._planned.add(span.hash)
        return num_new_tokens
