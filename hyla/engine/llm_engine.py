"""LLMEngine: requests in (admission through `InputProcessor`), outputs out of `step()`; the
step itself is `EngineCore`'s. Its public methods take one lock, so the server's loop may add and
abort requests while another thread steps."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from hyla.config import EngineConfig
from hyla.engine.engine_core import EngineCore
from hyla.engine.group import RequestGroup
from hyla.engine.input_processor import InputProcessor
from hyla.engine.stats import EngineStats, engine_stats
from hyla.models.hybrid import HybridModel
from hyla.multimodal.runtime import MultimodalRuntime, PreparedPrompt
from hyla.request import (
    InvalidRequestError,
    QueueFullError,
    RequestStatus,
    SamplingParams,
)


class LLMEngine(EngineCore):
    """Serves many requests at once over one model. `tokenizer` None: token-id prompts only;
    `multimodal`: a checkpoint's vision side; `executor`: `LocalExecutor` (the default) or the
    tensor-parallel ranks' (`model` is then rank 0's shard). Raises ConfigError when the cache
    budget cannot hold one full-length sequence."""

    def __init__(
        self,
        model: HybridModel,
        tokenizer: Any,
        engine_config: EngineConfig,
        multimodal: MultimodalRuntime | None = None,
        executor: Any = None,
    ) -> None:
        super().__init__(model, engine_config, multimodal, executor)
        self.tokenizer = tokenizer
        self.model_name = "hyla"
        self.inputs = InputProcessor(self.model_config, tokenizer, multimodal, self.max_model_len,
                                     self.device)  # fmt: skip

    @classmethod
    def from_path(cls, path: str | None = None, **overrides: Any) -> LLMEngine:
        """A checkpoint directory (None: the embedded default model), warmed up; `overrides` are
        config fields by name (`hyla.engine.loading.load_engine`)."""
        from hyla.engine.loading import load_engine

        return load_engine(cls, path, **overrides)

    @property
    def prefix_block_size(self) -> int | None:
        """The cache's block size when prefix caching is on (prompt block hashes use it)."""
        return self.cache.block_size if self.cache.prefix is not None else None

    def shutdown(self) -> None:
        """Stop the executor (the engine cannot step afterwards)."""
        self.executor.shutdown()

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int] | PreparedPrompt,
        params: SamplingParams | None = None,
        priority: int = 0,
        arrival_time: float | None = None,
        multi_modal_data: dict[str, Any] | None = None,
    ) -> None:
        """Queue a request; its outputs come out of later `step()` calls. `multi_modal_data`
        {"image": PIL image or list}: one image token per image in the prompt.

        Raises: InvalidRequestError (duplicate id, bad prompt or image, over max_model_len;
        nothing stays allocated), SamplingParamsError, QueueFullError (`max_queue_len`).
        """
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError("params", f"expected SamplingParams, got {type(params)}")
        with self._lock:
            if request_id in self.requests.groups:
                raise InvalidRequestError("request_id", f"{request_id!r} is already in use")
            ids, mm = self.inputs.prompt(prompt, params, multi_modal_data)
            limit = self.config.max_queue_len
            if limit is not None and self.scheduler.num_waiting >= limit:
                raise QueueFullError(limit)
            arrival = time.monotonic() if arrival_time is None else arrival_time
            group = self.inputs.group(request_id, prompt, ids, params, priority, arrival, mm)
            self._register(group, ids, mm)

    def _register(self, group: RequestGroup, ids: list[int], mm: Any) -> None:
        self.requests.add(group)
        hashes = getattr(ids, "block_hashes", None)  # computed off this thread (TokenIds)
        if hashes and mm is None and getattr(ids, "block_size", 0) == self.cache.block_size:
            for seq in group.sequences:
                self.cache.seed_hashes(seq.request.request_id, ids, hashes)
        for seq in group.sequences:
            self.scheduler.add_request(seq.request)

    def abort_request(self, request_id: str | Iterable[str]) -> None:
        """End requests ("abort") and free their cache now; unknown ids are ignored."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        with self._lock:
            for rid in ids:
                self._finish_group(rid, RequestStatus.FINISHED_ABORTED)

    def has_unfinished_requests(self) -> bool:
        with self._lock:
            return bool(self.requests.groups)

    def get_num_unfinished_requests(self) -> int:
        with self._lock:
            return len(self.requests.groups)

    def get_stats(self) -> EngineStats:
        with self._lock:
            return engine_stats(self)
