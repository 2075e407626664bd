"""Bad tensor-parallel configurations fail before any process starts or any weight is read;
a rank that hangs fails the engine's step within the collective timeout.

Oracles: the error names the field and the limit; no child process was started; the clock.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest

from hyla.config import ConfigError, EngineConfig
from hyla.distributed.executor import check_devices
from hyla.distributed.groups import ExecutorError
from hyla.distributed.sharding import check_parallel
from hyla.models.loader import load_config
from hyla.request import SamplingParams
from tests.distributed.tp_util import engine
from tests.hf_tiny import save_tiny_hf_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3_next")
    save_tiny_hf_model("qwen3_next", path)
    return path


@pytest.mark.parametrize(
    "tp,ep,field",
    [(3, False, "linear.num_k_heads=2"), (4, False, "linear.num_k_heads=2"),
     (2, True, None), (0, False, ">= 1")],
)  # fmt: skip
def test_bad_sizes_name_the_field_before_any_process(qwen, tp, ep, field, monkeypatch):
    def no_weights(*args, **kwargs):
        raise AssertionError("a weight was read")

    monkeypatch.setattr("safetensors.safe_open", no_weights)
    if field is None:  # a valid configuration: check_parallel passes
        check_parallel(load_config(qwen), tp, ep)
        return
    with pytest.raises(ConfigError, match="tensor_parallel_size") as e:
        engine(qwen, tensor_parallel_size=tp, enable_expert_parallel=ep)
    assert field in str(e.value)
    assert not multiprocessing.active_children()


def test_bad_checkpoint_fails_before_any_process(tmp_path):
    from safetensors.torch import load_file, save_file

    from hyla.models.checkpoint import CheckpointError

    save_tiny_hf_model("qwen3_next", tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["model.layers.0.linear_attn.out_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="out_proj"):
        engine(tmp_path, tensor_parallel_size=2)
    assert not multiprocessing.active_children()


def test_options_the_executor_lacks_are_refused_before_any_process(qwen):
    with pytest.raises(ConfigError, match="piecewise_cuda_graphs"):
        engine(qwen, tensor_parallel_size=2, piecewise_cuda_graphs=True)
    with pytest.raises(ConfigError, match="quantization"):  # fp8 at load: not under TP yet
        engine(qwen, tensor_parallel_size=2, quantization="fp8")
    assert not multiprocessing.active_children()


def test_experts_not_divisible_names_num_experts(qwen):
    config = load_config(qwen)
    moe = config.moe.__class__(**{**config.moe.__dict__, "num_experts": 5})
    with pytest.raises(ConfigError, match=r"moe.num_experts=5"):
        check_parallel(config.replace(moe=moe), 2, True)


def test_more_ranks_than_gpus_names_the_count():
    config = EngineConfig.from_kwargs(tensor_parallel_size=64, device="cuda")
    with pytest.raises(ConfigError, match=r"tensor_parallel_size: 64 ranks need 64 GPUs"):
        check_devices(config)


def test_mismatched_gpus_name_the_kinds(monkeypatch):
    monkeypatch.setattr("torch.cuda.device_count", lambda: 2)
    monkeypatch.setattr("torch.cuda.get_device_name", lambda i: ["H200", "A100"][i])
    config = EngineConfig.from_kwargs(tensor_parallel_size=2, device="cuda")
    with pytest.raises(ConfigError, match=r"GPUs of one kind, found \['A100', 'H200'\]"):
        check_devices(config)


def test_uni_backend_refuses_more_ranks():
    with pytest.raises(ConfigError, match="distributed_executor_backend"):
        EngineConfig.from_kwargs(tensor_parallel_size=2, distributed_executor_backend="uni")


def test_hung_rank_fails_the_step_within_the_timeout(qwen, monkeypatch):
    monkeypatch.setenv("HYLA_COLLECTIVE_TIMEOUT", "3")
    eng = engine(qwen, tensor_parallel_size=2)
    (pid,) = eng.executor.worker_pids
    try:
        eng.add_request("a", list(range(3, 20)), SamplingParams(temperature=0, max_tokens=4))
        os.kill(pid, signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(ExecutorError):
            for _ in range(10):
                eng.step()
        took = time.monotonic() - start
        with pytest.raises(ExecutorError):  # failed for good: no step runs any more
            eng.step()
    finally:
        os.kill(pid, signal.SIGCONT)
        eng.shutdown()
    assert took < 3 + 10
    assert not multiprocessing.active_children()


def test_llm_with_a_config_refuses_tensor_parallel():
    from hyla import LLM

    with pytest.raises(ConfigError, match="tensor_parallel_size: each rank reads"):
        LLM(load_config(ROOT / "hyla" / "assets" / "default_model"), tensor_parallel_size=2)


def test_inspect_prints_bytes_per_rank(qwen):
    """Oracle: the full model's figures from the same command; linear state and the GQA cache
    split in two (2 KV heads over 2 ranks)."""
    from typer.testing import CliRunner

    from hyla.cli import app

    runner = CliRunner()
    full = runner.invoke(app, ["inspect", str(qwen)])
    both = runner.invoke(app, ["inspect", str(qwen), "--tensor-parallel-size", "2"])
    assert full.exit_code == both.exit_code == 0, both.output
    assert both.output.startswith(full.output)
    per_rank = both.output[len(full.output) :]
    assert "per rank (tensor parallel 2)" in per_rank
    assert "linear state  8.25 KiB per sequence" in per_rank and "16.50 KiB per seq" in full.output
    assert "kv cache      128 B per token" in per_rank and "256 B per token" in full.output
    bad = runner.invoke(app, ["inspect", str(qwen), "--tensor-parallel-size", "3"])
    assert bad.exit_code == 2 and "linear.num_k_heads=2" in bad.output


def test_ranks_agree_on_the_smallest_pools():
    """`TPGroup.min_ints` (what `Worker.plan_cache` takes over the ranks' own plans): every rank
    gets the element-wise minimum of what each offered."""
    from hyla.distributed.groups import free_port
    from tests.distributed.tp_util import min_ints_rank

    ctx = multiprocessing.get_context("forkserver")  # the executor's: warm after its tests
    queue = ctx.Queue()
    offers = [[120, 9, 40], [100, 9, 44], [130, 7, 50]]
    init = f"tcp://127.0.0.1:{free_port()}"
    procs = [ctx.Process(target=min_ints_rank, args=(r, 3, init, v, queue)) for r, v in
             enumerate(offers)]  # fmt: skip
    for p in procs:
        p.start()
    got = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
    assert got == {r: [100, 7, 40] for r in range(3)}
