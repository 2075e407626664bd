"""A request's admission checks and the `RequestGroup` it becomes (ids, grammars, generators)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from hyla.engine.group import RequestGroup, new_group, sequence_id
from hyla.engine.sampler import make_generator
from hyla.engine.validate import prompt_token_ids, validate_lengths
from hyla.multimodal.inputs import IMAGE_FIELD, images_of
from hyla.multimodal.runtime import MultimodalPrompt, MultimodalRuntime, PreparedPrompt
from hyla.request import InvalidRequestError, Request, SamplingParams, SamplingParamsError
from hyla.structured.backend import GrammarBackend
from hyla.structured.params import StructuredOutputsError


def eos_token_ids(model_config: Any, tokenizer: Any) -> tuple[int, ...]:
    ids = list(model_config.eos_token_ids)
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int) and eos not in ids:
        ids.append(eos)
    return tuple(ids)


class InputProcessor:
    def __init__(self, model_config: Any, tokenizer: Any, multimodal: MultimodalRuntime | None,
                 max_model_len: int, device: torch.device) -> None:  # fmt: skip
        self.model_config = model_config
        self.tokenizer = tokenizer
        self.multimodal = multimodal
        self.max_model_len = max_model_len
        self.device = device
        self.eos_token_ids = eos_token_ids(model_config, tokenizer)
        self.grammars: GrammarBackend | None = None

    def prompt(
        self, prompt: str | list[int] | PreparedPrompt, params: SamplingParams,
        data: dict[str, Any] | None,
    ) -> tuple[list[int], MultimodalPrompt | None]:  # fmt: skip
        """Checked token ids and images; raises InvalidRequestError, SamplingParamsError."""
        ids, mm = self._prompt_inputs(prompt, data)
        validate_lengths(len(ids), params, self.max_model_len)
        if params.stop and self.tokenizer is None:
            raise SamplingParamsError("stop", "stop strings need a tokenizer")
        return ids, mm

    def _prompt_inputs(
        self, prompt: str | list[int] | PreparedPrompt, data: dict[str, Any] | None
    ) -> tuple[list[int], MultimodalPrompt | None]:
        vocab = self.model_config.vocab_size
        images = images_of(data)
        if (images or isinstance(prompt, PreparedPrompt)) and self.multimodal is None:
            raise InvalidRequestError(
                IMAGE_FIELD, "this model takes no images (no vision tower loaded)"
            )
        if isinstance(prompt, PreparedPrompt):
            if images:
                raise InvalidRequestError("multi_modal_data", "the prepared prompt has its images")
            return prompt_token_ids(prompt.prompt_token_ids, None, vocab), prompt.mm
        ids = prompt_token_ids(prompt, self.tokenizer, vocab)
        if self.multimodal is None:
            return ids, None
        if not images:  # placeholders without an image would read the raw token embedding
            self.multimodal.check_no_placeholders(ids)
            return ids, None
        prepared = self.multimodal.prepare(ids, images)
        return prepared.prompt_token_ids, prepared.mm

    def group(
        self, request_id: str, prompt: Any, ids: list[int], params: SamplingParams,
        priority: int, arrival: float, mm: MultimodalPrompt | None,
    ) -> RequestGroup:  # fmt: skip
        """The request's sequences; raises StructuredOutputsError for a bad constraint."""
        grammars = self._grammar_states(params)
        requests, generators = [], []
        # Only sequence 0 computes prompt logprobs; the others then reuse its prefix cache.
        siblings = params if params.prompt_logprobs is None else dataclasses.replace(
            params, prompt_logprobs=None)  # fmt: skip
        for k in range(params.num_sequences):
            requests.append(Request(
                sequence_id(request_id, k), ids, params if k == 0 else siblings,
                eos_token_ids=self.eos_token_ids, max_model_len=self.max_model_len,
                priority=priority, arrival_time=arrival, mm_spans=() if mm is None else mm.spans,
            ))  # fmt: skip
            if mm is not None and self.multimodal is not None:
                self.multimodal.add(requests[-1].request_id, mm)
            seed = params.seed
            generators.append(None if seed is None else make_generator(seed + k, self.device))
        text = prompt if isinstance(prompt, str) else None
        group = new_group(request_id, text, ids, params, requests, self.tokenizer, generators)
        for seq, grammar in zip(group.sequences, grammars, strict=True):
            seq.grammar = grammar
        return group

    def _grammar_states(self, params: SamplingParams) -> list[Any]:
        so = params.structured_outputs
        if so is None:
            return [None] * params.num_sequences
        if self.tokenizer is None:
            raise StructuredOutputsError(so.field, "structured output needs a tokenizer")
        if self.grammars is None:  # on first use: up to seconds by vocabulary
            self.grammars = GrammarBackend(
                self.tokenizer, self.model_config.vocab_size, self.eos_token_ids
            )
        return [self.grammars.matcher(so) for _ in range(params.num_sequences)]
