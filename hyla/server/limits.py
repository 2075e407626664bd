"""Inputs refused by their size alone, before the schema validates them, a chat template renders
them or a tokenizer reads them.

    body bytes > max_request_bytes          413  (`middleware.BodyLimit`, before JSON parsing;
                                                 `request_bytes_limit` sets it)
    messages: count >= max_model_len        400  every message renders to at least one token
    prompt:   token ids >= max_model_len    400  one output token must still fit
    prompt:   more than MAX_PROMPTS prompts 400
    JSON nested past the parser's depth     400  naming the top-level field (`nested_too_deep`)

The counts are read from the parsed JSON (one pass of pydantic-core's Rust parser,
`FastJSONRoute`, which FastAPI and the check share) as a route dependency, which FastAPI
solves before it validates the body: pydantic builds one object per message or token id (0.6 s
for 100k messages, 0.2 s for 1M ids on one core), all of it holding the GIL, i.e. stalling
every other stream. The parse holds it too: ~40 ms for 3 MB, `json.loads` twice that.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import pydantic_core
from fastapi import Request, Response
from fastapi.routing import APIRoute

from hyla.server.errors import APIError

logger = logging.getLogger("hyla.server")

MAX_PROMPTS = 64
MAX_REQUEST_BYTES = 8 << 20  # the body limit of a text model (a 2M-token prompt fits)
# Room in a vision request's body beside one image's data URL: the rest of the conversation.
IMAGE_REQUEST_SLACK = 1 << 20


def request_bytes_limit(max_request_bytes: int | None, engine: Any) -> int:
    """The body limit: `max_request_bytes`, or by default `MAX_REQUEST_BYTES`, raised for a
    vision model so that one image of `max_image_bytes` fits as a base64 data URL (the default
    20 MiB image limit could not be reached under an 8 MiB body). An explicit limit that
    leaves `max_image_bytes` out of reach is kept, with a warning."""
    inner = getattr(engine, "engine", engine)
    config = getattr(inner, "config", None)
    if getattr(inner, "multimodal", None) is None or config is None:
        return MAX_REQUEST_BYTES if max_request_bytes is None else max_request_bytes
    needed = 4 * -(-config.max_image_bytes // 3) + IMAGE_REQUEST_SLACK
    if max_request_bytes is None:
        return max(MAX_REQUEST_BYTES, needed)
    if max_request_bytes < needed:
        logger.warning("max_request_bytes %d leaves no room for an inline image of "
                       "max_image_bytes %d (a base64 data URL of it takes %d bytes)",
                       max_request_bytes, config.max_image_bytes, needed - IMAGE_REQUEST_SLACK)
    return max_request_bytes


async def raw_json(request: Request) -> Any:
    """The request's parsed JSON body (cached on the request), or None when it is empty or not
    JSON (FastAPI then answers 422 as usual)."""
    try:
        return await request.json() if await request.body() else None
    except ValueError:  # JSONDecodeError, UnicodeDecodeError
        return None


class FastJSONRequest(Request):
    """A Request whose `json()` parses with pydantic-core's Rust parser (half the GIL time of
    `json.loads` for 3 MB); bodies it refuses go to `json.loads`, whose errors FastAPI expects."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                self._json = pydantic_core.from_json(body)
            except ValueError:  # not UTF-8, a BOM, lone surrogates, too deep, not JSON
                self._json = json.loads(body)
        return self._json


class FastJSONRoute(APIRoute):
    """FastAPI's route with `FastJSONRequest` (FastAPI's documented custom-route hook)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            inner = FastJSONRequest(request.scope, request.receive)
            try:
                return await handler(inner)
            finally:  # the error handlers get `request`: `errors.py` reads the body there
                if hasattr(inner, "_body"):
                    request._body = inner._body

        return route


def check_completion_sizes(data: Any, max_model_len: int) -> None:
    """Prompt count and token-id prompt lengths of a raw /v1/completions body.

    Raises: APIError 400 naming `prompt` or `prompt[i]` and the limit.
    """
    prompt = data.get("prompt") if isinstance(data, dict) else None
    if not isinstance(prompt, list) or not prompt:
        return
    if _is_int(prompt[0]):  # one token-id prompt
        check_num_ids(len(prompt), max_model_len, "prompt")
        return
    if len(prompt) > MAX_PROMPTS:
        raise APIError(
            400,
            f"prompt: at most {MAX_PROMPTS} prompts per request, got {len(prompt)}",
            param="prompt",
        )
    for i, p in enumerate(prompt):
        if isinstance(p, list):
            check_num_ids(len(p), max_model_len, f"prompt[{i}]")


def check_chat_sizes(data: Any, max_model_len: int) -> None:
    """Message count of a raw /v1/chat/completions body.

    Raises: APIError 400 naming `messages` and the limit.
    """
    messages = data.get("messages") if isinstance(data, dict) else None
    if isinstance(messages, list) and len(messages) >= max_model_len:
        raise APIError(
            400,
            f"messages: {len(messages)} messages cannot fit the context window "
            f"of {max_model_len} tokens (each renders to at least one token; at most "
            f"{max_model_len - 1} messages)",
            param="messages",
        )


def check_num_ids(num: int, max_model_len: int, field: str) -> None:
    if num >= max_model_len:
        raise APIError(
            400,
            f"{field}: {num} token ids but the context window is {max_model_len} "
            f"tokens (at most {max_model_len - 1} prompt tokens: at least one must "
            "remain for the output)",
            param=field,
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
