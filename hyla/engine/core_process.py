"""The engine core in a process of its own (`hyla serve`), commands and events over ZeroMQ
PUSH/PULL ipc sockets, whose I/O threads queue without the GIL so neither side blocks the other.
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from typing import Any

from hyla.engine.async_stream import EngineDeadError
from hyla.engine.core_loop import CoreLoop, picklable

logger = logging.getLogger("hyla.engine")

PARENT_CHECK_MS = 1000  # an idle core looks for its front end this often
READ_POLL_MS = 200  # the reader thread looks for a dead core this often
PROFILE_ENV = "HYLA_CORE_PROFILE"


@dataclass
class EngineInfo:
    """The attributes the server reads of an `LLMEngine` in another process."""

    model_name: str
    max_model_len: int
    model_config: Any
    config: Any
    tokenizer: Any
    prefix_block_size: int | None
    stats: Any
    multimodal: Any = None

    @classmethod
    def of(cls, engine: Any) -> EngineInfo:
        return cls(engine.model_name, engine.max_model_len, engine.model_config, engine.config,
                   engine.tokenizer, engine.prefix_block_size, engine.get_stats())

    def get_stats(self) -> Any:
        return self.stats


class ProcessCore:
    """Starts `core_main` in a new process and waits until its engine is loaded. Raises the
    engine's loading error, or EngineDeadError when the process exits before it is ready."""

    text_in_front = True

    def __init__(self, model: str | None, options: dict[str, Any]) -> None:
        import zmq

        self._dir = tempfile.mkdtemp(prefix="hyla-core-")
        cmd_addr, out_addr = f"ipc://{self._dir}/cmd", f"ipc://{self._dir}/out"
        self._zmq = zmq.Context()
        self._cmd = self._zmq.socket(zmq.PUSH)
        self._cmd.setsockopt(zmq.SNDHWM, 0)  # never block the event loop on a send
        self._cmd.setsockopt(zmq.LINGER, 0)
        self._cmd.bind(cmd_addr)
        self._out = self._zmq.socket(zmq.PULL)
        self._out.setsockopt(zmq.RCVHWM, 0)
        self._out.bind(out_addr)
        # Not multiprocessing's spawn: it would rerun the caller's main module (no main guard).
        self.process = subprocess.Popen([sys.executable, "-m", "hyla.engine.core_process"],
                                        stdin=subprocess.PIPE)
        self._stopped = False
        self._reader: threading.Thread | None = None
        self.process.stdin.write(pickle.dumps((model, options, cmd_addr, out_addr, os.getpid())))
        self.process.stdin.close()
        try:
            self.info = self._wait_ready()
        except BaseException:
            self.close()
            raise

    def _wait_ready(self) -> EngineInfo:
        while True:
            if self._out.poll(READ_POLL_MS):
                event = pickle.loads(self._out.recv())
                if event[0] == "ready":
                    return event[1]
                raise event[1]  # ("load_failed", error)
            if self.process.poll() is not None:
                raise EngineDeadError(
                    f"the engine core process exited with code {self.process.returncode} "
                    "while loading")

    @property
    def is_running(self) -> bool:
        return self.process.poll() is None

    def start(self, on_event: Any, loop: Any) -> None:
        self._reader = threading.Thread(target=self._read, args=(on_event, loop),
                                        name="hyla-core-reader", daemon=True)
        self._reader.start()

    def send(self, command: tuple) -> None:
        """Queue `command` for the core (from the event loop's thread only)."""
        import zmq

        if command[0] == "stop":
            self._stopped = True
        try:  # without a peer (the core is gone) a PUSH send would block: dropped instead
            self._cmd.send(pickle.dumps(command, protocol=5), zmq.NOBLOCK)
        except zmq.Again:
            logger.warning("engine core gone: %s not delivered", command[0])

    def check_health(self) -> None:
        if not self._stopped and not self.is_running:
            raise EngineDeadError(
                f"the engine core process exited with code {self.process.returncode}")

    def close(self) -> None:
        self._stopped = True
        if self.is_running:
            self.process.terminate()
            try:
                self.process.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self._zmq.destroy(linger=0)
        shutil.rmtree(self._dir, ignore_errors=True)

    def _read(self, on_event: Any, loop: Any) -> None:
        import zmq

        while True:
            try:
                ready = self._out.poll(READ_POLL_MS)
                if ready:
                    event = pickle.loads(self._out.recv())
            except zmq.ZMQError:
                return
            if ready:
                _deliver(loop, on_event, event)
            elif not self.is_running:
                if not self._stopped:
                    code = self.process.returncode
                    logger.error("the engine core process exited with code %s", code)
                    error = EngineDeadError(f"the engine core process exited with code {code}")
                    _deliver(loop, on_event, ("dead", error))
                return


