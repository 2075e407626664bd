"""Connection limits under uvicorn's h11 protocol: a request-head deadline, a connection cap,
TCP_NODELAY.

uvicorn times out only idle kept-alive connections (`timeout_keep_alive`, and only after a
first response): a connection that sends its request line and headers a byte at a time, or
nothing at all, is held forever, and a few hundred of them exhaust the process's file
descriptors (every later accept fails with EMFILE, so every client is refused). Here:

- a connection has `header_timeout` seconds to deliver a request head, counted from its
  accept, or on a kept-alive one from the first byte of its next request (until then
  uvicorn's `timeout_keep_alive` closes it); then it is answered 408 (bytes of the head came)
  or closed (none did); the body has its own deadline (`middleware.BodyLimit`);
- at most `max_connections` are open: an accepted connection over the cap evicts the one that
  has waited longest without a request in progress (idle, or still sending its head: a
  client that sends its request at once is never in that state for long, a slow-header one
  is), or is closed itself when every other connection has a request in progress;
- TCP_NODELAY is set on every accepted connection: asyncio sets it only on sockets created
  with `proto=IPPROTO_TCP`, which a socket bound by hand (`launch.bind_socket`) is not, and
  without it each response on a kept-alive connection waited ~40 ms (Nagle's algorithm against
  the client's delayed ACK).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
from dataclasses import dataclass, field
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger("hyla.server")

# File descriptors kept free of connections for the model files, the engine core's sockets,
# logs and the listener.
FD_RESERVE = 128
# The soft RLIMIT_NOFILE the server raises itself to (never above the hard limit).
FD_TARGET = 65536
_TIMEOUT_BODY = b"request head not received in time"
_TIMEOUT_ANSWER = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_TIMEOUT_BODY), _TIMEOUT_BODY)
)


@dataclass
class ConnectionGuard:
    """The limits shared by every connection of one server, and the connections waiting for a
    request head (oldest first: dicts keep insertion order)."""

    header_timeout: float
    max_connections: int
    waiting: dict[GuardedH11Protocol, None] = field(default_factory=dict)
    num_evicted: int = 0
    num_timed_out: int = 0


def default_max_connections() -> int:
    """Raise the soft RLIMIT_NOFILE towards `FD_TARGET` (as far as the hard limit allows) and
    return what it leaves for connections."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = FD_TARGET if hard == resource.RLIM_INFINITY else min(FD_TARGET, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    soft = FD_TARGET if soft == resource.RLIM_INFINITY else soft
    return max(16, soft - FD_RESERVE)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's H11Protocol with a request-head deadline, a connection cap and TCP_NODELAY
    (see the module docstring). Built by `protocol_factory`."""

    def __init__(self, *args: Any, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.guard = guard
        self.head_deadline: asyncio.TimerHandle | None = None
        self.has_head_bytes = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:  # the client already reset the connection
                pass
        self._await_head()
        self._start_deadline()
        if len(self.connections) > self.guard.max_connections:
            self._shed()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_done()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self in self.guard.waiting:
            self.has_head_bytes = True
            if self.head_deadline is None:  # kept alive: the next request's head begins
                self._start_deadline()
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the head is in (or the request failed)
            self._head_done()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._await_head()  # idle: uvicorn's keep-alive timer closes it, if nothing comes

    def _await_head(self) -> None:
        self.has_head_bytes = False
        self.guard.waiting[self] = None

    def _start_deadline(self) -> None:
        self.head_deadline = self.loop.call_later(self.guard.header_timeout, self._expire)

    def _head_done(self) -> None:
        if self.head_deadline is not None:
            self.head_deadline.cancel()
            self.head_deadline = None
        self.guard.waiting.pop(self, None)

    def _expire(self) -> None:
        self.head_deadline = None
        self.guard.waiting.pop(self, None)
        self.guard.num_timed_out += 1
        self._close(answer=self.has_head_bytes)

    def _shed(self) -> None:
        oldest = next((p for p in self.guard.waiting if p is not self), self)
        self.guard.num_evicted += 1
        if self.guard.num_evicted in (1, 10, 100) or self.guard.num_evicted % 1000 == 0:
            logger.warning(
                "%d connections open (max_connections %d): closed %d waiting for a request "
                "head so far",
                len(self.connections),
                self.guard.max_connections,
                self.guard.num_evicted,
            )
        oldest._head_done()
        oldest._close(answer=False)

    def _close(self, answer: bool) -> None:
        if self.transport.is_closing():
            return
        if answer:
            self.transport.write(_TIMEOUT_ANSWER)
        self.transport.close()


def protocol_factory(guard: ConnectionGuard) -> Any:
    """The `http` protocol class argument of `uvicorn.Config` for connections under `guard`."""

    def make(*args: Any, **kwargs: Any) -> GuardedH11Protocol:
        return GuardedH11Protocol(*args, guard=guard, **kwargs)

    return make
