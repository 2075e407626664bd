"""Requests, sampling parameters and outputs (plain Python, no torch)."""

from __future__ import annotations

import dataclasses
import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hyla.errors import InvalidRequestError, QueueFullError, SamplingParamsError  # noqa: F401 - hyla.request names them

if TYPE_CHECKING:
    from hyla.structured.params import StructuredOutputsParams

MAX_N = 16
MAX_LOGPROBS = 20
# Signed 64-bit (torch.Generator.manual_seed); sequence k's seed + k stays below 2**64.
MIN_SEED, MAX_SEED = -(2**63), 2**63 - 1


class RequestOutputKind(enum.Enum):
    """vLLM's output kinds: CUMULATIVE (a copy per step), DELTA (each piece once), FINAL_ONLY."""

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check(cond: bool, name: str, message: str) -> None:
    if not cond:
        raise SamplingParamsError(name, message)


_FLOAT_FIELDS = (
    "temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
    "frequency_penalty",
)  # fmt: skip
# Below this, logits / temperature can overflow fp32 and sampling degenerates.
MIN_TEMPERATURE = 1e-2


@dataclass(frozen=True)
class SamplingParams:
    """How to draw tokens for one request; a bad field raises SamplingParamsError naming it.

    Penalties as OpenAI/CTRL: repetition divides positive logits (multiplies negative) of seen
    tokens; presence once per seen output token, frequency per occurrence."""

    n: int = 1
    best_of: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    structured_outputs: StructuredOutputsParams | None = None
    detokenize: bool = True

    def __post_init__(self) -> None:
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        stop = () if stop is None else stop  # None means no stop strings (as in vLLM)
        _check(isinstance(stop, (list, tuple)), "stop", "must be a string or a list of strings")
        object.__setattr__(self, "stop", tuple(stop))
        ids = () if self.stop_token_ids is None else self.stop_token_ids
        _check(isinstance(ids, (list, tuple)), "stop_token_ids", "must be a list of token ids")
        object.__setattr__(self, "stop_token_ids", tuple(ids))
        self._check_counts()
        self._check_probabilities()
        self._check_stops()
        kind = self.output_kind
        _check(
            isinstance(kind, RequestOutputKind), "output_kind", f"not a RequestOutputKind: {kind!r}"
        )
        if self.structured_outputs is not None:
            from hyla.structured.params import StructuredOutputsParams

            _check(isinstance(self.structured_outputs, StructuredOutputsParams),
                   "structured_outputs", "must be a StructuredOutputsParams")

    def _check_counts(self) -> None:
        n = self.n
        _check(_is_int(n) and 1 <= n <= MAX_N, "n", f"must be in [1, {MAX_N}], got {n!r}")
        if self.best_of is not None:
            _check(
                _is_int(self.best_of) and self.n <= self.best_of <= MAX_N,
                "best_of",
                f"must be in [n={self.n}, {MAX_N}], got {self.best_of!r}",
            )
        if self.max_tokens is not None:
            _check(
                _is_int(self.max_tokens) and self.max_tokens >= 1,
                "max_tokens",
                f"must be >= 1, got {self.max_tokens!r}",
            )
        _check(
            _is_int(self.min_tokens) and self.min_tokens >= 0,
            "min_tokens",
            f"must be >= 0, got {self.min_tokens!r}",
        )
        if self.max_tokens is not None:
            _check(
                self.min_tokens <= self.max_tokens,
                "min_tokens",
                f"must be <= max_tokens={self.max_tokens}, got {self.min_tokens}",
            )
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None:
                _check(
                    _is_int(v) and 0 <= v <= MAX_LOGPROBS,
                    name,
                    f"must be in [0, {MAX_LOGPROBS}], got {v!r}",
                )
        if self.seed is not None:
            _check(
                _is_int(self.seed) and MIN_SEED <= self.seed <= MAX_SEED,
                "seed",
                f"must be an integer in [{MIN_SEED}, {MAX_SEED}], got {self.seed!r}",
            )
        _check(_is_int(self.top_k), "top_k", f"must be an integer (<= 0: off), got {self.top_k!r}")

    def _check_probabilities(self) -> None:
        for name in _FLOAT_FIELDS:  # as floats: a huge int (JSON 2**64) would overflow in torch
            v = getattr(self, name)
            if _is_num(v):
                try:
                    object.__setattr__(self, name, float(v))
                except OverflowError:
                    message = f"must be finite, got an integer of {v.bit_length()} bits"
                    raise SamplingParamsError(name, message) from None
        t = self.temperature
        _check(_is_num(t) and t >= 0, "temperature", f"must be >= 0, got {t!r}")
        _check(t == t and t != float("inf"), "temperature", f"must be finite, got {t!r}")
        if 0 < t < MIN_TEMPERATURE:  # as vLLM: tiny temperatures are clamped, not rejected
            object.__setattr__(self, "temperature", MIN_TEMPERATURE)
        p = self.top_p
        _check(_is_num(p) and 0 < p <= 1, "top_p", f"must be in (0, 1], got {p!r}")
        m = self.min_p
        _check(_is_num(m) and 0 <= m <= 1, "min_p", f"must be in [0, 1], got {m!r}")
        r = self.repetition_penalty
        _check(
            _is_num(r) and 0 < r < float("inf"),
            "repetition_penalty",
            f"must be > 0 and finite, got {r!r}",
        )
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            _check(_is_num(v) and -2 <= v <= 2, name, f"must be in [-2, 2], got {v!r}")

    def _check_stops(self) -> None:
        for s in self.stop:
            _check(isinstance(s, str) and s != "", "stop", f"must be non-empty strings, got {s!r}")
        for t in self.stop_token_ids:
            _check(_is_int(t) and t >= 0, "stop_token_ids", f"must be ids >= 0, got {t!r}")
        _check(self.detokenize or not self.stop, "stop", "stop strings need detokenize=True")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @property
    def num_sequences(self) -> int:
        return self.best_of if self.best_of is not None else self.n


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_TIMEOUT = "timeout"
    FINISHED_ERROR = "error"

    @property
    def is_finished(self) -> bool:
        return self not in (RequestStatus.WAITING, RequestStatus.RUNNING)

    @property
    def finish_reason(self) -> str | None:
        return self.value if self.is_finished else None


