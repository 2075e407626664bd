"""A new user's first run (issue 16, item 7): typos error before torch is imported, vLLM's
`--dtype` spellings, `hyla --version`, the start-up line, a checkpoint without a tokenizer, the
real port of `serve --port 0`, and the CPU thread policy.

Oracles: exit codes and messages naming the field; `sys.modules` of the erroring process (no
torch); the engine's own cache plan for the start-up line; the port the server answers on.
Times are asserted loosely (< 10 s; the figures are in bench/first_run_cpu.py)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
from typer.testing import CliRunner

from hyla.cli import app
from hyla.config import EngineConfig
from hyla.engine.startup import apply_cpu_threads, cpu_threads, startup_line, tokenizer_notices
from tests.server.conftest import TOKENIZER_DIR

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
# Runs the CLI, then reports on stderr whether torch was imported by the time it exited.
PROBE = (
    "import sys\nfrom hyla.cli import app\ntry:\n    app(sys.argv[1:])\nfinally:\n"
    "    print('torch imported:', 'torch' in sys.modules, file=sys.stderr)\n"
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny Qwen3-Next HF checkpoint with the default model's tokenizer."""
    from tests.hf_tiny import save_tiny_hf_model

    path = tmp_path_factory.mktemp("ckpt")
    save_tiny_hf_model("qwen3_next", path, vocab_size=8192)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER_DIR / name, path / name)
    return path


