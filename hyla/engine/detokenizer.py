"""Incremental detokenization and stop strings. Each step decodes a short window twice (a lone
token breaks multi-byte characters and merged spaces) and keeps the difference, held back while
it ends in U+FFFD; the last `max(len(stop)) - 1` characters are held back until the end.
"""

from __future__ import annotations

from typing import Any

from hyla.request import SamplingParams

INITIAL_WINDOW = 5


class IncrementalDetokenizer:
    """Turns one completion's token ids into text as they arrive; `tokenizer` None: no text."""

    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self.tokenizer = tokenizer
        self.params = params
        self.ids = list(prompt_token_ids[-INITIAL_WINDOW - 1 :])
        self.read_offset = len(self.ids)
        self.prefix_offset = max(self.read_offset - INITIAL_WINDOW, 0)
        self.text = ""
        self.stopped = False
        self.num_tokens = 0
        self._hold = max((len(s) for s in params.stop), default=1) - 1

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.params.skip_special_tokens)

    def _append(self, token_id: int) -> None:
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.text += full[len(prefix) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)

    def update(self, token_ids: list[int]) -> str | None:
        """Append new tokens' text; returns the stop string that matched (text cut there)."""
        if self.tokenizer is None or self.stopped:
            return None
        for token_id in token_ids:
            before = len(self.text)
            self._append(token_id)
            self.num_tokens += 1
            if self.num_tokens < self.params.min_tokens:
                continue
            matched = self._find_stop(before)
            if matched is not None:
                return matched
        return None

    def _find_stop(self, before: int) -> str | None:
        best: tuple[int, str] | None = None
        for s in self.params.stop:
            idx = self.text.find(s, max(0, before - len(s) + 1))
            if idx >= 0 and (best is None or idx < best[0]):
                best = (idx, s)
        if best is None:
            return None
        idx, s = best
        self.text = self.text[: idx + len(s) if self.params.include_stop_str_in_output else idx]
        self.stopped = True
        return s

    def visible_text(self, finished: bool) -> str:
        return self.text[: self.visible_len(finished)]

    def visible_len(self, finished: bool) -> int:
        if finished or self._hold == 0:
            return len(self.text)
        return max(0, len(self.text) - self._hold)
