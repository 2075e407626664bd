"""Request -> engine inputs (prompts, SamplingParams, chat template) and outputs -> logprobs.

Every check here raises `APIError(400, ...)` whose message names the field and the limit; the
remaining range checks live in `SamplingParams.__post_init__` and `LLMEngine.add_request`.
"""

from __future__ import annotations

from typing import Any

import jinja2
import jinja2.meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from hyla.request import RequestOutputKind, SamplingParams, SamplingParamsError
from hyla.server.chat_tools import check_tools, template_tool_calls, tool_plan
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

MAX_SEED = 2**63 - 1
# Every generated token is checked against every stop string and stop token id, on the engine
# thread: without a bound, one request (n=16, 64 prompts, 6 MB of stop strings) stalls the
# engine for minutes per step. OpenAI allows 4 stop strings; these bounds are generous.
MAX_STOP_STRINGS = 64
MAX_STOP_TOKEN_IDS = 1024
ROLES = ("system", "developer", "user", "assistant", "tool")
# apply_chat_template arguments a client may not override through chat_template_kwargs.
_RESERVED_TEMPLATE_KWARGS = {"conversation", "tokenize", "chat_template", "return_dict",
                             "add_generation_prompt", "tokenizer_kwargs", "return_tensors",
                             "tools"}
# apply_chat_template arguments that are not template variables but act with tokenize=False.
_TEMPLATE_ARGUMENTS = {"continue_final_message"}
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


def normalize_prompts(prompt: Any) -> list[str | list[int]]:
    """OpenAI's four prompt shapes -> a list of prompts, each text or token ids (their count
    and lengths were checked before the body was validated: `limits.check_completion_sizes`)."""
    if isinstance(prompt, str):
        return [check_text(prompt, "prompt")]
    if not prompt:
        raise APIError(400, "prompt: must not be empty", param="prompt")
    if isinstance(prompt[0], int):  # one token-id prompt (the schema allows no mixed list)
        return [list(prompt)]
    return [check_text(p, f"prompt[{i}]") if isinstance(p, str) else list(p)
            for i, p in enumerate(prompt)]


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
    """SamplingParams of a chat request (max_completion_tokens wins over max_tokens); a grammar
    for `response_format` and forced tool calls (`chat_tools.tool_plan`)."""
    _check_unsupported_chat(req)
    plan = tool_plan(req)
    extra: dict[str, Any] = {"structured_outputs": plan.structured}
    if plan.choice == "auto" and plan.tools:  # call markers are often special tokens
        extra["skip_special_tokens"] = False
    use_new = req.max_completion_tokens is not None
    if use_new and req.max_tokens not in (None, req.max_completion_tokens):
        raise APIError(400, f"max_completion_tokens: {req.max_completion_tokens} conflicts with "
                       f"max_tokens {req.max_tokens}; send one of them",
                       param="max_completion_tokens", code="invalid_value")
    max_tokens = req.max_completion_tokens if use_new else req.max_tokens
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs: requires logprobs=true", param="top_logprobs")
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    names = {"max_tokens": "max_completion_tokens" if use_new else "max_tokens",
             "logprobs": "top_logprobs"}
    return _build_params(req, max_model_len, names, max_tokens=max_tokens, logprobs=logprobs,
                         **extra)


def _check_unsupported_chat(req: ChatCompletionRequest) -> None:
    """Raises APIError 400 for `modalities` other than ["text"] (tools and response formats:
    `chat_tools.tool_plan`)."""
    if req.modalities is not None and req.modalities != ["text"]:
        raise APIError(400, f"modalities: {req.modalities!r:.80} is not supported; use "
                       "['text'] or omit it", param="modalities", code="unsupported_value")