@dataclass
class RequestMetrics:
    """Timestamps (seconds from `time.monotonic()`) of one request's life."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None


@dataclass
class CompletionOutput:
    """One of a request's completions; with DELTA only what is new (`cumulative_logprob`: total)."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, float]] | None
    cumulative_logprob: float | None
    finish_reason: str | None = None
    stop_reason: str | int | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """A request's output from `LLMEngine.step()`. `prompt_token_ids` is one list shared by all its
    outputs (copying a 1M-token prompt per step costs ~4 ms): do not modify it."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: list[dict[int, float] | None] | None
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    num_cached_tokens: int = 0

    def add(self, later: RequestOutput) -> None:
        """Append a later DELTA output of this request in place (a consumer fell behind)."""
        mine = {c.index: c for c in self.outputs}
        for c in later.outputs:
            old = mine.get(c.index)
            if old is None:
                lps = None if c.logprobs is None else list(c.logprobs)
                self.outputs.append(
                    dataclasses.replace(c, token_ids=list(c.token_ids), logprobs=lps)
                )
                continue
            old.text += c.text
            old.token_ids.extend(c.token_ids)
            if c.logprobs is not None:
                old.logprobs = (old.logprobs or []) + c.logprobs
            old.cumulative_logprob = c.cumulative_logprob
            old.finish_reason, old.stop_reason = c.finish_reason, c.stop_reason
        self.outputs.sort(key=lambda c: c.index)
        if self.prompt_logprobs is None:
            self.prompt_logprobs = later.prompt_logprobs
        self.prompt = self.prompt if self.prompt is not None else later.prompt
        self.finished = later.finished
        self.metrics = later.metrics
        self.num_cached_tokens = later.num_cached_tokens


@dataclass(eq=False)
class Request:
    """One sequence as the scheduler sees it; preemption resets `num_computed_tokens` to 0.
    `num_placeholders`: trailing sampled tokens still on the device, in `num_tokens` but not in the
    token lists until `resolve_placeholder`. `stop_reason`: stop string, token id or error text."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    eos_token_ids: tuple[int, ...] = ()
    max_model_len: int = 1 << 62
    priority: int = 0
    arrival_time: float = field(default_factory=time.monotonic)
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_preemptions: int = 0
    stop_reason: str | int | None = None
    num_cached_tokens: int = 0
    num_placeholders: int = 0
    mm_spans: tuple = ()
    spec_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.prompt_token_ids = list(self.prompt_token_ids)
        self.all_token_ids = list(self.prompt_token_ids) + list(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids) + self.num_placeholders

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids) + self.num_placeholders

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def max_output_tokens(self) -> int:
        room = self.max_model_len - self.num_prompt_tokens
        mt = self.params.max_tokens
        return room if mt is None else min(mt, room)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def num_known_tokens(self) -> int:
        return len(self.all_token_ids)

    def append_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def add_placeholder(self) -> None:
        self.num_placeholders += 1

    def resolve_placeholder(self, token_id: int) -> None:
        """Append the oldest placeholder's value. Raises ValueError when there is none."""
        if self.num_placeholders < 1:
            raise ValueError(f"{self.request_id!r}: no placeholder to resolve")
        self.num_placeholders -= 1
        self.append_token(token_id)


def check_token_stop(request: Request) -> RequestStatus | None:
    """Stops decided by the last known token; sets `stop_reason`. None: continue."""
    if not request.output_token_ids:
        return None
    last = request.output_token_ids[-1]
    params = request.params
    num_output = len(request.output_token_ids)
    if num_output >= params.min_tokens:
        if not params.ignore_eos and last in request.eos_token_ids:
            request.stop_reason = None
            return RequestStatus.FINISHED_STOPPED
        if last in params.stop_token_ids:
            request.stop_reason = last
            return RequestStatus.FINISHED_STOPPED
    if num_output >= request.max_output_tokens:
        return RequestStatus.FINISHED_LENGTH
    return None
