"""OpenAI API request and response schemas (pydantic v2).

The request models check *types* only (a violation is a 422); value ranges (temperature >= 0, 0 <
top_p <= 1, n <= MAX_N, max_tokens >= 1, ...) are checked by `hyla.request.SamplingParams` and by
`hyla.server.api`, which answer 400 naming the field and the limit. No request field is ignored: a
field these models do not declare (an OpenAI field hyla does not implement, such as `audio` or
`reasoning_effort`, or an unknown name) is a 400 naming it (`extra="forbid"`, worded by
`errors.py`). Declared fields are implemented, restricted to the values hyla honours (`convert.py`
refuses the rest with 400), or no-ops by OpenAI's own semantics: `user`, `safety_identifier`
(end-user ids for abuse monitoring), `prompt_cache_key` (a cache-routing hint; prefix caching here
is automatic), `stream_options.include_obfuscation` (side-channel padding, never needed on a local
link); `messages[].name` goes to the chat template,
as Hugging Face templates take it (a 400 when the template renders the same prompt without it;
so is a `chat_template_kwargs` key the template does not read).
An explicit `null` for an optional field means its default (the
OpenAI reference marks them nullable, and generated clients send `null` for unset fields); where
`None` is itself a meaningful value (`max_tokens`: up to the context window) it is kept.

Source: the OpenAI API reference (completions, chat completions, models, error objects).
"""

from __future__ import annotations

import time
import types
import typing
import uuid
from typing import Annotated, Any, Literal

from pydantic import (
    AllowInfNan,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    StrictInt,
    model_serializer,
    model_validator,
)

# A completion prompt: text, token ids, or a batch of either.
Prompt = str | list[str] | list[StrictInt] | list[list[StrictInt]]
# A JSON number, as OpenAI's API takes it: no booleans, no numeric strings, finite.
Number = StrictInt | Annotated[float, Strict(), AllowInfNan(False)]


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def _admits_none(annotation: Any) -> bool:
    if annotation is None or annotation is type(None):
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return any(_admits_none(a) for a in typing.get_args(annotation))
    return False


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        """Drop `null` values of optional fields whose type has no None (they get defaults)."""
        if not isinstance(data, dict):
            return data
        drop = [
            name for name, f in cls.model_fields.items()
            if name in data and data[name] is None and not f.is_required()
            and not _admits_none(f.annotation)
        ]
        # `null` for an OpenAI field hyla does not implement is "unset", not a use of it.
        drop += [name for name in UNSUPPORTED_FIELDS if name in data and data[name] is None]
        return {k: v for k, v in data.items() if k not in drop} if drop else data


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- errors ----------------------------------------------------------------------------------


class ErrorInfo(_Response):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(_Response):
    """`{"error": {"message", "type", "param", "code"}}` as the OpenAI API sends it."""

    error: ErrorInfo


# -- models ----------------------------------------------------------------------------------


class ModelCard(_Response):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "hyla"
    max_model_len: int | None = None


class ModelList(_Response):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# OpenAI request fields hyla does not implement, with why; any other undeclared name is an
# unrecognized argument. Both are 400s naming the field (`errors.py`).
UNSUPPORTED_FIELDS = {
    "audio": "audio output is not supported",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
    "reasoning_effort": "this server's models have no reasoning-effort control",
    "verbosity": "this server's models have no verbosity control",
    "metadata": "stored completions are not supported",
    "function_call": "function calls are not supported (deprecated by OpenAI); use tools",
    "refusal": "refusal messages are not supported",
    "continuous_usage_stats": "per-chunk usage is not supported; use include_usage",
}


# -- shared request parts --------------------------------------------------------------------


class StreamOptions(_Request):
    include_usage: StrictBool = False
    include_obfuscation: StrictBool = False  # no-op (see the module docstring)


class _SamplingFields(_Request):
    """Fields shared by completions and chat completions (OpenAI plus common extensions)."""

    model: str | None = None
    n: StrictInt = 1
    temperature: Number | None = None
    top_p: Number | None = None
    stop: str | list[str] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    seed: StrictInt | None = None
    presence_penalty: Number | None = None
    frequency_penalty: Number | None = None
    # No-ops by OpenAI's semantics (see the module docstring).
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    # Accepted only with the value equal to hyla's behaviour (checked in `convert.py`).
    store: StrictBool | None = None
    service_tier: str | None = None
    # Extensions (vLLM/SGLang spelling).
    top_k: StrictInt | None = None
    min_p: Number | None = None
    repetition_penalty: Number | None = None
    min_tokens: StrictInt | None = None
    stop_token_ids: list[StrictInt] | None = None
    ignore_eos: StrictBool = False
    skip_special_tokens: StrictBool = True
    include_stop_str_in_output: StrictBool = False


class UsageInfo(_Response):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


# -- completions -----------------------------------------------------------------------------


class CompletionRequest(_SamplingFields):
    """POST /v1/completions."""

    prompt: Prompt
    max_tokens: StrictInt | None = 16
    echo: StrictBool = False
    logprobs: StrictInt | None = None
    best_of: StrictInt | None = None
    suffix: str | None = None
    logit_bias: dict[str, Number] | None = None


class CompletionLogprobs(_Response):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionChoice(_Response):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None


class CompletionResponse(_Response):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


# -- chat completions ------------------------------------------------------------------------


class ChatMessage(_Request):
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant turn's calls
    tool_call_id: str | None = None  # a tool turn's answer to this call


class ChatCompletionRequest(_SamplingFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage]
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None
    logit_bias: dict[str, Number] | None = None
    add_generation_prompt: StrictBool = True
    chat_template_kwargs: dict[str, Any] | None = None
    # Checked in `convert.chat_params` / `hyla.server.chat_tools`: text, json_object or
    # json_schema output; tools with auto/none/required/named choice; text modality only.
    response_format: dict[str, Any] | None = None
    modalities: list[str] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None


class TopLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(_Response):
    content: list[TokenLogprob] | None = None


class FunctionCall(_Response):
    name: str
    arguments: str


class ToolCall(_Response):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaFunctionCall(_Response):
    name: str | None = None
    arguments: str | None = None

    @model_serializer(mode="wrap")
    def _without_none(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class DeltaToolCall(_Response):
    """One call's piece in a streamed delta: `id`, `type` and the whole `function.name` in its
    first piece, then `function.arguments` text."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall

    @model_serializer(mode="wrap")
    def _without_none(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatResponseMessage(_Response):
    """`reasoning_content` and `tool_calls` appear only when there are some."""

    role: str = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None

    @model_serializer(mode="wrap")
    def _without_none(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        return {k: v for k, v in data.items()
                if v is not None or k not in ("reasoning_content", "tool_calls")}


class ChatChoice(_Response):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None


class ChatCompletionResponse(_Response):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo | None = None


class DeltaMessage(_Response):
    """One streamed chat choice's delta. Unset fields are left out of the JSON, as OpenAI does:
    `role` only in a choice's first chunk, `{}` in a finishing chunk without text."""

    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None

    @model_serializer(mode="wrap")
    def _without_none(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatChunkChoice(_Response):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None


class ChatCompletionChunk(_Response):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None
