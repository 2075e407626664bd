"""Completion text made in the front end when the core runs in its own process: detokenizing
there costs host time the GPU waits for, so requests without stop strings skip it in the core."""

from __future__ import annotations

import dataclasses
from typing import Any

from hyla.engine.detokenizer import IncrementalDetokenizer
from hyla.request import RequestOutput, RequestOutputKind, SamplingParams


def front_detokenized(params: Any, tokenizer: Any) -> SamplingParams | None:
    """`params` with `detokenize=False` for the core, or None when the core makes the text."""
    if tokenizer is None or not isinstance(params, SamplingParams) or not params.detokenize:
        return None
    if params.stop or params.num_sequences != params.n:
        return None
    return dataclasses.replace(params, detokenize=False)


class OutputText:
    """Fills `text` of one request's outputs, in arrival order, before each is queued."""

    def __init__(self, tokenizer: Any, params: SamplingParams) -> None:
        self.tokenizer = tokenizer
        self.params = params
        self.is_delta = params.output_kind is RequestOutputKind.DELTA
        self._detokenizers: dict[int, IncrementalDetokenizer] = {}
        self._num_fed: dict[int, int] = {}

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
                new.pop()  # as the core: a stop token's text is not output
            before = len(detok.text)
            detok.update(new)
            c.text = detok.text[before:] if self.is_delta else detok.text

    def _ended_by_its_token(self, c: Any) -> bool:
        return c.finish_reason == "stop" and not self.params.include_stop_str_in_output
