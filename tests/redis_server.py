"""A throwaway redis-server on a free port for tests (the Debian package `redis-server`;
.ci/run installs it), and a TCP server that accepts and never answers (a hung store)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

NO_REDIS = "redis-server not installed (apt-get install redis-server; .ci/run does)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def redis_server() -> Iterator[str]:
    """Yields `redis://127.0.0.1:PORT/0` of a fresh server (no persistence); skips the test
    when the binary is missing."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip(NO_REDIS)
    pytest.importorskip("redis", reason="the `redis` client (the dev extra) is not installed")
    import redis

    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(url)
        for _ in range(200):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.02)
        else:
            raise RuntimeError("redis-server did not start")
        client.close()
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextmanager
def silent_server() -> Iterator[str]:
    """A store that accepts connections and never replies: every call times out."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    conns: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.1)
        while not stop.is_set():
            try:
                conns.append(sock.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"redis://127.0.0.1:{sock.getsockname()[1]}/0"
    finally:
        stop.set()
        thread.join()
        for c in conns:
            c.close()
        sock.close()