@pytest.fixture(scope="module")
def no_tokenizer(checkpoint, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("no_tok")
    for f in checkpoint.iterdir():
        if not f.name.startswith("tokenizer"):
            shutil.copy(f, path / f.name)
    return path


def probe(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    return proc, time.monotonic() - start


@pytest.mark.parametrize(
    "args,needle",
    [(["generate", "/nonexistent/model", "hi"], "/nonexistent/model does not exist"),
     (["generate", "/", "hi"], "no config.json"),
     (["serve", "/", "--port", "0"], "no config.json"),
     (["generate", "hi", "--dtype", "bogus"], "dtype:"),
     (["generate", "hi", "--max-num-seqs", "0"], "max_num_seqs:"),
     (["serve", "--port", "0", "--block-size", "0"], "block_size:"),
     (["generate", "hi", "--tokenizer", "/nonexistent/tok"], "tokenizer:"),
     (["generate", "hi", "--top-p", "7"], "top_p"),
     (["validate", "/nonexistent/model"], "/nonexistent/model does not exist"),
     (["validate", "--checks", "precisoin"], "checks: unknown ['precisoin']"),
     (["inspect", "/nonexistent/model"], "no config.json at /nonexistent/model"),
     (["inspect", "/nonexistent/config.json", "--gaps"], "no config.json at /nonexistent"),
     (["plan", "/"], "no config.json at /config.json")],
    ids=["missing-path", "no-config", "serve-no-config", "dtype", "option-value", "serve-option",
         "tokenizer-dir", "sampling", "validate-missing-path", "validate-check-name",
         "inspect-missing-path", "gaps-missing-path", "plan-no-config"],
)  # fmt: skip
def test_typos_error_before_torch_is_imported(args, needle):
    proc, elapsed = probe(*args)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr
    assert "torch imported: False" in proc.stderr
    assert elapsed < 10


def test_validate_without_matplotlib_fails_before_running_checks(monkeypatch, tmp_path):
    """`pip install -e .` has no matplotlib (the `validate` extra): the plotted checks used to
    run for a minute and then each crash; now validate stops at once and says what to install,
    and checks that draw no plot still run."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # find_spec: not installed
    result = CliRunner().invoke(app, ["validate", "--quick", "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "matplotlib" in result.output and "hyla[validate]" in result.output
    assert "precision, long_context, throughput" in result.output
    assert not any(tmp_path.iterdir())  # no check ran, no report written
    result = CliRunner().invoke(app, ["validate", "--checks", "vision", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "skipped" in result.output


def test_checkpoint_without_tokenizer_fails_generate_before_torch(no_tokenizer):
    proc, _ = probe("generate", str(no_tokenizer), "hi")
    assert proc.returncode == 2
    assert "has no tokenizer" in proc.stderr and "--tokenizer" in proc.stderr
    assert "torch imported: False" in proc.stderr


def test_version_without_torch():
    proc, elapsed = probe("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip().startswith("hyla 0.")
    assert "torch imported: False" in proc.stderr and elapsed < 10


@pytest.mark.parametrize(
    "given,dtype", [("auto", None), ("half", "float16"), ("float", "float32"),
                    ("float16", "float16"), ("bfloat16", "bfloat16")],
)  # fmt: skip
def test_dtype_spellings_as_vllm(given, dtype):
    assert EngineConfig.from_kwargs(dtype=given).dtype == dtype


def test_generate_with_dtype_auto_prints_the_startup_line(checkpoint):
    args = ["generate", str(checkpoint), "def f(", "--dtype", "auto", "--max-tokens", "2"]
    result = CliRunner().invoke(app, [*args, "--kv-cache-memory", str(8 << 20)])
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("hyla: model"))
    for part in ("device cpu", "dtype float32", "blocks x 16 =", "state slots", "CPU thread"):
        assert part in line, line


def test_startup_line_reports_the_cache_plan(checkpoint):
    from hyla.engine.llm import LLM

    llm = LLM(str(checkpoint), kv_cache_memory=8 << 20, max_model_len=256)
    plan = llm.engine.cache_plan
    line = startup_line(llm.engine)
    tokens = plan.num_usable_blocks * plan.block_size
    assert f"cache {plan.num_usable_blocks} blocks x {plan.block_size} = {tokens} tokens" in line
    assert f"{plan.num_usable_slots} state slots" in line and "max_model_len 256" in line


def test_startup_line_names_fp8_weights_and_cache(checkpoint):
    """`--quantization fp8 --kv-cache-dtype fp8` used to print the same line as a bf16 run."""
    from hyla.engine.llm import LLM

    llm = LLM(str(checkpoint), quantization="fp8", kv_cache_dtype="fp8",
              kv_cache_memory=8 << 20, max_model_len=256)  # fmt: skip
    assert llm.engine.model_config.kv_cache_dtype == "fp8"
    line = startup_line(llm.engine)
    assert "fp8 weights" in line and "kv cache fp8" in line, line
    plain = startup_line(LLM(str(checkpoint), kv_cache_memory=8 << 20, max_model_len=256).engine)
    assert "fp8" not in plain and "kv cache" not in plain, plain


def test_tokenizer_notices():
    class Engine:
        def __init__(self, tokenizer):
            self.tokenizer = tokenizer

    class NoTemplate:
        chat_template = None

    class WithTemplate:
        chat_template = "{{ messages }}"

    assert "no tokenizer" in tokenizer_notices(Engine(None))[0]
    assert "fallback" in tokenizer_notices(Engine(NoTemplate()))[0]
    assert tokenizer_notices(Engine(WithTemplate())) == []


def test_thread_policy():
    assert cpu_threads(256, {}) == 1
    assert cpu_threads(4096, {}) is None  # large models keep torch's count
    assert cpu_threads(256, {"OMP_NUM_THREADS": "2"}) is None  # the user's choice wins
    assert cpu_threads(256, {"MKL_NUM_THREADS": "4"}) is None


def test_small_cpu_engine_runs_one_thread(checkpoint):
    from hyla.engine.llm_engine import LLMEngine

    engine = LLMEngine.from_path(str(checkpoint), kv_cache_memory=8 << 20, max_model_len=256)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        if any(os.environ.get(v) for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")):
            assert apply_cpu_threads(engine) == 2  # the user's setting is kept
        else:
            assert apply_cpu_threads(engine) == 1
    finally:
        torch.set_num_threads(before)


def test_serve_port_0_prints_the_real_port_and_warns_without_tokenizer(no_tokenizer):
    cmd = [sys.executable, "-m", "hyla.cli", "serve", str(no_tokenizer), "--port", "0",
           "--kv-cache-memory", str(8 << 20), "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        deadline = time.monotonic() + 90
        while not any("serving" in x for x in lines):
            assert proc.poll() is None and time.monotonic() < deadline, lines
            lines.append(proc.stderr.readline())
        serving = next(x for x in lines if "serving" in x)
        port = int(serving.rsplit(":", 1)[1].split("/")[0])
        assert port != 0
        assert any("warning: this model has no tokenizer" in x for x in lines), lines
        assert any(x.startswith("hyla: model") for x in lines), lines
        deadline = time.monotonic() + 30
        while True:
            try:
                assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
