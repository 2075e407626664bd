"""Run the app under uvicorn with a graceful SIGTERM drain.

On SIGTERM/SIGINT the engine stops admitting (new requests get 503), uvicorn closes its listening
socket and lets the responses in flight finish (up to `drain_timeout` seconds), then the app's
shutdown stops the engine thread. A second signal exits at once.
"""

from __future__ import annotations

import logging
import signal
import socket
from types import FrameType
from typing import Any

import uvicorn

logger = logging.getLogger("hyla.server")


class DrainingServer(uvicorn.Server):
    """`uvicorn.Server` that tells the AsyncEngine to stop admitting before shutting down."""

    def __init__(self, config: uvicorn.Config, async_engine: Any) -> None:
        super().__init__(config)
        self.async_engine = async_engine

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.should_exit:
            logger.info("signal %s: draining %d request(s) in flight", sig,
                        self.async_engine.num_in_flight())
        self.async_engine.begin_drain()
        super().handle_exit(sig, frame)


def run_until_signal(server: DrainingServer, sockets: list[socket.socket] | None = None) -> None:
    """`server.run()` (on `sockets` when given, e.g. one bound early to learn port 0's number),
    then exit normally after a SIGTERM/SIGINT drain.

    uvicorn re-raises the signal it caught once it has shut down; with these no-op handlers in
    place that re-raise returns here instead of killing the process (exit code 0, no traceback).
    """
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    server.run(sockets=sockets)


def make_server(
    app: Any,
    async_engine: Any,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    drain_timeout: float = 30.0,
) -> DrainingServer:
    """A DrainingServer for `app` (lifespan on, graceful shutdown bounded by drain_timeout)."""
    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, lifespan="on",
        timeout_graceful_shutdown=int(drain_timeout) or None, access_log=False,
    )
    return DrainingServer(config, async_engine)


def bind_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket (port 0: a free port; read it with `getsockname()[1]`)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock
