"""Pure-ASGI middleware: per-status request counts, a 503 for requests cut by the shutdown,
API-key check, request-body size and time limits.

They wrap `receive`/`send` rather than subclassing BaseHTTPMiddleware so streaming responses
and client-disconnect messages pass through untouched.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from typing import Any

from hyla.server.errors import error_body

Scope = dict[str, Any]

# Bodies beyond the limit are still read (and dropped) up to this size so the client sees the
# 413 instead of a connection reset; larger uploads are cut off.
_DRAIN_LIMIT = 64 << 20


async def send_error(send: Any, status: int, message: str, param: str | None = None,
                     code: str | None = None, headers: dict[str, str] | None = None) -> None:
    body = json.dumps(error_body(status, message, param, code)).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class StatusCounter:
    """Counts responses by route and status code into `metrics.requests`.

    A request that ends without any response (the client went away first, e.g. during the
    upload) counts as 499 (nginx's "client closed request"), not as a server error.
    """

    def __init__(self, app: Any, metrics: Any, routes: set[str]) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = scope["path"] if scope["path"] in self.routes else "other"
        status = {"code": 499}

        async def send_wrapper(message: dict) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        except BaseException:
            if status["code"] == 499:  # failed before answering (uvicorn then sends a 500)
                status["code"] = 500
            raise
        finally:
            self.metrics.requests.labels(route, str(status["code"])).inc()


class ShutdownAnswer:
    """Answers 503 `shutting_down` to a request cancelled before its response started.

    uvicorn cancels the requests still open `CLOSE_TIMEOUT` seconds into its shutdown (one
    still uploading its body or tokenizing a huge prompt: never admitted to the engine, so the
    drain did not wait for it) and would answer them with a text/plain 500.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_wrapper(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        except asyncio.CancelledError:
            if started:
                raise
            # Not re-raised: uvicorn would log it as an application error. Nothing awaits
            # this task after cancelling it.
            await send_error(send, 503, "the server is shutting down: the request was not "
                             "admitted before it closed its connections", code="shutting_down",
                             headers={"Retry-After": "5", "Connection": "close"})


def check_api_key(api_key: str) -> None:
    """Raises ValueError for an empty key (or one with surrounding whitespace, which a
    client's stripped header could never match): auth must not be off by accident."""
    if not api_key.strip() or api_key != api_key.strip():
        raise ValueError("api_key: must be non-empty without surrounding whitespace")


class APIKeyGuard:
    """Answers 401 to requests without `Authorization: Bearer <api_key>`, on every path but
    `open_paths` (`/health`, for load balancers): `/v1/*`, `/metrics`, `/docs` and
    `/openapi.json` too, since metrics and the schema tell an outsider what is served."""

    def __init__(self, app: Any, api_key: str, open_paths: tuple[str, ...] = ("/health",)) -> None:
        self.app = app
        self.api_key = api_key.encode()
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        auth = headers.get(b"authorization", b"")
        scheme, _, token = auth.partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.api_key):
            await self.app(scope, receive, send)
            return
        message = "missing API key" if not auth else "incorrect API key provided"
        await send_error(send, 401, f"{message}: send 'Authorization: Bearer <key>'",
                         code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


class BodyLimit:
    """Answers 413 when a request body exceeds `max_bytes`, 408 when it does not arrive in
    full within `timeout` seconds (a body shorter than its Content-Length would otherwise hold
    the connection forever); otherwise replays the read body."""

    def __init__(self, app: Any, max_bytes: int, timeout: float = 30.0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = _int_or_none(headers.get(b"content-length"))
        try:
            async with asyncio.timeout(self.timeout):
                body = await self._read(receive, send, declared)
        except TimeoutError:
            await send_error(send, 408, f"request body: not received in full within "
                             f"{self.timeout:g} s (Content-Length {declared})",
                             code="request_timeout", headers={"Connection": "close"})
            return
        if body is not None:
            await self.app(scope, _replay(body, receive), send)

    async def _read(self, receive: Any, send: Any, declared: int | None) -> bytes | None:
        """The whole body, or None when answered (413) or the client left."""
        if declared is not None and declared > self.max_bytes:
            await _drain(receive, _DRAIN_LIMIT)
            await self._reject(send, declared)
            return None
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                if message.get("more_body", False):
                    await _drain(receive, _DRAIN_LIMIT)
                await self._reject(send, size)
                return None
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _reject(self, send: Any, size: int) -> None:
        await send_error(send, 413, f"request body of {size} bytes exceeds the limit of "
                         f"{self.max_bytes} bytes", code="request_too_large")


def _int_or_none(raw: bytes | None) -> int | None:
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


async def _drain(receive: Any, limit: int) -> None:
    size = 0
    while size <= limit:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return
        size += len(message.get("body", b""))


def _replay(body: bytes, receive: Any) -> Any:
    sent = False

    async def replay() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
