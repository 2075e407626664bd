"""Pure-ASGI middleware: per-status request counts, API-key check, request-body size limit.

They wrap `receive`/`send` rather than subclassing BaseHTTPMiddleware so streaming responses
and client-disconnect messages pass through untouched.
"""

from __future__ import annotations

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


class APIKeyGuard:
    """Answers 401 to `/v1/*` requests without `Authorization: Bearer <api_key>`."""

    def __init__(self, app: Any, api_key: str, prefix: str = "/v1") -> None:
        self.app = app
        self.api_key = api_key.encode()
        self.prefix = prefix

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self.prefix):
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
    """Answers 413 when a request body exceeds `max_bytes`; otherwise replays the read body."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = _int_or_none(headers.get(b"content-length"))
        if declared is not None and declared > self.max_bytes:
            await _drain(receive, _DRAIN_LIMIT)
            await self._reject(send, declared)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                if message.get("more_body", False):
                    await _drain(receive, _DRAIN_LIMIT)
                await self._reject(send, size)
                return
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(b"".join(chunks), receive), send)

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
