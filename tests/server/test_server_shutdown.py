"""Shutdown of a real `hyla serve` process (embedded model, CPU) under real signals.

Oracles: the SSE bytes each streaming client received (every stream ends with a final event
and `data: [DONE]`, never a cut connection), the HTTP statuses seen while draining, the
process's exit code and the time it takes to exit.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
LONG = {"prompt": "def fibonacci(n):", "max_tokens": 4000, "ignore_eos": True, "stream": True}


def _free_port() -> int:
    from hyla.server.launch import bind_socket

    with bind_socket("127.0.0.1", 0) as sock:
        return sock.getsockname()[1]


@dataclass
class Serve:
    proc: subprocess.Popen
    url: str
    log: list[str] = field(default_factory=list)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)


@pytest.fixture
def serve():
    """Factory: `serve(*args)` starts `hyla serve` (embedded model) and waits for /health."""
    procs: list[Serve] = []

    def start(*args: str) -> Serve:
        port = _free_port()
        cmd = [
            sys.executable,
            "-m",
            "hyla.cli",
            "serve",
            "--port",
            str(port),
            "--max-model-len",
            "4096",
            "--log-level",
            "warning",
            *args,
        ]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        server = Serve(proc, f"http://127.0.0.1:{port}")
        threading.Thread(target=lambda: server.log.extend(proc.stdout), daemon=True).start()
        procs.append(server)
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, "".join(server.log)
            try:
                if httpx.get(f"{server.url}/health", timeout=1).status_code == 200:
                    return server
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.1)

    yield start
    for server in procs:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()


class Stream(threading.Thread):
    """A streaming completion read as raw SSE lines; `events` are the parsed data payloads."""

    def __init__(self, url: str, body: dict, path: str = "/v1/completions") -> None:
        super().__init__(daemon=True)
        self.url, self.body, self.path = url, body, path
        # a chat stream's first event is the role chunk: wait for one with a token too
        self.num_before_first = 2 if "chat" in path else 1
        self.events: list = []
        self.error: BaseException | None = None
        self.first = threading.Event()
        self.start()

    def run(self) -> None:
        try:
            with httpx.stream("POST", f"{self.url}{self.path}", json=self.body, timeout=60) as r:
                assert r.status_code == 200, r.read()
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        data = line[6:]
                        self.events.append(data if data == "[DONE]" else json.loads(data))
                        if len(self.events) >= self.num_before_first:
                            self.first.set()
        except BaseException as e:  # a cut connection shows here
            self.error = e
        self.first.set()

    def finish_reason(self) -> str | None:
        choices = [e["choices"][0] for e in self.events[:-1] if e.get("choices")]
        return choices[-1]["finish_reason"] if choices else None


def _open_streams(server: Serve, num: int, body: dict = LONG) -> list[Stream]:
    streams = [Stream(server.url, body) for _ in range(num)]
    for s in streams:
        assert s.first.wait(60) and s.error is None, s.error
    return streams


def _assert_ended_with(streams: list[Stream], reason: str, timeout: float) -> None:
    for s in streams:
        s.join(timeout)
        assert not s.is_alive(), "stream still open"
        assert s.error is None, f"connection cut: {s.error!r}"
        assert s.events[-1] == "[DONE]", s.events[-3:]
        assert s.finish_reason() == reason, s.events[-3:]


def _stalled_upload(server: Serve) -> socket.socket:
    """A request whose body is still arriving: not admitted, so not a request in flight."""
    host, port = server.url.rsplit("//", 1)[1].split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{")
    return sock


def _read_answer(sock: socket.socket) -> bytes:
    received = b""
    with sock:
        while chunk := sock.recv(4096):
            received += chunk
    return received


def test_drain_timeout_zero_ends_open_streams_at_once(serve):
    """Also: a request still uploading its body when the server closes its connections (it
    was cancelled there) is answered with a JSON 503, not uvicorn's text/plain 500."""
    server = serve("--drain-timeout", "0")
    streams = _open_streams(server, 3)
    chat = {"messages": [{"role": "user", "content": "def f(n):"}], **LONG}
    del chat["prompt"]
    streams.append(Stream(server.url, chat, "/v1/chat/completions"))
    assert streams[-1].first.wait(60) and streams[-1].error is None, streams[-1].error
    upload = _stalled_upload(server)
    start = time.monotonic()
    server.proc.send_signal(signal.SIGINT)
    _assert_ended_with(streams, "abort", timeout=10)
    answer = _read_answer(upload)
    assert answer.startswith(b"HTTP/1.1 503"), answer[:300]
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "shutting_down"
    assert server.wait(timeout=10) == 0
    assert time.monotonic() - start < 10


