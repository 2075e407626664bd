"""Warm-up before serving: the first requests pay no kernel compilation or graph capture.

`warm_up(engine)` runs, through the engine's own step, the shapes it will see: one prefill of
the largest token bucket (a chunk of `max_num_batched_tokens` tokens on a GPU; a short one on
the CPU, where nothing is compiled) and, on a GPU, that budget split over several sequences
(`_warm_batches`); then, for each captured decode batch size b, b one-token
requests decoding once (the decode graph of the smallest context bucket is captured, the
Triton/fla kernels of those shapes compiled and autotuned), and with piecewise graphs one
prefill of each smaller token bucket (its pieces captured). With prefix caching on a model with
linear layers, prefix hits on that prefill follow (`_warm_hits`): restores, a chunk split into
rounds at a checkpoint inside it, attention over a long cached context from queries of several
lengths (the H200 paid ~1 s at the first hit of a 2K-token system prompt without them). The
engine is left idle: every block and slot free, prefix-cache counters reset.
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
    """Run the warm-up requests on an idle `engine` (an LLMEngine). Returns the seconds spent.
    `prefill_tokens`: the first prefill's length (default: the token bucket on a GPU, a short
    one on the CPU).

    Raises: RuntimeError when the engine holds requests (warm-up runs before serving)."""
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
    pieces = engine.runner.piecewise  # one prefill step of each other token bucket
    for size in pieces.buckets if pieces is not None else ():
        if size < num:
            _run(engine, [[1] * size])
    if engine.cache.prefix is not None:
        engine.cache.prefix.stats = PrefixStats()
    seconds = time.monotonic() - start
    logger.info("warmed up in %.2f s", seconds)
    return seconds


def _warm_hits(engine: Any, num: int) -> None:
    """After the prefill of `num` tokens of 1: prompts reusing its checkpoint where its last
    full block before the last token ends (kept under every policy), with suffixes of
    `HIT_QUERY_LENS` tokens and one crossing a stride boundary (a chunk in rounds, its last
    round on the recurrent op). The split-k attention kernel picks its variant from the query
    length at a long cached context (splits rounded up to a power of two; the context length
    divisible by 16 or not), which a cold prefill of the same length never reaches; on a GPU,
    where MLA prefill takes the tiled kernel, the same counts of decode rows in mixed steps
    follow (`_warm_decode_rows`). Skipped without prefix caching, without linear layers, or
    when nothing fits."""
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
        _run(engine, [[1] * cached + [2 + i] * extra])  # each its own suffix: all hit `cached`
    if engine.device.type == "cuda":
        _warm_decode_rows(engine, cached)


def _warm_batches(engine: Any, budget: int) -> list[list[list[int]]]:
    """Prefills of up to `budget` tokens split over n sequences, each its own token (no prefix
    hits between them), as a served burst of prompts batches them: n in BATCH_PREFILL_SEQS
    (Triton compiles a variant per class of its integer arguments, such as sequence and token
    counts), and the fewest sequences of at most max_model_len - 2 tokens that fill the budget
    (kernels autotune per token-count bucket: fla's l2norm autotuned for 9.7 s in the first
    8192-token step of an H200 server whose max_model_len of 4096 capped the one-sequence
    prefill). Returns the prompt lists it ran."""
    sched = engine.config.scheduler
    vocab = engine.model_config.vocab_size
    cap = max(1, engine.max_model_len - 2)
    counts = {*BATCH_PREFILL_SEQS, -(-budget // cap)}
    runs = []
    for n in sorted({min(n, sched.max_num_seqs) for n in counts} - {1}):
        length = max(1, min(cap, (budget - 5) // n))
        if n % 2 and length % 2 == 0:  # an odd total for an odd n (length >= 2 here)
            length -= 1
        runs.append([[(3 + i) % vocab] * length for i in range(n)])
        _run(engine, runs[-1])
    return runs


def _warm_decode_rows(engine: Any, cached: int) -> None:
    """Mixed steps whose decode-shaped rows read the long cached context: d requests hitting
    `cached` tokens with one new token each beside a short prompt, d in HIT_QUERY_LENS. An
    eager mixed step sends MLA's one-token rows to the split-k kernel (its prefill sequences to
    the tiled one), whose split count, and so its variant, follows the row count as it follows
    the query length of a prefill hit."""
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
