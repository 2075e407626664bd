"""A small OpenAI-API client for the service checks (httpx), plus starting `hyla serve`."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx


class Client:
    """Completions against `base` (OpenAI-compatible, with or without `/v1`)."""

    def __init__(self, base: str, timeout: float = 120.0) -> None:
        self.root = base.rstrip("/").removesuffix("/v1")
        self.http = httpx.Client(timeout=timeout)
        self.model = self.http.get(f"{self.root}/v1/models").json()["data"][0]["id"]

    def post(self, body: dict[str, Any]) -> httpx.Response:
        return self.http.post(f"{self.root}/v1/completions", json={"model": self.model, **body})

    def complete(self, body: dict[str, Any], retries: int = 60) -> dict[str, Any]:
        """A non-streamed completion; a 503 is retried after its Retry-After (at most 1 s)."""
        r = self.post(body)
        for _ in range(retries):
            if r.status_code != 503:
                break
            time.sleep(min(float(r.headers.get("retry-after", 1)), 1.0))
            r = self.post(body)
        r.raise_for_status()
        return r.json()

    def stream_text(self, body: dict[str, Any], retries: int = 3) -> tuple[str, str | None]:
        """(text, finish_reason) of a stream; "queue_timeout" events are retried, others raise."""
        for _ in range(retries):
            text, reason, error = self._stream_once(body)
            if error is None:
                return text, reason
            if error.get("code") != "queue_timeout":
                break
        raise RuntimeError(f"the stream ended with an error event: {error}")

    def _stream_once(self, body: dict[str, Any]) -> tuple[str, str | None, dict | None]:
        text, reason = [], None
        payload = {"model": self.model, **body, "stream": True}
        with self.http.stream("POST", f"{self.root}/v1/completions", json=payload) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    return "".join(text), reason, event["error"]
                choice = event["choices"][0]
                text.append(choice.get("text") or "")
                reason = choice.get("finish_reason") or reason
        return "".join(text), reason, None

    def metrics(self) -> dict[str, float] | None:
        """hyla's /metrics gauges by name, or None when the server exports none of them."""
        r = self.http.get(f"{self.root}/metrics")
        if r.status_code != 200 or "hyla_num_requests_running" not in r.text:
            return None
        out = {}
        for line in r.text.splitlines():
            if line.startswith("hyla_") and " " in line:
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: Path, args: list[str], log: Path, wait_s: float = 180.0) -> tuple:
    """Start `hyla serve MODEL ARGS` on a free port (retried if raced away); (process, base url)
    once /health answers; RuntimeError when the server exits or never answers."""
    for _ in range(3):
        port = free_port()
        cmd = [sys.executable, "-m", "hyla.cli", "serve", str(model), "--port", str(port), *args]
        with log.open("w") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True)
        base = _wait_healthy(proc, f"http://127.0.0.1:{port}", log, wait_s)
        if base is not None:
            return proc, base
    raise RuntimeError(f"hyla serve could not bind a free port: {log.read_text()[-500:]}")


def _wait_healthy(proc: Any, base: str, log: Path, wait_s: float) -> str | None:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            text = log.read_text()
            if "cannot listen there" in text:
                return None
            raise RuntimeError(f"hyla serve exited {proc.returncode}: {text[-2000:]}")
        try:
            if httpx.get(f"{base}/health", timeout=1.0).status_code == 200:
                return base
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop_server(proc)
    raise RuntimeError(f"hyla serve did not answer /health within {wait_s:.0f} s")


def stop_server(proc: Any) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
