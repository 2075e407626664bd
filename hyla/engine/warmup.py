"""Warm-up before serving: the first requests pay no kernel compilation or graph capture.

`warm_up(engine)` runs, through the engine's own step, the shapes it will see: one prefill of
the largest token bucket (a chunk of `max_num_batched_tokens` tokens on a GPU; a short one on
the CPU, where nothing is compiled), then, for each captured decode batch size b, b one-token
requests decoding once (the decode graph of the smallest context bucket is captured, the
Triton/fla kernels of those shapes compiled and autotuned), and with piecewise graphs one
prefill of each smaller token bucket (its pieces captured). The engine is left idle: every
block and slot free, prefix-cache counters reset.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from hyla.cache.prefix import PrefixStats
from hyla.request import SamplingParams

logger = logging.getLogger("hyla.engine")

CPU_PREFILL_TOKENS = 16


def warm_up(engine: Any) -> float:
    """Run the warm-up requests on an idle `engine` (an LLMEngine). Returns the seconds spent.

    Raises: RuntimeError when the engine holds requests (warm-up runs before serving)."""
    if engine.has_unfinished_requests():
        raise RuntimeError("warm_up: the engine already holds requests")
    start = time.monotonic()
    sched = engine.config.scheduler
    on_gpu = engine.device.type == "cuda"
    num = sched.max_num_batched_tokens if on_gpu else CPU_PREFILL_TOKENS
    num = max(1, min(num, engine.max_model_len - 2))
    _run(engine, [[1] * num])
    graphs = engine.runner.graphs
    for size in graphs.batch_sizes if graphs is not None else ():
        _run(engine, [[1]] * min(size, sched.max_num_seqs))
    pieces = engine.runner.piecewise  # one prefill step of each other token bucket
    for size in pieces.buckets if pieces is not None else ():
        if size < num:
            _run(engine, [[1] * size])
    if engine.cache.prefix is not None:
        engine.cache.prefix.stats = PrefixStats()
    seconds = time.monotonic() - start
    logger.info("warmed up in %.2f s", seconds)
    return seconds


def _run(engine: Any, prompts: list[list[int]]) -> None:
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    for i, ids in enumerate(prompts):
        engine.add_request(f"warmup-{i}", ids, params)
    for _ in range(len(prompts) * (max(map(len, prompts)) + 4)):  # bounded: never hangs
        if not engine.has_unfinished_requests():
            return
        engine.step()
    engine.abort_request([f"warmup-{i}" for i in range(len(prompts))])
    engine.step()
    logger.warning("warm-up requests did not finish; aborted")
