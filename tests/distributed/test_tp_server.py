"""`hyla serve --tensor-parallel-size 2` (embedded model, CPU, gloo) as a real process.

Oracles: the plain in-process engine's greedy completion of the same prompt (TP=1, no
executor); for faults, what a streaming client receives (an error event, never a hang), the
server's exit code and how long it takes to exit, and whether the ranks' processes are gone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "def fibonacci(n):"
EXIT_BOUND_S = 30.0


def _free_port() -> int:
    from hyla.server.launch import bind_socket

    with bind_socket("127.0.0.1", 0) as sock:
        return sock.getsockname()[1]


class Server:
    """`hyla serve` in a subprocess; its output collected in `log`."""

    def __init__(self, *args: str) -> None:
        self.port = _free_port()
        cmd = [sys.executable, "-m", "hyla.cli", "serve", "--port", str(self.port),
               "--max-model-len", "512", "--log-level", "warning", *args]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
               "HYLA_COLLECTIVE_TIMEOUT": "20"}  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.log: list[str] = []
        threading.Thread(target=lambda: self.log.extend(self.proc.stdout), daemon=True).start()
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 180
        while True:
            assert self.proc.poll() is None, "".join(self.log)
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.2)

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="none", max_retries=0,
                             timeout=60.0)  # fmt: skip

    def rank_pids(self) -> list[int]:
        """The worker ranks: the children of the fork server the server's engine core started
        (in the engine-core process of its own, or in the server's)."""
        children, ranks, todo = _children(), [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            if _is_fork_server(pid):
                ranks += children.get(pid, [])
            else:
                todo += children.get(pid, [])
        return ranks

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            out.setdefault(ppid, []).append(int(entry.name))
    return out


def _is_fork_server(pid: int) -> bool:
    try:
        return b"forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture(scope="module")
def server():
    s = Server("--tensor-parallel-size", "2")
    yield s
    s.kill()


@pytest.fixture(scope="module")
def reference():
    """The plain engine's greedy completions (TP=1, in this process)."""
    from hyla import LLM, SamplingParams

    llm = LLM(None, max_model_len=512)
    params = SamplingParams(temperature=0, max_tokens=16)
    return llm.generate([PROMPT], params)[0].outputs[0].text


def test_completion_matches_single_process(server, reference):
    client = server.client()
    out = client.completions.create(model="default", prompt=PROMPT, max_tokens=16, temperature=0)
    assert out.choices[0].text == reference
    assert len(server.rank_pids()) == 1


def test_streamed_chat_and_concurrent_requests(server):
    client = server.client()
    messages = [{"role": "user", "content": "Count to five."}]
    whole = client.chat.completions.create(
        model="default", messages=messages, max_tokens=12, temperature=0
    )
    chunks = client.chat.completions.create(
        model="default", messages=messages, max_tokens=12, temperature=0, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    results: list[str] = [""] * 3

    def one(i: int) -> None:
        r = client.completions.create(model="default", prompt=PROMPT, max_tokens=16,
                                      temperature=0)  # fmt: skip
        results[i] = r.choices[0].text

    threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    first = client.completions.create(model="default", prompt=PROMPT, max_tokens=16, temperature=0)
    assert results == [first.choices[0].text] * 3


def test_killed_rank_fails_the_stream_and_the_server_exits():
    s = Server("--tensor-parallel-size", "2")
    try:
        ranks = s.rank_pids()
        assert len(ranks) == 1
        body = {"prompt": PROMPT, "max_tokens": 400, "ignore_eos": True, "stream": True}
        events: list = []
        with httpx.stream("POST", f"{s.url}/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    if len(events) == 3:
                        os.kill(ranks[0], signal.SIGKILL)
                        killed_at = time.monotonic()
        code = s.proc.wait(timeout=EXIT_BOUND_S)
        took = time.monotonic() - killed_at
    finally:
        s.kill()
    assert code == 1
    assert took < EXIT_BOUND_S
    payloads = [json.loads(e) for e in events if e != "[DONE]"]
    assert any("error" in p for p in payloads), events[-3:]
    assert len(payloads) < 100  # ended early, with the error
    assert "exited with code" in "".join(s.log)


def test_sigterm_stops_every_rank():
    s = Server("--tensor-parallel-size", "2")
    try:
        ranks = s.rank_pids()
        assert len(ranks) == 1 and _alive(ranks[0])
        s.proc.send_signal(signal.SIGTERM)
        code = s.proc.wait(timeout=EXIT_BOUND_S)
        deadline = time.monotonic() + 10
        while _alive(ranks[0]) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        s.kill()
    assert code == 0
    assert not _alive(ranks[0])
