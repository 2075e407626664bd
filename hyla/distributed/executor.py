"""The engine's side of the process boundary: start the ranks, run their `Worker` methods, send
each step's plan, watch their health. Any exception in a collective call is fatal
(`ExecutorError`): the ranks' collectives no longer line up and their caches may disagree."""

from __future__ import annotations

import gc
import logging
import multiprocessing
import multiprocessing.connection
import os
import time
import weakref
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import torch

from hyla.config import ConfigError, EngineConfig, ModelConfig
from hyla.distributed.groups import (
    START_TIMEOUT,
    ExecutorError,
    TPGroup,
    destroy_tp_group,
    free_port,
    init_tp_group,
)
from hyla.distributed.loader import check_checkpoint, load_rank_model
from hyla.distributed.sharding import check_parallel
from hyla.distributed.worker import Worker, make_step_plan, step_images, worker_main
from hyla.engine.memory import CachePlan
from hyla.engine.model_runner import ModelRunner, RunnerOutput
from hyla.models.hybrid import FFNS, MIXERS

logger = logging.getLogger("hyla.distributed")

DEFAULT_TIMEOUT_S = 60.0
# imported once by the fork server so the forked ranks import nothing (lazy imports: ~2 s/rank)
PRELOAD = sorted(
    {"hyla.distributed.worker", "hyla.distributed.loader"}
    | {path.split(":")[0] for path in (*MIXERS.values(), *FFNS.values())}
)
JOIN_TIMEOUT_S = 10.0
RANK_NAME = "hyla-tp"
MAIN_GUARD_HINT = (
    "a script that creates LLM(..., tensor_parallel_size > 1) must do it under "
    "`if __name__ == \"__main__\":` (each rank's process re-imports the script's main module, "
    "as Python's multiprocessing does: see its 'Safe importing of main module')"
)
DEATH_REPORT_S = 1.0  # after a failed collective: wait this long for a rank's exit code


class Executor(ABC):
    """Runs `Worker` methods on every rank of the TP group."""

    driver: Worker
    failed: ExecutorError | None = None
    is_distributed = True

    def plan_cache(
        self, config: EngineConfig, max_model_len: int, max_num_seqs: int, reserved_bytes: int = 0
    ) -> CachePlan:
        """The minimum over the ranks of their own pools (nothing reserved: TP runs no drafts)."""
        return self.collective_rpc("plan_cache", max_model_len, max_num_seqs)

    def start_runner(
        self, plan: CachePlan, capture: tuple[tuple, ...], max_model_len: int, num_spec_rows: int
    ) -> DriverRunner:
        return start_runner(self, plan, capture[0], max_model_len)

    @abstractmethod
    def collective_rpc(self, method: str, *args: Any) -> Any:
        """`Worker.<method>(*args)` on every rank; rank 0's result. Raises: ExecutorError."""

    @abstractmethod
    def fail(self, what: str, error: Exception) -> ExecutorError:
        """Mark the executor failed by `error` (raised during `what`); the error to raise."""

    @abstractmethod
    def check_health(self) -> None: ...

    @abstractmethod
    def shutdown(self) -> None:
        """Stop every rank (idempotent)."""


def check_devices(config: EngineConfig) -> None:
    n = config.tensor_parallel_size
    if not str(config.device).startswith("cuda"):
        return
    count = torch.cuda.device_count()
    if n > count:
        raise ConfigError(f"tensor_parallel_size: {n} ranks need {n} GPUs, this host has {count}")
    kinds = sorted({torch.cuda.get_device_name(i) for i in range(n)})
    if len(kinds) > 1:
        raise ConfigError(
            f"tensor_parallel_size: ranks 0..{n - 1} need GPUs of one kind, found {kinds}"
        )


