"""What a new user tripped over in the first hour (issue 41, item 6).

Oracles: exit codes and messages naming the option; byte counts by their unit's definition;
vLLM's definition of `gpu_memory_utilization` (fraction of the device's total memory, less
what is in use) on a stubbed device; the tokenizer's own rendering of a template; uvicorn's
access-log line in the server's output; transformers' warning text absent from stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
from typer.testing import CliRunner

from hyla.assets import default_model_path
from hyla.config import CacheConfig, ConfigError, EngineConfig
from hyla.engine.loading import load_tokenizer
from hyla.engine.memory import memory_budget
from hyla.engine.startup import load_chat_template

ROOT = Path(__file__).resolve().parents[1]
GiB = 2**30


def _cli(*args: str):
    from hyla.cli import app

    return CliRunner().invoke(app, list(args))


def test_generate_with_a_directory_and_no_prompt_is_an_error(tmp_path):
    result = _cli("generate", str(tmp_path))
    assert result.exit_code == 2
    assert "PROMPT: missing" in result.output and str(tmp_path) in result.output


@pytest.mark.parametrize("text,expected", [
    ("8GiB", 8 * GiB), ("8G", 8 * GiB), ("8g", 8 * GiB), ("512MiB", 512 * 2**20),
    ("8GB", 8 * 10**9), ("1.5GiB", 3 * GiB // 2), ("123456", 123456), (4096, 4096),
])  # fmt: skip
def test_kv_cache_memory_takes_sizes(text, expected):
    assert EngineConfig.from_kwargs(kv_cache_memory=text).cache.kv_cache_memory == expected


@pytest.mark.parametrize("text", ["8 parsecs", "GiB", "-1G", ""])
def test_kv_cache_memory_rejects_what_is_not_a_size(text):
    with pytest.raises(ConfigError, match="kv_cache_memory"):
        EngineConfig.from_kwargs(kv_cache_memory=text)


def test_cli_kv_cache_memory_in_gib_serves():
    result = _cli("generate", "def f():", "--max-tokens", "2", "--kv-cache-memory", "64MiB",
                  "--max-model-len", "1024")
    assert result.exit_code == 0, result.output


def test_missing_local_media_directory_is_an_error_at_start(tmp_path):
    missing = str(tmp_path / "nope")
    with pytest.raises(ConfigError, match="allowed_local_media_path"):
        EngineConfig.from_kwargs(allowed_local_media_path=missing)
    assert EngineConfig.from_kwargs(allowed_local_media_path=str(tmp_path))
    result = _cli("serve", "--allowed-local-media-path", missing, "--port", "0")
    assert result.exit_code == 2 and "allowed_local_media_path" in result.output


def test_gpu_memory_utilization_is_vllms_fraction_of_total_memory(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (60 * GiB, 100 * GiB))
    cache = CacheConfig(gpu_memory_utilization=0.9)
    assert memory_budget(cache, "cuda") == 90 * GiB - 40 * GiB  # 40 GiB already in use
    with pytest.raises(ConfigError, match="gpu_memory_utilization.*leaves nothing"):
        memory_budget(CacheConfig(gpu_memory_utilization=0.3), "cuda")
    with pytest.raises(ConfigError, match="gpu_memory_utilization: a GPU option"):
        memory_budget(cache, "cpu")
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        CacheConfig(gpu_memory_utilization=1.5)


TEMPLATE = "{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}"


def test_chat_template_path_or_inline(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text(TEMPLATE)
    assert load_chat_template(str(path)) == TEMPLATE
    assert load_chat_template(TEMPLATE) == TEMPLATE
    assert load_chat_template("a\\nb{{ x }}") == "a\nb{{ x }}"  # escapes decoded, as vLLM's
    with pytest.raises(ConfigError, match="chat_template: .* looks like a file path"):
        load_chat_template(str(tmp_path / "missing.jinja"))


def test_engine_renders_chats_with_the_given_template():
    from hyla.engine.llm_engine import LLMEngine

    engine = LLMEngine.from_path(None, chat_template=TEMPLATE, max_model_len=256)
    chat = [{"role": "user", "content": "hi"}]
    assert engine.tokenizer.apply_chat_template(chat, tokenize=False) == "<<hi>>"


def test_inspect_shows_the_cache_dtype_serve_uses(tmp_path):
    from transformers import AutoConfig

    AutoConfig.for_model("qwen3_next", dtype="bfloat16").save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    served = _cli("inspect", str(tmp_path), "--dtype", "float32")
    stored = _cli("inspect", str(tmp_path), "--dtype", "bfloat16")
    assert "(float32, attention" in served.output and "(bfloat16, attention" in stored.output
    if not torch.cuda.is_available():  # serve loads float32 on the CPU
        assert _cli("inspect", str(tmp_path)).output == served.output

    def per_token(output: str) -> str:
        return next(line for line in output.splitlines() if line.startswith("kv cache")).split()[2]

    assert float(per_token(served.output)) == 2 * float(per_token(stored.output))


def test_long_prompt_tokenization_prints_no_transformers_length_warning(capfd):
    tokenizer = load_tokenizer(default_model_path())
    ids = tokenizer("x = 1\n" * 12000)["input_ids"]
    assert len(ids) > tokenizer.model_max_length  # the warning's condition holds
    assert "Token indices sequence length" not in capfd.readouterr().err


def test_serve_prints_an_access_log_line_per_request():
    """On by default, as vLLM's server (uvicorn's access log); --disable-uvicorn-access-log
    turns it off (the option reaches uvicorn's config)."""
    from hyla.server.launch import make_server

    cmd = [sys.executable, "-m", "hyla.cli", "serve", "--port", "0", "--max-model-len", "256"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    # uvicorn writes its access log to stdout, the rest to stderr
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        url = None
        for line in proc.stdout:
            if "on http://" in line:
                url = line.split("on ")[-1].strip().removesuffix("/v1")
            if "Application startup complete" in line:
                break
        assert url is not None
        body = {"model": "default", "prompt": "def f():", "max_tokens": 2}
        assert httpx.post(f"{url}/v1/completions", json=body, timeout=60).status_code == 200
        deadline = time.monotonic() + 30
        line = ""
        while '"POST /v1/completions HTTP/1.1" 200' not in line:
            assert time.monotonic() < deadline
            line = proc.stdout.readline()
    finally:
        proc.kill()
        proc.wait()
    assert make_server(object(), None, access_log=False).config.access_log is False
