"""Warm-up before serving, through the engine's own step: the shapes it will see (prefills,
batched prefills, each decode graph, prefix hits), so the first requests pay no compilation or
capture. The engine is left idle, its prefix-cache counters reset.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from hyla.cache.prefix import PrefixStats
from hyla.request import SamplingParams

logger = logging.getLogger("hyla.engine")

CPU_PREFILL_TOKENS = 16
BATCH_PREFILL_SEQS = (3, 16)  # Triton specializes int arguments: == 1, % 16 == 0, the rest
HIT_QUERY_LENS = (3, 16, 33, 65, 129, 257)  # about halving attention splits from one to the next
MIXED_PROMPT_TOKENS = 16


def warm_up(engine: Any, prefill_tokens: int | None = None) -> float:
    """Warm up an idle `engine`; returns the seconds spent. RuntimeError if it holds requests."""
    if engine.has_unfinished_requests():
        raise RuntimeError("warm_up: the engine already holds requests")
    start = time.monotonic()
    sched = engine.config.scheduler
    on_gpu = engine.device.type == "cuda"
    budget = prefill_tokens or (sched.max_num_batched_tokens if on_gpu else CPU_PREFILL_TOKENS)
    num = max(1, min(budget, engine.max_model_len - 2))
    _run(engine, [[1] * num])
    if on_gpu:
        _warm_batches(engine, budget)
    _warm_hits(engine, num)
    graphs = engine.runner.graphs
    for size in graphs.batch_sizes if graphs is not None else ():
        _run(engine, [[1]] * min(size, sched.max_num_seqs))
    pieces = engine.runner.piecewise
    for size in pieces.buckets if pieces is not None else ():
        if size < num:
            _run(engine, [[1] * size])
    if engine.cache.prefix is not None:
        engine.cache.prefix.stats = PrefixStats()
    seconds = time.monotonic() - start
    logger.info("warmed up in %.2f s", seconds)
    return seconds


def _warm_hits(engine: Any, num: int) -> None:
    # Split-k attention picks its variant from the query length at a long cached context,
    # which a cold prefill never reaches: hit the prefill's checkpoint with several suffixes.
    prefix = engine.cache.prefix
    if prefix is None or not prefix.stride:
        return
    cached = (num - 1) // prefix.block_size * prefix.block_size
    room = engine.max_model_len - 2 - cached
    if cached == 0:
        return
    crossing = prefix.stride + prefix.block_size + 1
    lens = sorted({min(n, room) for n in (*HIT_QUERY_LENS, crossing)} - {0, 1})
    for i, extra in enumerate(lens):
        _run(engine, [[1] * cached + [2 + i] * extra])
    if engine.device.type == "cuda":
        _warm_decode_rows(engine, cached)


def _warm_batches(engine: Any, budget: int) -> list[list[list[int]]]:
    # Also the fewest sequences that fill the budget: kernels autotune per token-count bucket,
    # which a max_model_len below the budget keeps a one-sequence prefill from reaching.
    sched = engine.config.scheduler
    vocab = engine.model_config.vocab_size
    cap = max(1, engine.max_model_len - 2)
    counts = {*BATCH_PREFILL_SEQS, -(-budget // cap)}
    runs = []
    for n in sorted({min(n, sched.max_num_seqs) for n in counts} - {1}):
        length = max(1, min(cap, (budget - 5) // n))
        if n % 2 and length % 2 == 0:  # an odd total for an odd n
            length -= 1
        runs.append([[(3 + i) % vocab] * length for i in range(n)])
        _run(engine, runs[-1])
    return runs


def _warm_decode_rows(engine: Any, cached: int) -> None:
    # MLA's split-k kernel (one-token rows of a mixed step) picks its variant by row count.
    sched = engine.config.scheduler
    room = min(sched.max_num_seqs - 1, sched.max_num_batched_tokens - MIXED_PROMPT_TOKENS)
    for d in sorted({min(d, room) for d in HIT_QUERY_LENS if min(d, room) >= 1}):
        _run(engine, [[1] * cached + [2]] * d + [[3] * MIXED_PROMPT_TOKENS])


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
