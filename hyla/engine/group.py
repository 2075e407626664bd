"""A user request as the engine tracks it: n (or best_of) sequences sharing one prompt, each a
scheduler `Request` plus its detokenizer, logprobs and generator; DELTA outputs cost O(new)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from hyla.engine.detokenizer import IncrementalDetokenizer
from hyla.request import (
    CompletionOutput,
    Request,
    RequestMetrics,
    RequestOutput,
    RequestOutputKind,
    RequestStatus,
    SamplingParams,
)

_WITH_REASON = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_ERROR)


def sequence_id(request_id: str, index: int) -> str:
    return f"{request_id}#{index}"


@dataclass
class Sequence:
    index: int
    request: Request
    detokenizer: IncrementalDetokenizer
    generator: torch.Generator | None = None
    logprobs: list[dict[int, float]] | None = None
    cumulative_logprob: float = 0.0
    sampling_row: Any = None
    grammar: Any = None  # `hyla.structured.backend.GrammarState`
    num_sent_tokens: int = 0
    num_sent_chars: int = 0
    sent_finish: bool = False

    @property
    def is_finished(self) -> bool:
        return self.request.is_finished

    def completion(self, index: int) -> CompletionOutput:
        req = self.request
        finished = req.is_finished
        return CompletionOutput(
            index=index,
            text=self.detokenizer.visible_text(finished),
            token_ids=list(req.output_token_ids),
            logprobs=None if self.logprobs is None else list(self.logprobs),
            cumulative_logprob=self.cumulative_logprob,
            finish_reason=req.status.finish_reason,
            stop_reason=req.stop_reason if req.status in _WITH_REASON else None,
        )

    def delta(self, index: int) -> CompletionOutput | None:
        req = self.request
        finished = req.is_finished
        end = self.detokenizer.visible_len(finished)
        text = self.detokenizer.text[self.num_sent_chars : end]
        ids = req.output_token_ids[self.num_sent_tokens :]
        finish = finished and not self.sent_finish
        if not (text or ids or finish):
            return None
        logprobs = None if self.logprobs is None else self.logprobs[self.num_sent_tokens :]
        self.num_sent_chars = max(end, self.num_sent_chars)
        self.num_sent_tokens = len(req.output_token_ids)
        self.sent_finish = finished
        return CompletionOutput(
            index=index,
            text=text,
            token_ids=ids,
            logprobs=logprobs,
            cumulative_logprob=self.cumulative_logprob,
            finish_reason=req.status.finish_reason,
            stop_reason=req.stop_reason if req.status in _WITH_REASON else None,
        )


@dataclass
class RequestGroup:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    metrics: RequestMetrics
    sequences: list[Sequence] = field(default_factory=list)
    prompt_logprobs: list[dict[int, float] | None] | None = None
    has_output: bool = False

    @property
    def is_finished(self) -> bool:
        return all(s.is_finished for s in self.sequences)

    def next_prompt_logprob_position(self) -> int | None:
        if self.prompt_logprobs is None:
            return None
        pos = len(self.prompt_logprobs) - 1
        return pos if pos < len(self.prompt_token_ids) - 1 else None

    def output(self) -> RequestOutput | None:
        """This step's output; None for a DELTA with nothing new."""
        seqs = self.sequences
        if self.params.num_sequences > self.params.n:
            seqs = sorted(seqs, key=_rank)[: self.params.n]
        plp = self.prompt_logprobs
        if self.params.output_kind is RequestOutputKind.DELTA:
            outputs = [c for i, s in enumerate(seqs) if (c := s.delta(i)) is not None]
            if not outputs:
                return None
            plp = None if self.has_output else plp
        else:
            outputs = [s.completion(i) for i, s in enumerate(seqs)]
        self.has_output = True
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,  # shared: a copy is O(prompt) a step
            prompt_logprobs=None if plp is None else list(plp),
            outputs=outputs,
            finished=self.is_finished,
            metrics=self.metrics,
            num_cached_tokens=self.sequences[0].request.num_cached_tokens,
        )

    def wants_stream_output(self) -> bool:
        final_only = self.params.output_kind is RequestOutputKind.FINAL_ONLY
        buffered = final_only or self.params.num_sequences > self.params.n
        return not buffered or self.is_finished


def _rank(seq: Sequence) -> tuple[bool, float]:
    # A sequence without a token has logprob 0: it must not win and look unstarted.
    return (not seq.request.output_token_ids, -seq.cumulative_logprob)


def new_group(
    request_id: str,
    prompt: str | None,
    prompt_token_ids: list[int],
    params: SamplingParams,
    requests: list[Request],
    tokenizer: Any,
    generators: list[torch.Generator | None],
) -> RequestGroup:
    group = RequestGroup(
        request_id=request_id,
        prompt=prompt,
        prompt_token_ids=list(prompt_token_ids),
        params=params,
        metrics=RequestMetrics(arrival_time=requests[0].arrival_time),
        prompt_logprobs=None if params.prompt_logprobs is None else [None],
    )
    for k, (req, gen) in enumerate(zip(requests, generators, strict=True)):
        group.sequences.append(
            Sequence(
                index=k,
                request=req,
                detokenizer=IncrementalDetokenizer(
                    tokenizer if params.detokenize else None, prompt_token_ids, params),
                generator=gen,
                logprobs=None if params.logprobs is None else [],
            )
        )
    return group
