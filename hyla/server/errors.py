"""OpenAI-style error responses and the exception handlers that produce them.

Every failure reaches the client as `{"error": {"message", "type", "param", "code"}}` with the
HTTP status the OpenAI API uses: 400 bad value, 401 bad API key, 404 unknown model or route,
408 body not received in time, 413 body too large, 422 malformed JSON or schema violation, 400
too for a field hyla does not implement, 503 queue full, timed out in the queue or shutting down
(with `Retry-After`), 500 an engine failure. Nothing here lets an exception escape to uvicorn.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from hyla.engine.async_engine import EngineDeadError, EngineDrainingError
from hyla.multimodal.remote import MediaTooLargeError
from hyla.request import InvalidRequestError, QueueFullError
from hyla.server.protocol import UNSUPPORTED_FIELDS, ErrorInfo, ErrorResponse

logger = logging.getLogger("hyla.server")

_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    500: "server_error",
    503: "server_error",
}
# Location parts pydantic adds for union branches (`temperature.float`), not field names.
_UNION_TAGS = {"int", "float", "str", "bool", "dict", "list", "none", "function-after"}


# The error statuses each route can answer, for the OpenAPI schema (all as OpenAI error JSON).
_ERRORS = {
    400: "a value out of range, or a field this server does not implement (named in `param`)",
    401: "missing or wrong API key (only when the server has one)",
    404: "unknown model",
    408: "the request body did not arrive in full in time",
    413: "the request body is too large",
    422: "malformed JSON or a field of the wrong type",
    500: "the engine failed",
    503: "queue full, timed out in the queue before the first token (`queue_timeout`), or "
         "shutting down; see Retry-After",
}
_ERROR_JSON = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
POST_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "the completion as JSON, or with `stream: true` as server-sent "
          "events ending with `data: [DONE]`", "content": {"text/event-stream": {}}},
    **{status: {"model": ErrorResponse, "description": text} for status, text in _ERRORS.items()},
}
GET_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": _ERRORS[401], "content": _ERROR_JSON}
}



class APIError(Exception):
    """An error with its HTTP status; raised by route code, rendered by `error_response`."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers


def error_body(status: int, message: str, param: str | None = None, code: Any = None) -> dict:
    """OpenAI's error JSON; a 400 without a code of its own gets "invalid_value"."""
    if code is None and status == 400:
        code = "invalid_value"
    info = ErrorInfo(message=message, type=_TYPES.get(status, "invalid_request_error"),
                     param=param, code=code)
    return ErrorResponse(error=info).model_dump()


def error_response(
    status: int,
    message: str,
    param: str | None = None,
    code: Any = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status, headers=headers)


