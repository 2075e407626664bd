"""The engine side of the AsyncEngine, in a thread (`ThreadCore`) or a process of its own.

Commands: ("add", id, prompt, params, arrival) | ("abort", id) | ("stop",) | ("call", id, fn, args)
Events: ("admitted", id) | ("rejected", id, error) | ("outputs", [RequestOutput], stats)
        | ("called", id, result, error, stats) | ("failed", error): every request was ended.
"""

from __future__ import annotations

import collections
import logging
import pickle
import threading
from collections.abc import Callable
from typing import Any

from hyla.engine.async_stream import EngineDeadError

logger = logging.getLogger("hyla.engine")

Emit = Callable[[tuple], None]


class CoreLoop:
    """Applies commands to an `LLMEngine` and steps it; events go to `emit`. With `prompt_once`
    prompt ids ride in a request's first output only (pickling them each step is costly)."""

    def __init__(self, engine: Any, emit: Emit, prompt_once: bool = False) -> None:
        self.engine = engine
        self.emit = emit
        self.request_ids: set[str] = set()
        self.prompt_once = prompt_once
        self._prompt_sent: set[str] = set()

    def run_once(self, commands: list[tuple]) -> bool:
        """Apply `commands`, then step once if there is work; returns whether to stop."""
        stop = any(c[0] == "stop" for c in commands)
        try:
            for command in commands:
                self._apply(command)
            if not stop and self.engine.has_unfinished_requests():
                self._step()
            elif commands:
                self.emit(("outputs", [], self._stats()))
        except Exception as e:  # never die silently: its requests would hang with no end
            logger.exception("engine loop failed; ending %d requests", len(self.request_ids))
            self.fail_all(EngineDeadError(f"engine loop failed: {type(e).__name__}: {e}"))
        return stop

    def _apply(self, command: tuple) -> None:
        kind = command[0]
        if kind == "add":
            self._add(*command[1:])
        elif kind == "abort":
            self._abort(command[1])
        elif kind == "call":
            self._call(*command[1:])

    def _call(self, call_id: str, fn: Callable, args: tuple) -> None:
        try:
            result, error = fn(self.engine, *args), None
        except Exception as e:
            result, error = None, e
        self.emit(("called", call_id, result, error, self._stats()))

    def _add(self, request_id: str, prompt: Any, params: Any, arrival: float | None) -> None:
        try:
            self.engine.add_request(request_id, prompt, params, arrival_time=arrival)
        except Exception as e:
            self.emit(("rejected", request_id, e))
            return
        self.request_ids.add(request_id)
        self.emit(("admitted", request_id))

    def _abort(self, request_id: str) -> None:
        self.request_ids.discard(request_id)
        self._prompt_sent.discard(request_id)
        try:
            self.engine.abort_request(request_id)
        except Exception:
            logger.exception("abort of %s raised", request_id)

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as e:
            logger.exception("engine step failed; ending %d requests", len(self.request_ids))
            self.fail_all(EngineDeadError(f"engine step failed: {type(e).__name__}: {e}"))
            return
        for output in outputs:
            if output.finished:
                self.request_ids.discard(output.request_id)
            if self.prompt_once:
                self._drop_sent_prompt(output)
        self.emit(("outputs", outputs, self._stats()))

    def _drop_sent_prompt(self, output: Any) -> None:
        rid = output.request_id
        if rid in self._prompt_sent:
            output.prompt_token_ids = None  # a fresh object per step; the list is untouched
            if output.finished:
                self._prompt_sent.discard(rid)
        elif not output.finished:
            self._prompt_sent.add(rid)

    def fail_all(self, error: Exception) -> None:
        for request_id in list(self.request_ids):
            self._abort(request_id)
        self.emit(("failed", error))
        self.emit(("outputs", [], self._stats()))

    def _stats(self) -> Any:
        try:
            return self.engine.get_stats()
        except Exception:
            logger.exception("get_stats failed")
            return None


class ThreadCore:
    """`CoreLoop` in a daemon thread of this process; events reach `on_event` on the loop."""

    text_in_front = False

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._cond = threading.Condition()
        self._commands: collections.deque[tuple] = collections.deque()
        self._thread: threading.Thread | None = None

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, on_event: Callable[[tuple], None], loop: Any) -> None:
        def emit(event: tuple) -> None:
            if loop.is_closed():
                return
            try:
                loop.call_soon_threadsafe(on_event, event)
            except RuntimeError:  # the loop closed under us (interpreter shutdown)
                pass

        core = CoreLoop(self.engine, emit)
        self._thread = threading.Thread(target=self._run, args=(core,), name="hyla-engine",
                                        daemon=True)
        self._thread.start()

    def send(self, command: tuple) -> None:
        with self._cond:
            self._commands.append(command)
            self._cond.notify()

    def check_health(self) -> None:
        self.engine.executor.check_health()

    def _run(self, core: CoreLoop) -> None:
        while True:
            with self._cond:
                while not self._commands and not self.engine.has_unfinished_requests():
                    self._cond.wait()
                commands = list(self._commands)
                self._commands.clear()
            if core.run_once(commands):
                return


def picklable(error: BaseException) -> BaseException:
    """`error`, or a RuntimeError with its message when it cannot cross a process boundary."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:  # noqa: BLE001 - any failure to round-trip
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error
