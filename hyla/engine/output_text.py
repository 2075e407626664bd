"""The text of a request's completions made in the front end from their token ids, when the
engine core runs in a process of its own (`hyla.engine.core_process`).

Detokenizing 64 streams is ~1 ms of the core's host time per decode step on the H200's host:
time the GPU waits for. So a request whose stop decisions need no text (no stop strings; stop
ids, EOS and lengths are decided on ids) reaches the core with `detokenize=False`, and its
outputs get their text here, on the front end's own interpreter, from the same
`IncrementalDetokenizer` the core would have run: the same text, piece by piece.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hyla.engine.detokenizer import IncrementalDetokenizer
from hyla.request import RequestOutput, RequestOutputKind, SamplingParams


def front_detokenized(params: Any, tokenizer: Any) -> SamplingParams | None:
    """`params` with `detokenize=False` for the core when the front end can make its text, else
    None (the core makes it): stop strings, best_of (its completions are re-ranked at the end)
    and requests that want no text stay in the core."""
    if tokenizer is None or not isinstance(params, SamplingParams) or not params.detokenize:
        return None
    if params.stop or params.num_sequences != params.n:
        return None
    return dataclasses.replace(params, detokenize=False)


class OutputText:
    """Fills `text` of one request's outputs, in arrival order (`fill` each before it is
    queued: a DELTA consumer that fell behind merges the filled pieces)."""

    def __init__(self, tokenizer: Any, params: SamplingParams) -> None:
        self.tokenizer = tokenizer
        self.params = params
        self.is_delta = params.output_kind is RequestOutputKind.DELTA
        self._detokenizers: dict[int, IncrementalDetokenizer] = {}  # by completion index
        self._num_fed: dict[int, int] = {}  # token ids of each completion seen so far

    def fill(self, output: RequestOutput) -> None:
        for c in output.outputs:
            detok = self._detokenizers.get(c.index)
            if detok is None:
                detok = IncrementalDetokenizer(self.tokenizer, output.prompt_token_ids, self.params)
                self._detokenizers[c.index] = detok
            fed = self._num_fed.get(c.index, 0)
            new = list(c.token_ids) if self.is_delta else list(c.token_ids[fed:])
            self._num_fed[c.index] = fed + len(new)
            if new and self._ended_by_its_token(c):
                new.pop()  # as the core: a stop token's text is not part of the output
            before = len(detok.text)
            detok.update(new)
            c.text = detok.text[before:] if self.is_delta else detok.text

    def _ended_by_its_token(self, c: Any) -> bool:
        """The last token ended the completion (EOS or a stop id: no stop strings here)."""
        return c.finish_reason == "stop" and not self.params.include_stop_str_in_output