def _check_unsupported_common(req: Any) -> None:
    """`store: true` (this server stores nothing) and a `service_tier` other than "auto" or
    "default" (it has one tier) are refused with 400."""
    if req.store:
        raise APIError(400, "store: stored completions are not supported; use false or omit "
                       "it", param="store", code="unsupported_value")
    if req.service_tier not in (None, "auto", "default"):
        raise APIError(400, f"service_tier: {req.service_tier!r:.80} is not supported; use "
                       "'auto', 'default' or omit it", param="service_tier",
                       code="unsupported_value")


def _build_params(req: Any, max_model_len: int, names: dict[str, str], **kw: Any) -> SamplingParams:
    _check_common(req, max_model_len, kw.get("max_tokens"), names["max_tokens"])
    kw.setdefault("skip_special_tokens", req.skip_special_tokens)
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
            n=req.n, seed=req.seed, stop=tuple(stop), output_kind=RequestOutputKind.DELTA,
            stop_token_ids=tuple(req.stop_token_ids or ()), ignore_eos=req.ignore_eos,
            include_stop_str_in_output=req.include_stop_str_in_output, **kw,
        )
    except SamplingParamsError as e:
        field = names.get(e.field, e.field)
        raise APIError(400, f"{field}: {e.message}", param=field, code="invalid_value") from e


def _check_common(req: Any, max_model_len: int, max_tokens: int | None, max_name: str) -> None:
    _check_unsupported_common(req)
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
    lines = [f"{m['role'].capitalize()}{' ' + m['name'] if m.get('name') else ''}: "
             f"{m['content']}" for m in messages]
    if add_generation_prompt:
        lines.append("Assistant:")
    return "\n".join(lines)


def chat_prompt_ids(tokenizer: Any, req: ChatCompletionRequest, images: Any = None) -> list[int]:
    """Render the conversation with the tokenizer's chat template and tokenize it. `images`
    (`hyla.multimodal.chat.ChatImages`, None for a text-only model) collects the images of
    `image_url` parts, each rendered as its placeholder text.

    Raises: APIError 400 for empty `messages`, an unknown role, a content part of another type
    (or an image for a text-only model), a template that rejects the conversation, or a model
    without a tokenizer; InvalidRequestError naming a bad image's part.
    """
    if not req.messages:
        raise APIError(400, "messages: must contain at least one message", param="messages")
    conversation = [_message_dict(i, m, images) for i, m in enumerate(req.messages)]
    if tokenizer is None:
        raise APIError(400, "messages: this model has no tokenizer; use /v1/completions with "
                       "token ids", param="messages")
    if not getattr(tokenizer, "chat_template", None):
        if req.chat_template_kwargs:
            raise APIError(400, "chat_template_kwargs: this model has no chat template (its "
                           "plain fallback takes no arguments); omit it",
                           param="chat_template_kwargs", code="unsupported_parameter")
        if req.tools and req.tool_choice in (None, "auto"):
            raise APIError(400, "tools: this model has no chat template to show tools to the "
                           "model; use tool_choice 'required' or a named function",
                           param="tools", code="unsupported_parameter")
        text = default_chat_prompt(conversation, req.add_generation_prompt)
        return list(tokenizer(text)["input_ids"])
    text = _render(tokenizer, conversation, req)
    named = [i for i, m in enumerate(conversation) if "name" in m]
    if named:  # a template without a place for names drops them: say so
        nameless = [{k: v for k, v in m.items() if k != "name"} for m in conversation]
        if _render(tokenizer, nameless, req) == text:
            raise APIError(400, f"messages[{named[0]}].name: this model's chat template does "
                           "not use it; omit it", param=f"messages[{named[0]}].name",
                           code="unsupported_parameter")
    return list(tokenizer(check_text(text, "messages"), add_special_tokens=False)["input_ids"])


