"""Request -> engine inputs (prompts, SamplingParams, chat template) and outputs -> logprobs.

Every check here raises `APIError(400, ...)` whose message names the field and the limit; the
remaining range checks live in `SamplingParams.__post_init__` and `LLMEngine.add_request`.
"""

from __future__ import annotations

from typing import Any

from hyla.request import SamplingParams, SamplingParamsError
from hyla.server.errors import APIError
from hyla.server.protocol import (
    ChatCompletionRequest,
    ChatLogprobs,
    ChatMessage,
    CompletionLogprobs,
    CompletionRequest,
    TokenLogprob,
    TopLogprob,
)

MAX_PROMPTS = 64
MAX_SEED = 2**63 - 1
# Every generated token is checked against every stop string and stop token id, on the engine
# thread: without a bound, one request (n=16, 64 prompts, 6 MB of stop strings) stalls the
# engine for minutes per step. OpenAI allows 4 stop strings; these bounds are generous.
MAX_STOP_STRINGS = 64
MAX_STOP_TOKEN_IDS = 1024
ROLES = ("system", "developer", "user", "assistant", "tool")
# apply_chat_template arguments a client may not override through chat_template_kwargs.
_RESERVED_TEMPLATE_KWARGS = {"conversation", "tokenize", "chat_template", "return_dict",
                             "add_generation_prompt", "tokenizer_kwargs", "return_tensors"}
_OPTIONAL_FLOATS = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "min_p",
                    "repetition_penalty")


def check_model(requested: str | None, served: str) -> None:
    """Raises APIError 404 unless `requested` is None or the served model's name."""
    if requested is not None and requested != served:
        raise APIError(404, f"the model {requested!r} does not exist; this server serves "
                       f"{served!r}", param="model", code="model_not_found")


def check_text(value: str, field: str) -> str:
    """Raises APIError 400 when `value` is not encodable text (JSON `\\ud800` escapes)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise APIError(400, f"{field}: invalid unicode at position {e.start} (lone surrogate)",
                       param=field) from e
    return value


def normalize_prompts(prompt: Any, max_model_len: int | None = None) -> list[str | list[int]]:
    """OpenAI's four prompt shapes -> a list of prompts, each text or token ids. A token-id
    prompt that alone fills the context window is refused here, before anything else."""
    if isinstance(prompt, str):
        return [check_text(prompt, "prompt")]
    if not prompt:
        raise APIError(400, "prompt: must not be empty", param="prompt")
    if isinstance(prompt[0], int):  # one token-id prompt (the schema allows no mixed list)
        _check_num_ids(len(prompt), max_model_len, "prompt")
        return [list(prompt)]
    if len(prompt) > MAX_PROMPTS:
        raise APIError(400, f"prompt: at most {MAX_PROMPTS} prompts per request, got "
                       f"{len(prompt)}", param="prompt")
    for i, p in enumerate(prompt):
        if not isinstance(p, str):
            _check_num_ids(len(p), max_model_len, f"prompt[{i}]")
    return [check_text(p, f"prompt[{i}]") if isinstance(p, str) else list(p)
            for i, p in enumerate(prompt)]


def _check_num_ids(num: int, max_model_len: int | None, field: str) -> None:
    if max_model_len is not None and num >= max_model_len:
        raise APIError(400, f"{field}: {num} token ids but the context window is {max_model_len} "
                       "tokens (at least one must remain for the output)", param=field)


def check_num_messages(req: ChatCompletionRequest, max_model_len: int) -> None:
    """Every message renders to at least one token: refuse a conversation of max_model_len
    messages or more before rendering it (100k messages take seconds to render)."""
    if len(req.messages) >= max_model_len:
        raise APIError(400, f"messages: {len(req.messages)} messages cannot fit the context "
                       f"window of {max_model_len} tokens", param="messages")


def completion_params(req: CompletionRequest, max_model_len: int) -> SamplingParams:
    """SamplingParams of a completion request. Raises APIError 400."""
    if req.suffix:
        raise APIError(400, "suffix: not supported", param="suffix")
    logprobs = req.logprobs
    return _build_params(
        req, max_model_len, {"max_tokens": "max_tokens", "logprobs": "logprobs"},
        max_tokens=req.max_tokens, logprobs=logprobs, best_of=req.best_of,
        prompt_logprobs=logprobs if (req.echo and logprobs is not None) else None,
    )


def chat_params(req: ChatCompletionRequest, max_model_len: int) -> SamplingParams:
    """SamplingParams of a chat request (max_completion_tokens wins over max_tokens)."""
    _check_unsupported_chat(req)
    use_new = req.max_completion_tokens is not None
    max_tokens = req.max_completion_tokens if use_new else req.max_tokens
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs: requires logprobs=true", param="top_logprobs")
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    names = {"max_tokens": "max_completion_tokens" if use_new else "max_tokens",
             "logprobs": "top_logprobs"}
    return _build_params(req, max_model_len, names, max_tokens=max_tokens, logprobs=logprobs)


def _check_unsupported_chat(req: ChatCompletionRequest) -> None:
    """Refuse what would be silently ignored: constrained output formats and forced tool calls.

    Raises: APIError 400 for `response_format` other than {"type": "text"}, and for
        `tool_choice` "required" or a named function (hyla makes no tool calls; "auto" and
        "none" are fine: the model may always answer in text).
    """
    fmt = req.response_format
    if fmt is not None and fmt.get("type", "text") != "text":
        raise APIError(400, f"response_format: type {fmt.get('type')!r} is not supported (no "
                       "constrained decoding); use {'type': 'text'} or omit it",
                       param="response_format", code="unsupported_value")
    choice = req.tool_choice
    if choice is not None and choice not in ("auto", "none"):
        raise APIError(400, f"tool_choice: {choice!r:.80} is not supported (this server makes "
                       "no tool calls); use 'auto', 'none' or omit it", param="tool_choice",
                       code="unsupported_value")


def _build_params(req: Any, max_model_len: int, names: dict[str, str], **kw: Any) -> SamplingParams:
    _check_common(req, max_model_len, kw.get("max_tokens"), names["max_tokens"])
    for name in _OPTIONAL_FLOATS + ("top_k", "min_tokens"):
        value = getattr(req, name)
        if value is not None:
            kw[name] = value
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    stop = [check_text(s, "stop") for s in stop]
    if len(stop) > MAX_STOP_STRINGS:
        raise APIError(400, f"stop: at most {MAX_STOP_STRINGS} strings, got {len(stop)}",
                       param="stop", code="invalid_value")
    if len(req.stop_token_ids or ()) > MAX_STOP_TOKEN_IDS:
        raise APIError(400, f"stop_token_ids: at most {MAX_STOP_TOKEN_IDS} ids, got "
                       f"{len(req.stop_token_ids)}", param="stop_token_ids",
                       code="invalid_value")
    try:
        return SamplingParams(
            n=req.n, seed=req.seed, stop=tuple(stop),
            stop_token_ids=tuple(req.stop_token_ids or ()), ignore_eos=req.ignore_eos,
            skip_special_tokens=req.skip_special_tokens,
            include_stop_str_in_output=req.include_stop_str_in_output, **kw,
        )
    except SamplingParamsError as e:
        field = names.get(e.field, e.field)
        raise APIError(400, f"{field}: {e.message}", param=field, code="invalid_value") from e


def _check_common(req: Any, max_model_len: int, max_tokens: int | None, max_name: str) -> None:
    if req.stream_options is not None and not req.stream:
        raise APIError(400, "stream_options: only allowed when stream is true",
                       param="stream_options")
    if req.seed is not None and not 0 <= req.seed <= MAX_SEED:
        raise APIError(400, f"seed: must be in [0, {MAX_SEED}], got {req.seed}", param="seed")
    if req.logit_bias:
        raise APIError(400, "logit_bias: not supported", param="logit_bias")
    if max_tokens is not None and max_tokens > max_model_len:
        raise APIError(400, f"{max_name}: must be <= the context window of {max_model_len} "
                       f"tokens, got {max_tokens}", param=max_name, code="invalid_value")


# -- chat template ---------------------------------------------------------------------------


def default_chat_prompt(messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
    """The plain template used when the tokenizer has none:

        System: ...
        User: ...
        Assistant:
    """
    lines = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    if add_generation_prompt:
        lines.append("Assistant:")
    return "\n".join(lines)


def chat_prompt_ids(tokenizer: Any, req: ChatCompletionRequest) -> list[int]:
    """Render the conversation with the tokenizer's chat template and tokenize it.

    Raises: APIError 400 for empty `messages`, an unknown role, non-text content parts, a
    template that rejects the conversation, or a model without a tokenizer.
    """
    if not req.messages:
        raise APIError(400, "messages: must contain at least one message", param="messages")
    conversation = [_message_dict(i, m) for i, m in enumerate(req.messages)]
    if tokenizer is None:
        raise APIError(400, "messages: this model has no tokenizer; use /v1/completions with "
                       "token ids", param="messages")
    if getattr(tokenizer, "chat_template", None):
        kwargs = {k: v for k, v in (req.chat_template_kwargs or {}).items()
                  if k not in _RESERVED_TEMPLATE_KWARGS}
        try:
            text = tokenizer.apply_chat_template(
                conversation, tokenize=False,
                add_generation_prompt=req.add_generation_prompt, **kwargs,
            )
        except Exception as e:  # jinja errors, raise_exception() in templates, bad kwargs
            raise APIError(400, f"messages: the chat template rejected the conversation: {e}",
                           param="messages") from e
        return list(tokenizer(check_text(text, "messages"), add_special_tokens=False)["input_ids"])
    text = default_chat_prompt(conversation, req.add_generation_prompt)
    return list(tokenizer(text)["input_ids"])


def _message_dict(i: int, message: ChatMessage) -> dict[str, str]:
    if message.role not in ROLES:
        raise APIError(400, f"messages[{i}].role: unknown role {message.role!r}; expected one "
                       f"of {', '.join(ROLES)}", param=f"messages[{i}].role")
    role = "system" if message.role == "developer" else message.role
    content = message.content
    if content is None:
        return {"role": role, "content": ""}
    if isinstance(content, str):
        return {"role": role, "content": check_text(content, f"messages[{i}].content")}
    texts = []
    for j, part in enumerate(content):
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise APIError(400, f"messages[{i}].content[{j}]: only text parts are supported",
                           param=f"messages[{i}].content")
        texts.append(check_text(part["text"], f"messages[{i}].content"))
    return {"role": role, "content": "".join(texts)}


# -- logprobs --------------------------------------------------------------------------------


def token_text(tokenizer: Any, token_id: int) -> str:
    if tokenizer is None:
        return f"token_id:{token_id}"
    return tokenizer.decode([token_id], skip_special_tokens=False)


def _top(entries: dict[int, float] | None, k: int) -> list[tuple[int, float]]:
    if not entries or k <= 0:
        return []
    return sorted(entries.items(), key=lambda kv: -kv[1])[:k]


def completion_logprobs(
    tokenizer: Any,
    token_ids: list[int],
    logprobs: list[dict[int, float] | None],
    num_top: int,
    text_offset: int,
) -> CompletionLogprobs:
    """OpenAI completions logprobs of `token_ids` (None entries: the first prompt token)."""
    out = CompletionLogprobs()
    offset = text_offset
    for token_id, entries in zip(token_ids, logprobs, strict=False):
        text = token_text(tokenizer, token_id)
        out.tokens.append(text)
        out.text_offset.append(offset)
        offset += len(text)
        if entries is None:
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
            continue
        out.token_logprobs.append(entries.get(token_id))
        out.top_logprobs.append({token_text(tokenizer, t): v for t, v in _top(entries, num_top)})
    return out


def chat_logprobs(
    tokenizer: Any, token_ids: list[int], logprobs: list[dict[int, float]], num_top: int
) -> ChatLogprobs:
    """OpenAI chat logprobs (`content` list) of generated `token_ids`."""
    content = []
    for token_id, entries in zip(token_ids, logprobs, strict=False):
        text = token_text(tokenizer, token_id)
        tops = [
            TopLogprob(token=token_text(tokenizer, t), logprob=v,
                       bytes=list(token_text(tokenizer, t).encode()))
            for t, v in _top(entries, num_top)
        ]
        content.append(TokenLogprob(token=text, logprob=entries.get(token_id, float("-inf")),
                                    bytes=list(text.encode()), top_logprobs=tops))
    return ChatLogprobs(content=content)