class MultiprocExecutor(Executor):
    """Rank 0 here, ranks 1..N-1 forked from a forkserver; `model_config` has the dtypes applied.
    Raises: ConfigError, CheckpointError before any rank starts."""

    def __init__(self, path: str | Path, model_config: ModelConfig, config: EngineConfig) -> None:
        n, ep = config.tensor_parallel_size, config.enable_expert_parallel
        check_parallel(model_config, n, ep)
        check_devices(config)
        check_checkpoint(path, model_config)
        self.timeout_s = float(os.environ.get("HYLA_COLLECTIVE_TIMEOUT", DEFAULT_TIMEOUT_S))
        init_method = f"tcp://127.0.0.1:{free_port()}"
        # the server pays torch's import once and holds no CUDA context or threads: safe to fork
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        self.procs, started = [], []
        for rank in range(1, n):
            reader, writer = ctx.Pipe(duplex=False)
            args = (writer, rank, n, init_method, str(path), model_config, config, self.timeout_s)
            proc = ctx.Process(target=_rank_main, args=args, daemon=True, name=f"{RANK_NAME}{rank}")
            proc.start()
            writer.close()
            logger.info("tensor-parallel rank %d: pid %d", rank, proc.pid)
            self.procs.append(proc)
            started.append(reader)
        device = config.device
        if device.startswith("cuda") and n > 1:
            device = "cuda:0"
            torch.cuda.set_device(device)
        self.tp = TPGroup(0, 1)
        self.is_shut_down = False
        try:
            _wait_started(self.procs, started)
            self.tp = init_tp_group(0, n, init_method, device, self.timeout_s)
            model = load_rank_model(path, model_config, self.tp, ep, device)
            self.tp.wait_until_ready()
        except BaseException as e:
            self.failed = ExecutorError(f"tensor-parallel start-up failed: {e}")
            self.shutdown()  # kill the ranks: they may wait for this one
            raise
        self.driver = Worker(self.tp, model, config)
        self._release = weakref.finalize(self, _release, list(self.procs), self.tp)

    @property
    def worker_pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def collective_rpc(self, method: str, *args: Any) -> Any:
        self.check_health()
        try:
            self.tp.broadcast_object((method, args))
            return getattr(self.driver, method)(*args)
        except Exception as e:
            raise self.fail(method, e) from e

    def fail(self, what: str, error: Exception) -> ExecutorError:
        deadline = time.monotonic() + DEATH_REPORT_S  # the closed socket precedes the exit code
        while time.monotonic() < deadline:
            dead = [(r, p) for r, p in enumerate(self.procs, start=1) if not p.is_alive()]
            if dead:
                rank, proc = dead[0]
                self.failed = ExecutorError(
                    f"tensor-parallel rank {rank} (pid {proc.pid}) exited with code "
                    f"{proc.exitcode} during {what}"
                )
                return self.failed
            time.sleep(0.05)
        why = f"{type(error).__name__}: {error}"
        self.failed = ExecutorError(f"tensor-parallel {what} failed: {why}")
        return self.failed

    def check_health(self) -> None:
        if self.failed is not None:
            raise self.failed
        for rank, proc in enumerate(self.procs, start=1):
            if not proc.is_alive():
                self.failed = ExecutorError(
                    f"tensor-parallel rank {rank} (pid {proc.pid}) exited with code {proc.exitcode}"
                )
                raise self.failed

    def shutdown(self) -> None:
        if getattr(self, "is_shut_down", False):
            return
        self.is_shut_down = True
        if self.failed is None and all(p.is_alive() for p in self.procs):
            try:
                self.tp.broadcast_object(("shutdown", ()))
            except Exception:  # noqa: BLE001 - the ranks are killed below anyway
                logger.exception("shutdown message failed")
        for proc in self.procs:
            proc.join(JOIN_TIMEOUT_S if self.failed is None else 0)
        release = getattr(self, "_release", None)
        if release is not None:
            release()
        else:
            _release(self.procs, self.tp)


def _release(procs: list, tp: TPGroup) -> None:
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join(JOIN_TIMEOUT_S)
    destroy_tp_group(tp)


