"""Run the app under uvicorn with a graceful SIGTERM/SIGINT drain.

Shutdown sequence (first signal):
  1. the engine stops admitting: new completions get 503 "shutting_down" with Retry-After and
     `/health` answers 503 "draining"; the listener stays open so both can be seen;
  2. the requests in flight run to their end, for at most `drain_timeout` seconds (0: none);
  3. then every request still open is ended: a stream gets a final chunk with finish_reason
     "abort" (an error event when it had no token yet) and `data: [DONE]`;
  4. uvicorn closes the listener and the finished connections (after `CLOSE_TIMEOUT` it
     cancels the rest: one never admitted, still uploading or tokenizing, gets a 503), the
     app's shutdown stops the engine thread, and the process exits with code 0 through
     `os._exit`, skipping asyncio's and the interpreter's teardown (waits for busy worker
     threads; seconds of garbage collection over the model's objects).
A second signal exits at once with code 1 (streams are cut).

A tensor-parallel rank that dies or hangs (`hyla.distributed`), or an engine-core process that
dies (`hyla.engine.core_process`), fails the requests in flight with an error; the server then
exits with code 1, at most `EXECUTOR_FAILURE_GRACE` seconds later.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
import sys
import time
from types import FrameType
from typing import Any

import uvicorn

from hyla.server.connections import ConnectionGuard, default_max_connections, protocol_factory

logger = logging.getLogger("hyla.server")

# After the drain, seconds uvicorn lets the remaining connections finish writing (the final
# SSE events, a 503) before it cancels them.
CLOSE_TIMEOUT = 5
# After a tensor-parallel rank failed: seconds the error events get to reach the clients.
EXECUTOR_FAILURE_GRACE = 2.0


class DrainingServer(uvicorn.Server):
    """`uvicorn.Server` that drains the AsyncEngine before uvicorn's own shutdown starts.

    uvicorn's shutdown closes the listening socket first and cuts the responses still open when
    its timeout expires; here uvicorn starts it only once no request is in flight, so it closes
    finished connections only.
    """

    def __init__(
        self, config: uvicorn.Config, async_engine: Any, drain_timeout: float | None = 30.0
    ) -> None:
        super().__init__(config)
        self.async_engine = async_engine
        self.drain_timeout = drain_timeout
        self.drain_started: float | None = None
        self.is_aborting = False
        self.executor_failed_at: float | None = None
        self.connection_guard: ConnectionGuard | None = None  # set by make_server

    def run(self, sockets: list[socket.socket] | None = None) -> None:
        """`serve()` on a fresh event loop, left as it is when it returns: the process exits
        right after (`run_until_signal`). asyncio.run's teardown would first wait for every
        worker thread, e.g. an 8 MB prompt's tokenization (tens of seconds)."""
        loop_factory = self.config.get_loop_factory()
        loop = loop_factory() if loop_factory is not None else asyncio.new_event_loop()
        loop.run_until_complete(self.serve(sockets=sockets))

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain_started is not None or self.should_exit:
            logger.warning("second signal %s: exiting now", sig)
            exit_now(1)
        self.begin_drain(sig)

    def begin_drain(self, sig: int | None = None) -> None:
        """Start the shutdown sequence (what the first SIGTERM/SIGINT does)."""
        self.drain_started = time.monotonic()
        logger.info(
            "signal %s: draining %d request(s) in flight (drain timeout %ss)",
            sig,
            self.async_engine.num_in_flight(),
            self.drain_timeout,
        )
        self.async_engine.begin_drain()

    async def on_tick(self, counter: int) -> bool:
        if self.drain_started is not None and not self.should_exit:
            self._advance_drain()
        self._check_executor()
        return await super().on_tick(counter)

    def _advance_drain(self) -> None:
        num_in_flight = self.async_engine.num_in_flight()
        if num_in_flight == 0:
            self.should_exit = True
            return
        expired = (
            self.drain_timeout is not None
            and time.monotonic() - self.drain_started >= self.drain_timeout
        )
        if expired and not self.is_aborting:
            logger.warning(
                "drain timeout: ending %d request(s) with finish_reason 'abort'", num_in_flight
            )
            self.is_aborting = True
            self.async_engine.abort_all()

    def _check_executor(self) -> None:
        """Exit 1 once the engine cannot go on (its core process or a tensor-parallel rank is
        gone) and the in-flight requests have their errors (or `EXECUTOR_FAILURE_GRACE`
        seconds passed)."""
        check_health = getattr(self.async_engine, "check_health", None)
        if check_health is None:
            return
        now = time.monotonic()
        if self.executor_failed_at is None:
            try:
                check_health()
                return
            except Exception as e:  # noqa: BLE001 - ExecutorError, EngineDeadError, any other
                logger.error("engine failed: %s; exiting", e)
                self.executor_failed_at = now
                self.async_engine.begin_drain()  # new requests get 503 meanwhile
        waited = now - self.executor_failed_at
        if waited >= EXECUTOR_FAILURE_GRACE or (
            waited >= EXECUTOR_FAILURE_GRACE / 4 and self.async_engine.num_in_flight() == 0
        ):
            exit_now(1)


def exit_now(code: int) -> None:
    """Flush the logs and streams, then end the process without the interpreter's teardown.

    Besides its speed, this keeps C++ destructors from running while a torch thread is still
    busy (the engine thread after a forced exit): that aborted the process with SIGABRT
    ("terminate called without an active exception").
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def run_until_signal(server: DrainingServer, sockets: list[socket.socket] | None = None) -> None:
    """`server.run()` (on `sockets` when given, e.g. one bound early to learn port 0's number),
    then exit the process (code 0 after a SIGTERM/SIGINT drain).

    Never returns: the process ends through `exit_now`.
    """
    for sig in (signal.SIGTERM, signal.SIGINT):  # uvicorn installs the same in serve()
        signal.signal(sig, server.handle_exit)
    # The start-up's objects (modules, the engine or its client, the tokenizer) out of the
    # collector's reach: a full collection, which a large body's parse can set off, then walks
    # only the requests' objects (200k start-up objects: ~0.1 s of GIL; vLLM freezes too).
    gc.collect()
    gc.freeze()
    code = 0
    try:
        server.run(sockets=sockets)
    except SystemExit as e:  # uvicorn's startup failure
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        logger.exception("server failed")
        code = 1
    exit_now(code)


def make_server(
    app: Any,
    async_engine: Any,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    drain_timeout: float | None = 30.0,
    access_log: bool = True,
    header_timeout: float = 10.0,
    timeout_keep_alive: int = 5,
    max_connections: int | None = None,
) -> DrainingServer:
    """A DrainingServer for `app` (lifespan on; `drain_timeout` None: wait for every request;
    `access_log`: uvicorn's line per request, as vLLM's server prints).

    `header_timeout`: seconds a connection may take to send a request head (`connections.py`);
    `timeout_keep_alive`: seconds an idle kept-alive connection stays open; `max_connections`:
    open connections at most (None: what RLIMIT_NOFILE leaves, after raising it).
    """
    if max_connections is None:
        max_connections = default_max_connections()
    guard = ConnectionGuard(header_timeout=header_timeout, max_connections=max_connections)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="on",
        timeout_graceful_shutdown=CLOSE_TIMEOUT,
        timeout_keep_alive=timeout_keep_alive,
        http=protocol_factory(guard),
        access_log=access_log,
    )
    server = DrainingServer(config, async_engine, drain_timeout)
    server.connection_guard = guard
    return server


def bind_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket (port 0: a free port; read it with `getsockname()[1]`)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock
