"""The `hyla` CLI: generated options, `serve` as a real process (SIGTERM drain), `generate`,
`bench serve` against a live server.

Oracles: the config dataclasses' fields (every scalar field is an option), the server's own
answers (bench token counts equal the usage it reports), process exit codes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import typing
from pathlib import Path

import httpx
import openai
import pytest
from typer.testing import CliRunner

from hyla.cli import app
from hyla.cli_options import _scalar_type
from hyla.config import CacheConfig, EngineConfig, SchedulerConfig
from tests.server.conftest import TOKENIZER_DIR

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny Qwen3-Next HF checkpoint with the default model's tokenizer."""
    from tests.hf_tiny import save_tiny_hf_model

    path = tmp_path_factory.mktemp("ckpt")
    save_tiny_hf_model("qwen3_next", path, vocab_size=8192)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER_DIR / name, path / name)
    return path


def test_help_lists_commands():
    result = runner.invoke(app, ["--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0
    for command in ("serve", "generate", "inspect", "bench"):
        assert command in result.output


def test_serve_options_are_generated_from_config_fields():
    # at 80 columns: every option's whole name (a rich table once cut the long ones to "--stat…")
    result = runner.invoke(app, ["serve", "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0
    assert max(len(line) for line in result.output.splitlines()) <= 80
    for cls in (EngineConfig, CacheConfig, SchedulerConfig):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if _scalar_type(hints[f.name]) is not None:
                assert "--" + f.name.replace("_", "-") in result.output, f.name
    for fixed in ("--host", "--port", "--api-key", "--served-model-name", "--request-timeout"):
        assert fixed in result.output


def test_bad_engine_option_is_a_clean_error(checkpoint):
    result = runner.invoke(app, ["generate", str(checkpoint), "Hi", "--block-size", "0"])
    assert result.exit_code == 2
    assert "block_size" in result.output


def test_serve_on_a_busy_port_fails_before_loading(checkpoint, monkeypatch):
    import socket

    from hyla import cli

    monkeypatch.setattr(cli, "_load_engine", lambda *a: pytest.fail("loaded the model"))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = runner.invoke(app, ["serve", str(checkpoint), "--port", str(port)])
    assert result.exit_code == 2
    assert f"--port {port}" in result.output and "cannot listen" in result.output


def test_generate_streams_text(checkpoint):
    result = runner.invoke(app, ["generate", str(checkpoint), "Hello", "--max-tokens", "5",
                                 "--kv-cache-memory", str(16 << 20)])
    assert result.exit_code == 0, result.output
    assert "5 generated" in result.output and "finish_reason=length" in result.output


def _free_port() -> int:
    from hyla.server.launch import bind_socket

    with bind_socket("127.0.0.1", 0) as sock:
        return sock.getsockname()[1]


def test_serve_process_answers_and_drains_on_sigterm(checkpoint):
    port = _free_port()
    cmd = [sys.executable, "-m", "hyla.cli", "serve", str(checkpoint), "--port", str(port),
           "--served-model-name", "tiny", "--kv-cache-memory", str(16 << 20),
           "--log-level", "warning"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.1)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        r = client.chat.completions.create(model="tiny", max_tokens=3,
                                           messages=[{"role": "user", "content": "Hi"}])
        assert r.usage.completion_tokens == 3
        stream = iter(client.completions.create(model="tiny", prompt="Hi", max_tokens=30,
                                                stream=True, extra_body={"ignore_eos": True}))
        first = next(stream)
        proc.send_signal(signal.SIGTERM)
        rest = list(stream)
        assert rest[-1].choices[0].finish_reason == "length"
        assert len([first, *rest]) >= 2
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def test_bench_serve_against_live_server(server, tmp_path):
    out = tmp_path / "bench.json"
    result = runner.invoke(app, ["bench", "serve", "--url", server.url, "--num-requests", "8",
                                 "--concurrency", "4", "--input-len", "8", "--output-len", "4",
                                 "--json", str(out)])
    assert result.exit_code == 0, result.output
    for metric in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_s", "output throughput"):
        assert metric in result.output
    data = json.loads(out.read_text())
    assert data["num_ok"] == 8 and data["num_failed"] == 0
    assert data["output_tokens"] == 8 * 4
    assert data["percentiles"]["ttft_ms"]["p50"] > 0


def test_bench_serve_fails_when_no_request_succeeds(server):
    result = runner.invoke(app, ["bench", "serve", "--url", server.url, "--model", "nope",
                                 "--num-requests", "2", "--input-len", "4", "--output-len", "2"])
    assert result.exit_code == 2
    assert "all 2 requests failed" in result.output and "404" in result.output


def test_bench_serve_without_the_api_key_says_so(make_server):
    server = make_server(api_key="s3cret")
    result = runner.invoke(app, ["bench", "serve", "--url", server.url, "--num-requests", "1"])
    assert result.exit_code == 2
    assert "answered 401" in result.output and "cannot reach" not in result.output


def test_bench_serve_takes_the_url_serve_prints():
    """`hyla serve` prints its base URL with /v1: bench serve takes it as it is."""
    from hyla.bench_serve import BenchConfig

    for url in ("http://h:8000/v1", "http://h:8000/v1/", "http://h:8000", "http://h:8000/"):
        assert BenchConfig(url=url).url == "http://h:8000"