def _render(tokenizer: Any, conversation: list[dict], req: ChatCompletionRequest) -> str:
    kwargs = dict(req.chat_template_kwargs or {})
    for key, value in kwargs.items():  # a key ends up in error messages and logs
        check_text(key, "chat_template_kwargs")
        if isinstance(value, str):
            check_text(value, f"chat_template_kwargs.{key}")
    reserved = sorted(set(kwargs) & _RESERVED_TEMPLATE_KWARGS)
    if reserved:
        raise APIError(400, f"chat_template_kwargs.{reserved[0]}: set by the server, not "
                       "by the request", param=f"chat_template_kwargs.{reserved[0]}")
    read = _template_variables(tokenizer.chat_template)
    unread = [] if read is None else sorted(set(kwargs) - _TEMPLATE_ARGUMENTS - read)
    if unread:
        raise APIError(400, f"chat_template_kwargs.{unread[0]}: this model's chat template does "
                       "not use it; omit it", param=f"chat_template_kwargs.{unread[0]}",
                       code="unsupported_parameter")
    if req.tools:
        kwargs["tools"] = check_tools(req.tools)
        if read is not None and "tools" not in read and req.tool_choice in (None, "auto"):
            raise APIError(400, "tools: this model's chat template does not show tools to the "
                           "model, so it cannot choose to call one; use tool_choice 'required' "
                           "or a named function (a grammar makes the call)", param="tools",
                           code="unsupported_parameter")
    try:
        return tokenizer.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=req.add_generation_prompt,
            **kwargs,
        )
    except Exception as e:  # jinja errors, raise_exception() in templates, bad kwargs
        raise APIError(400, f"messages: the chat template rejected the conversation: {e}",
                       param="messages") from e


def _message_dict(i: int, message: ChatMessage, images: Any = None) -> dict[str, Any]:
    if message.role not in ROLES:
        raise APIError(400, f"messages[{i}].role: unknown role {message.role!r}; expected one "
                       f"of {', '.join(ROLES)}", param=f"messages[{i}].role")
    role = "system" if message.role == "developer" else message.role
    out: dict[str, Any] = {"role": role, "content": _message_text(i, message.content, images)}
    if message.name is not None:  # for the chat template, as Hugging Face templates take it
        out["name"] = check_text(message.name, f"messages[{i}].name")
    if message.tool_calls is not None:
        if role != "assistant":
            raise APIError(400, f"messages[{i}].tool_calls: only assistant messages make "
                           "calls", param=f"messages[{i}].tool_calls")
        out["tool_calls"] = template_tool_calls(i, message.tool_calls)
    if message.tool_call_id is not None:
        if role != "tool":
            raise APIError(400, f"messages[{i}].tool_call_id: only tool messages answer a "
                           "call", param=f"messages[{i}].tool_call_id")
        out["tool_call_id"] = check_text(message.tool_call_id, f"messages[{i}].tool_call_id")
    return out


def _message_text(i: int, content: Any, images: Any = None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return check_text(content, f"messages[{i}].content")
    texts = []
    for j, part in enumerate(content):
        if part.get("type") == "image_url":
            texts.append(_image_text(images, part, f"messages[{i}].content[{j}]"))
            continue
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise APIError(400, f"messages[{i}].content[{j}]: only text and image_url parts "
                           "are supported",
                           param=f"messages[{i}].content")
        extra = sorted(set(part) - {"type", "text"})
        if extra:
            raise APIError(400, f"messages[{i}].content[{j}].{extra[0]}: not supported",
                           param=f"messages[{i}].content[{j}].{extra[0]}",
                           code="unsupported_parameter")
        texts.append(check_text(part["text"], f"messages[{i}].content"))
    return "".join(texts)


def _image_text(images: Any, part: dict[str, Any], field: str) -> str:
    if images is None:
        raise APIError(400, f"{field}: this model takes no images (it has no vision tower)",
                       param=field, code="unsupported_parameter")
    return images.add(part, field)


def _template_variables(template: Any) -> set[str] | None:
    """The variables a chat template reads, or None when it cannot be parsed here (a tag of
    an extension, a dict of named templates)."""
    env = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])
    try:
        return jinja2.meta.find_undeclared_variables(env.parse(template))
    except (jinja2.TemplateSyntaxError, TypeError):
        return None


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
