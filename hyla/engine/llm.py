"""The offline API: `LLM(path).generate(prompts, params)`, `chat(messages)`, `stream(prompt)`."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

from hyla.config import ConfigError, ModelConfig
from hyla.engine.llm_engine import LLMEngine
from hyla.engine.loading import resolve_device
from hyla.engine.startup import apply_cpu_threads, log_startup
from hyla.multimodal.chat import chat_prompt
from hyla.multimodal.runtime import PreparedPrompt
from hyla.request import InvalidRequestError, RequestOutput, RequestOutputKind, SamplingParams


def random_model(config: ModelConfig, seed: int = 0, device: str = "cpu"):
    """A `HybridModel` of `config` with seeded random weights, for smoke tests and benchmarks."""
    from hyla.models.hybrid import HybridModel

    return randomize_weights(HybridModel(config), seed).to(device).eval()


def randomize_weights(model, seed: int = 0):
    """Overwrite `model`'s parameters in place with seeded values drawn on the CPU."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                values = torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5
            elif "norm" in name:
                values = torch.full(p.shape, 1.0 - model.config.norm_offset)
            else:
                values = 0.02 * torch.randn(p.shape, generator=gen)
            p.copy_(values)
    return model


def _engine_from(model: str | ModelConfig | None, overrides: dict[str, Any]) -> LLMEngine:
    if isinstance(model, ModelConfig):
        from hyla.config import EngineConfig

        config = resolve_device(EngineConfig.from_kwargs(**overrides))
        if config.quantization is not None:
            raise ConfigError("quantization: applies to a checkpoint's weights (pass a path)")
        if config.uses_executor:
            raise ConfigError("tensor_parallel_size: each rank reads its slices of a checkpoint "
                              "(pass a path)")  # fmt: skip
        cache = {"kv_cache_dtype": config.cache.kv_cache_dtype,
                 "mamba_ssm_cache_dtype": config.cache.mamba_ssm_cache_dtype}  # fmt: skip
        model = model.replace(**{k: v for k, v in cache.items() if v is not None})
        net = random_model(model, config.seed, config.device)
        return LLMEngine(net, None, config)
    return LLMEngine.from_path(model, **overrides)


def _final_only(params: Any) -> Any:
    params = SamplingParams() if params is None else params
    if not isinstance(params, SamplingParams):
        return params
    return dataclasses.replace(params, output_kind=RequestOutputKind.FINAL_ONLY)


def _is_token_id(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


_PROMPT_KEYS = {"prompt", "prompt_token_ids", "multi_modal_data"}


def _check_dict_prompt(i: int, p: dict) -> dict:
    unknown = sorted(set(p) - _PROMPT_KEYS)
    if unknown or ("prompt" in p) == ("prompt_token_ids" in p):
        raise InvalidRequestError(
            "prompt", f"prompt[{i}]: a dict takes one of prompt / prompt_token_ids, and "
            f"multi_modal_data (unknown: {unknown})",
        )  # fmt: skip
    return p


def _as_prompt_list(prompts: Any) -> list[str | list[int] | dict]:
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, dict):
        return [_check_dict_prompt(0, prompts)]
    if not isinstance(prompts, Sequence):
        raise InvalidRequestError("prompt", f"expected str or list, got {type(prompts)}")
    if prompts and all(_is_token_id(t) for t in prompts):
        return [list(prompts)]
    out: list[str | list[int] | dict] = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            out.append(p)
        elif isinstance(p, dict):
            out.append(_check_dict_prompt(i, p))
        elif isinstance(p, PreparedPrompt):
            out.append(p)
        elif isinstance(p, Sequence) and all(_is_token_id(t) for t in p):
            out.append(list(p))
        else:
            raise InvalidRequestError(
                "prompt", f"prompt[{i}]: expected str or list[int], got {p!r:.60}"
            )
    return out


class LLM:
    """Offline generation over an `LLMEngine`. `model`: a checkpoint directory, None for the
    embedded default, or a `ModelConfig` for random weights; `engine_overrides`: config fields."""

    def __init__(self, model: str | ModelConfig | None = None, **engine_overrides: Any) -> None:
        self.engine = _engine_from(model, engine_overrides)
        apply_cpu_threads(self.engine)
        log_startup(self.engine)
        self._ids = itertools.count()
        self._inbox: dict[str, list[RequestOutput]] = {}

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def shutdown(self) -> None:
        """Stop the tensor-parallel ranks, if any (idempotent; also on `with` exit)."""
        self.engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _add(
        self, prompt: str | list[int] | dict | PreparedPrompt, params: SamplingParams | None
    ) -> str:
        rid = f"llm-{next(self._ids)}"
        data = None
        if isinstance(prompt, dict):
            data = prompt.get("multi_modal_data")
            prompt = prompt["prompt"] if "prompt" in prompt else prompt["prompt_token_ids"]
        self.engine.add_request(rid, prompt, params or SamplingParams(), multi_modal_data=data)
        self._inbox[rid] = []
        return rid

    def _pump(self) -> None:
        for out in self.engine.step():
            box = self._inbox.get(out.request_id)
            if box is not None:
                box.append(out)

    def _drop(self, rids: list[str]) -> None:
        self.engine.abort_request(rids)
        for rid in rids:
            self._inbox.pop(rid, None)

    def generate(
        self,
        prompts: str | list[str] | list[int] | list[list[int]] | dict | list[dict],
        params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Final outputs in prompt order; a dict prompt is vLLM's ("prompt" or
        "prompt_token_ids", "multi_modal_data"). Raises InvalidRequestError (nothing queued)."""
        items = _as_prompt_list(prompts)
        if isinstance(params, list):
            if len(params) != len(items):
                raise InvalidRequestError("params", f"{len(params)} for {len(items)} prompts")
            per = params
        else:
            per = [params] * len(items)
        rids: list[str] = []
        try:
            for prompt, p in zip(items, per, strict=True):
                rids.append(self._add(prompt, _final_only(p)))
            return self._run(rids, use_tqdm)
        finally:
            self._drop([r for r in rids if r in self._inbox])

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        params: SamplingParams | None = None,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        """Replies to one OpenAI-style conversation or a list of them (a list either way).
        Raises InvalidRequestError naming the field."""
        one = not messages or isinstance(messages[0], dict)
        conversations = [messages] if one else messages
        prompts = [chat_prompt(self.engine, c, add_generation_prompt) for c in conversations]
        return self.generate(prompts, params)

    def _run(self, rids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        final: dict[str, RequestOutput] = {}
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(rids), desc="generate")
        while len(final) < len(rids):
            self._pump()
            for rid in rids:
                box = self._inbox.get(rid)
                if box and box[-1].finished:
                    final[rid] = box[-1]
                    del self._inbox[rid]
                    if bar is not None:
                        bar.update(1)
                elif box:
                    box.clear()
        if bar is not None:
            bar.close()
        return [final[rid] for rid in rids]

    def stream(
        self, prompt: str | list[int], params: SamplingParams | None = None
    ) -> Iterator[RequestOutput]:
        """Yield the request's output after every step that changed it; closing aborts it."""
        rid = self._add(prompt, params)
        try:
            while True:
                box = self._inbox[rid]
                while not box:
                    self._pump()
                out = box.pop(0)
                yield out
                if out.finished:
                    return
        finally:
            self._drop([rid])