def _deliver(loop: Any, on_event: Any, event: tuple) -> None:
    try:
        loop.call_soon_threadsafe(on_event, event)
    except RuntimeError:  # the loop is closed
        pass


def core_main(model: str | None, options: dict[str, Any], cmd_addr: str, out_addr: str,
              parent_pid: int) -> None:
    """The engine-core process: load the engine, then run its loop until "stop"."""
    import zmq

    from hyla.console import tolerate_broken_stderr

    tolerate_broken_stderr()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the front end drives the shutdown
    ctx = zmq.Context()
    commands, events = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    commands.connect(cmd_addr)
    events.setsockopt(zmq.SNDHWM, 0)
    events.connect(out_addr)

    def emit(event: tuple) -> None:
        if event[0] in ("rejected", "failed"):
            event = (*event[:-1], picklable(event[-1]))
        elif event[0] == "called" and event[3] is not None:
            event = (*event[:3], picklable(event[3]), event[4])
        events.send(pickle.dumps(event, protocol=5))

    try:
        engine = _load(model, options)
    except BaseException as e:  # noqa: BLE001 - the front end raises it
        emit(("load_failed", e))
        ctx.destroy(linger=2000)
        return
    emit(("ready", EngineInfo.of(engine)))
    profile = _start_profile()
    code = _serve(CoreLoop(engine, emit, prompt_once=True), commands, engine, parent_pid)
    if profile is not None:
        profile.disable()
        profile.dump_stats(os.environ[PROFILE_ENV])
    engine.shutdown()
    ctx.destroy(linger=2000)  # the last events reach the front end
    os._exit(code)  # no interpreter teardown: seconds of garbage collection over the model


def _serve(loop: CoreLoop, commands: Any, engine: Any, parent_pid: int) -> int:
    """Run the loop until "stop" (0) or a dead tensor-parallel rank (1: every open stream
    gets the error, and the front end sees the process exit)."""
    import zmq

    while True:
        wait = 0 if engine.has_unfinished_requests() else PARENT_CHECK_MS
        batch = []
        if commands.poll(wait):
            while True:
                try:
                    batch.append(pickle.loads(commands.recv(zmq.NOBLOCK)))
                except zmq.Again:
                    break
        if os.getppid() != parent_pid:  # the front end is gone (also while streams run)
            return 0
        if loop.run_once(batch):
            return 0
        try:
            engine.executor.check_health()
        except Exception as e:  # noqa: BLE001 - ExecutorError: the engine cannot go on
            logger.error("engine core: %s; exiting", e)
            loop.fail_all(EngineDeadError(f"the engine cannot go on: {e}"))
            return 1


def _start_profile() -> Any:
    if not os.environ.get(PROFILE_ENV):
        return None
    import cProfile

    profile = cProfile.Profile()
    profile.enable()
    return profile


def _load(model: str | None, options: dict[str, Any]) -> Any:
    from hyla.engine.llm_engine import LLMEngine
    from hyla.engine.startup import apply_cpu_threads, startup_line, tokenizer_notices

    engine = LLMEngine.from_path(model, **options)
    apply_cpu_threads(engine)
    print(startup_line(engine), file=sys.stderr, flush=True)
    for notice in tokenizer_notices(engine):
        print(f"hyla: {notice}", file=sys.stderr, flush=True)
    return engine


if __name__ == "__main__":  # the module's own copy, so its classes pickle under their name
    from hyla.engine.core_process import core_main as _main

    _main(*pickle.loads(sys.stdin.buffer.read()))