def to_api_error(e: BaseException) -> APIError:
    """Map an engine/validation exception to its APIError (500 for anything unexpected)."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, MediaTooLargeError):
        return APIError(413, str(e), param=e.field, code="image_too_large")
    if isinstance(e, InvalidRequestError):
        return APIError(400, str(e), param=e.field, code="invalid_value")
    if isinstance(e, QueueFullError):
        retry = str(getattr(e, "retry_after", 1))
        return APIError(503, f"{e}; retry later", code="queue_full", headers={"Retry-After": retry})
    if isinstance(e, EngineDrainingError):
        return APIError(503, str(e), code="shutting_down", headers={"Retry-After": "5"})
    if isinstance(e, EngineDeadError):
        return APIError(500, str(e), code="engine_error")
    logger.error("unexpected error", exc_info=(type(e), e, e.__traceback__))
    return APIError(500, f"internal error: {type(e).__name__}", code="internal_error")


def _validation_param(loc: tuple) -> str:
    """pydantic's error location as the server's own errors name a field: `messages[0].role`
    (FastAPI's leading "body" and pydantic's union member tags left out)."""
    param = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            param += f"[{part}]"
        elif not (i == 0 and part == "body") and not _is_union_tag(part):
            param += f".{part}" if param else part
    return param


def _param_of(error: dict) -> str:
    return _validation_param(tuple(error.get("loc", ())))


def _within(param: str, field: str) -> bool:
    """True when `param` is `field` or an item / attribute inside it."""
    return param == field or param.startswith((f"{field}[", f"{field}."))


def _innermost(errors: list[dict], first: dict) -> dict:
    """The error that names the deepest item of `first`'s field: for a union whose list member
    matched the value but not one item (`stop: ["a", 3]`), the item's error (`stop[1]`) says
    more than the member that wanted a string. `first` when none is deeper."""
    field = _param_of(first)
    inside = [e for e in errors if _within(_param_of(e), field)]
    return max(inside, key=lambda e: len(_param_of(e)), default=first)


def _is_union_tag(part: str) -> bool:
    return part in _UNION_TAGS or "[" in part


def _union_member(error: dict) -> str | None:
    """The union member (`int`, `float`, ...) a validation error is about, if any."""
    loc = error.get("loc", ())
    return str(loc[-1]) if loc and _is_union_tag(str(loc[-1])) else None


def _union_tags(errors: list[dict]) -> list[str]:
    tags = []
    for e in errors:
        tag = _union_member(e)
        if tag is not None and tag not in tags:
            tags.append(tag)
    return tags


def _unsupported_field_response(errors: list[dict]) -> JSONResponse | None:
    """400 naming the first field the request models do not declare (OpenAI answers an
    unrecognized argument with 400 too), or None when there is none."""
    extra = [_param_of(e) for e in errors if e.get("type") == "extra_forbidden"]
    if not extra:
        return None
    param = extra[0]
    name = param.rsplit(".", 1)[-1]
    reason = UNSUPPORTED_FIELDS.get(name, "unrecognized request argument")
    message = f"{param}: {reason}; this server does not implement it (omit it)"
    if len(extra) > 1:
        message += f" (and {len(extra) - 1} more: {', '.join(extra[1:4])})"
    return error_response(400, message, param=param, code="unsupported_parameter")


def validation_error_response(errors: list[dict]) -> JSONResponse:
    """422 naming the first offending field (`messages[0].role: Field required`); 400 for a
    field hyla does not implement."""
    if not errors:
        return error_response(422, "invalid request body", code="validation_error")
    unsupported = _unsupported_field_response(errors)
    if unsupported is not None:
        return unsupported
    first = errors[0]
    if first.get("type") == "json_invalid":
        ctx = first.get("ctx") or {}
        detail = ctx.get("error", first.get("msg", "invalid JSON"))
        return error_response(422, f"malformed JSON body: {detail}", code="json_invalid")
    field = _param_of(first)
    first = _innermost(errors, first)
    param = _param_of(first)
    same = [e for e in errors if _param_of(e) == param]
    tags = _union_tags(same)
    value = first.get("input")
    own = [e for e in same if _union_member(e) == type(value).__name__]
    if len(tags) > 1 and own:  # the member of the value's own type says what is wrong with it
        detail = f"{own[0].get('msg', 'invalid')}, got {value!r:.40}"
    elif len(tags) > 1:
        detail = f"expected {' | '.join(tags)}, got {type(value).__name__} {value!r:.40}"
    else:
        detail = first.get("msg", "invalid")
    message = f"{param}: {detail}" if param else f"request body: {detail}"
    extra = len({_param_of(e) for e in errors if not _within(_param_of(e), field)})
    if extra > 0:
        message += f" (and {extra} more field error(s))"
    return error_response(422, message, param=param or None, code="validation_error")


def install_error_handlers(app: FastAPI) -> None:
    """Register handlers so every error is rendered as OpenAI error JSON."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, e: APIError) -> JSONResponse:
        return error_response(e.status, e.message, e.param, e.code, e.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, e: RequestValidationError) -> JSONResponse:
        return validation_error_response(list(e.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException) -> JSONResponse:
        if isinstance(e.__cause__, RecursionError):  # FastAPI's json.loads of the body
            err = nested_too_deep(getattr(request, "_body", None))
            return error_response(err.status, err.message, err.param, err.code)
        message = e.detail if isinstance(e.detail, str) else str(e.detail)
        return error_response(e.status_code, message, headers=getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, e: Exception) -> JSONResponse:
        err = to_api_error(e)
        return error_response(err.status, err.message, err.param, err.code, err.headers)


def nested_too_deep(body: bytes | None) -> APIError:
    """The 400 for a body json.loads refused with RecursionError, naming the top-level field
    whose value is nested too deep (each top-level value is decoded on its own, at C speed,
    until one fails)."""
    limit = sys.getrecursionlimit()
    field = _deep_field(body or b"")
    where = f"{field}: its value" if field else "request body"
    return APIError(400, f"{where} is JSON nested deeper than the parser's limit (about "
                    f"{limit} levels of arrays and objects)", param=field or None,
                    code="json_too_deep")  # fmt: skip


def _deep_field(body: bytes) -> str | None:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    decoder = json.JSONDecoder()
    i = _skip(text, 0)
    if not text.startswith("{", i):
        return None
    i = _skip(text, i + 1)
    while i < len(text) and text[i] == '"':
        try:
            key, i = decoder.raw_decode(text, i)
            i = _skip(text, _skip(text, i) + 1)  # past the colon
            _, i = decoder.raw_decode(text, i)
        except RecursionError:
            return key
        except ValueError:
            return None
        i = _skip(text, i)
        i = _skip(text, i + 1) if text.startswith(",", i) else i
    return None


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i