def test_drain_lets_requests_finish_then_ends_the_rest(serve):
    server = serve("--drain-timeout", "4")
    whole: list[httpx.Response] = []
    body = {**LONG, "stream": False}
    waiter = threading.Thread(
        target=lambda: whole.append(
            httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
        ),
        daemon=True,
    )
    waiter.start()
    long = _open_streams(server, 3)
    short = _open_streams(server, 1, {**LONG, "max_tokens": 8})
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    health = httpx.get(f"{server.url}/health", timeout=5)
    assert health.status_code == 503 and health.json()["status"] == "draining"
    refused = httpx.post(
        f"{server.url}/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=5
    )
    assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
    assert refused.json()["error"]["code"] == "shutting_down"
    _assert_ended_with(short, "length", timeout=10)
    _assert_ended_with(long, "abort", timeout=15)
    waiter.join(15)
    assert whole and whole[0].status_code == 200, whole
    choice = whole[0].json()["choices"][0]
    assert choice["finish_reason"] == "abort" and choice["text"]
    assert server.wait(timeout=10) == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_second_signal_exits_at_once(serve, sig):
    """A second SIGTERM used to wait for the whole drain; a second SIGINT (uvicorn's forced
    exit) skipped stopping the engine thread and died with SIGABRT in C++ teardown."""
    server = serve("--drain-timeout", "60")
    streams = _open_streams(server, 2)
    server.proc.send_signal(sig)
    time.sleep(0.5)
    start = time.monotonic()
    server.proc.send_signal(sig)
    assert server.wait(timeout=10) in (0, 1), "".join(server.log)
    assert time.monotonic() - start < 5
    assert "terminate called" not in "".join(server.log)
    for s in streams:
        s.join(10)


def _load(url: str, i: int) -> None:
    """A short completion, or (every third) a stream the client drops after its first event."""
    body = {"prompt": f"def f{i}(n):", "max_tokens": 4}
    if i % 3:
        assert httpx.post(f"{url}/v1/completions", json=body, timeout=60).status_code == 200
        return
    with httpx.stream(
        "POST", f"{url}/v1/completions", json={**body, "max_tokens": 50, "stream": True}, timeout=60
    ) as r:
        next(r.iter_lines())


def test_idle_server_exits_soon_after_sigterm(serve):
    """After some traffic an idle server took 5-13 s to exit, in the interpreter's teardown."""
    server = serve()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: _load(server.url, i), range(48)))
    time.sleep(0.5)
    start = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    assert server.wait(timeout=30) == 0
    assert time.monotonic() - start < 2.0


_BUSY_WORKER_APP = """
import asyncio, sys, time
from fastapi import FastAPI
from hyla.server.launch import make_server, run_until_signal

class Idle:  # the drain interface of the AsyncEngine, with nothing in flight
    def begin_drain(self): pass
    def abort_all(self): pass
    def num_in_flight(self): return 0

app = FastAPI()

@app.get("/busy")
async def busy():  # as a huge prompt's tokenization holds a worker thread
    await asyncio.to_thread(time.sleep, 120)

run_until_signal(make_server(app, Idle(), port=int(sys.argv[1]), log_level="warning"))
"""


def test_exit_does_not_wait_for_busy_worker_threads():
    """After a signal the process waited for every worker thread (asyncio.run's teardown): an
    8 MB prompt's tokenization held the exit for 25 s after the drain had ended."""
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _BUSY_WORKER_APP, str(port)], env=env)
    try:
        url = f"http://127.0.0.1:{port}/busy"
        deadline = time.monotonic() + 60
        while True:  # wait for the listener, then keep a worker thread busy
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
        threading.Thread(target=lambda: httpx.get(url, timeout=60), daemon=True).start()
        time.sleep(1.0)
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        from hyla.server.launch import CLOSE_TIMEOUT

        assert time.monotonic() - start < CLOSE_TIMEOUT + 3
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_engine_shutdown_does_not_wait_for_busy_worker_threads():
    """The engine thread was joined through the default executor: with every worker busy (huge
    prompts being tokenized) the shutdown waited for one of them to finish."""
    from hyla.engine.async_engine import AsyncEngine
    from tests.server.conftest import load_tokenizer, tiny_engine

    async def main() -> float:
        engine = AsyncEngine(tiny_engine(load_tokenizer()))
        engine.start()
        release = threading.Event()
        loop = asyncio.get_running_loop()
        busy = [loop.run_in_executor(None, release.wait, 60) for _ in range(64)]
        try:
            start = time.monotonic()
            await asyncio.wait_for(engine.shutdown(drain=False), 5)
            assert not engine.is_running
            return time.monotonic() - start
        finally:
            release.set()
            await asyncio.gather(*busy)

    assert asyncio.run(main()) < 2


def _children(pid: int) -> set[int]:
    found = set()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            found.add(int(entry))
    return found


def _is_running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except OSError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads child processes from /proc")
@pytest.mark.parametrize("group", [False, True], ids=["sigterm", "ctrl-c"])
def test_sigterm_leaves_no_child_process(group, tmp_path):
    """`hyla serve` starts its engine core in a child process; after SIGTERM, or SIGINT to the
    whole process group (Ctrl-C in a terminal), the server exits 0, no child process outlives
    it, and none prints a KeyboardInterrupt traceback."""
    port = _free_port()
    cmd = [sys.executable, "-m", "hyla.cli", "serve", "--port", str(port), "--max-model-len",
           "4096", "--log-level", "warning"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    log = (tmp_path / "stderr").open("w+")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=log, start_new_session=group)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        children: set[int] = set()
        while not children:  # the core is spawned before /health answers
            assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    children = _children(proc.pid)
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        httpx.post(f"{url}/v1/completions", json={"model": "default", "prompt": "hi",
                                                   "max_tokens": 2}, timeout=60)  # fmt: skip
        if group:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        deadline = time.monotonic() + 10
        while any(_is_running(pid) for pid in children):
            assert time.monotonic() < deadline, f"left behind: {children}"
            time.sleep(0.1)
        time.sleep(0.5)  # the resource tracker warns after the server is gone
        log.seek(0)
        printed = log.read()
        assert "Traceback" not in printed, printed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