def _check_no_live_group() -> None:
    """A dropped TP engine holds the process group until collected; a referenced one is an error."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        gc.collect()
    if dist.is_available() and dist.is_initialized():
        raise ConfigError(
            "tensor_parallel_size: another tensor-parallel engine is still running in this "
            "process; call shutdown() on it (LLM.shutdown(), or `with LLM(...) as llm:`) first"
        )


def _rank_main(started: multiprocessing.connection.Connection, *args: Any) -> None:
    started.send(True)
    started.close()
    worker_main(*args)


def _wait_started(procs: list, started: list) -> None:
    """A rank that exits this early most often re-ran an unguarded script: fail at once."""
    deadline = time.monotonic() + START_TIMEOUT.total_seconds()
    for rank, (proc, reader) in enumerate(zip(procs, started, strict=True), start=1):
        left = max(0.0, deadline - time.monotonic())
        if multiprocessing.connection.wait([reader, proc.sentinel], timeout=left):
            try:
                reader.recv()
                continue
            except EOFError:
                pass
            finally:
                reader.close()
        proc.join(DEATH_REPORT_S)
        raise ExecutorError(
            f"tensor-parallel rank {rank} (pid {proc.pid}) exited with code {proc.exitcode} "
            f"while its process started, before it ran any of hyla's code; {MAIN_GUARD_HINT}"
        )


def check_not_in_rank_start() -> None:
    """RuntimeError when this process is a rank re-running an unguarded script's main module."""
    process = multiprocessing.current_process()
    if getattr(process, "_inheriting", False) and process.name.startswith(RANK_NAME):
        raise RuntimeError(f"{process.name} re-ran the script's main module: {MAIN_GUARD_HINT}")


class DriverRunner:
    """The engine's runner: `execute` runs the step on every rank; the rest is rank 0's runner."""

    def __init__(self, executor: Executor, runner: ModelRunner) -> None:
        self.executor, self.runner = executor, runner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)

    def execute(self, out, requests, cache, plp=None, device_tokens=None) -> RunnerOutput:  # noqa: ANN001
        """As `ModelRunner.execute`. Raises: ExecutorError for any failure."""
        executor = self.executor
        executor.check_health()
        try:
            plan = make_step_plan(out, requests, cache, plp)
            mm = self.__dict__.get("multimodal")
            plan.images = None if mm is None else step_images(mm, out, requests)
            executor.tp.broadcast_object(("execute", (plan,)))
            self.runner.multimodal = plan.images
            return self.runner.execute(out, requests, cache, plp, device_tokens)
        except Exception as e:
            raise executor.fail("step", e) from e


def start_runner(
    executor: Executor, plan: CachePlan, graph_batch_sizes: tuple[int, ...], max_model_len: int
) -> DriverRunner:
    """Start every rank's ModelRunner (CUDA graphs only with one rank: no captured collectives)."""
    sizes = graph_batch_sizes if executor.driver.tp.world_size == 1 else ()
    runner = executor.collective_rpc("start_runner", plan, sizes, max_model_len)
    return DriverRunner(executor, runner)


def start_executor(path: str | Path, config: EngineConfig, dtype: str | None) -> Executor:
    """Start and load every rank. Raises: ConfigError before any process starts, CheckpointError."""
    from hyla.models.loader import DTYPES, load_config

    _check_no_live_group()
    check_not_in_rank_start()  # LLMEngine.from_path is not the only caller
    model_config = load_config(path)
    if dtype is not None:
        if dtype not in DTYPES:
            raise ConfigError(f"dtype: expected one of {sorted(DTYPES)}, got {dtype!r}")
        model_config = model_config.replace(dtype=dtype)
    if config.quantization is not None:
        raise ConfigError("quantization: not supported with tensor_parallel_size > 1 yet")
    if config.piecewise_cuda_graphs:
        raise ConfigError("piecewise_cuda_graphs: not supported with the mp executor yet")
    cache = config.cache
    changes = {"kv_cache_dtype": cache.kv_cache_dtype,
               "mamba_ssm_cache_dtype": cache.mamba_ssm_cache_dtype}  # fmt: skip
    model_config = model_config.replace(**{k: v for k, v in changes.items() if v is not None})
    return MultiprocExecutor(path, model_config, config)
