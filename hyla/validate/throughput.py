"""Check (c): throughput grid (batch x prompt length): prefill and output tokens/s, TPOT, and the
`max_num_seqs` / `max_num_batched_tokens` to use. Fails only when a cell errors."""

from __future__ import annotations

import random
import time
from typing import Any

from hyla.validate.result import CheckResult


def _timed(llm: Any, prompts: list[list[int]], max_tokens: int) -> float:
    from hyla.request import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    llm.generate(prompts, params)
    return time.perf_counter() - start


def _cell(llm: Any, batch: int, length: int, out: int, vocab: int) -> dict[str, float]:
    # two prompt sets: repeats would hit the prefix cache and make TPOT too small, even negative
    rng = random.Random(batch * 100003 + length)
    first, second = (
        [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(batch)] for _ in range(2)
    )
    t1 = _timed(llm, first, 1)
    tn = _timed(llm, second, out)
    return {"prefill_tok_s": batch * length / t1, "output_tok_s": batch * out / tn,
            "tpot_ms": 1e3 * max(tn - t1, 0.0) / (out - 1)}  # fmt: skip


def _recommend(grid: dict, batches: list[int], lengths: list[int], capacity: int) -> dict:
    longest = lengths[-1]
    speeds = {b: grid[(b, longest)]["output_tok_s"] for b in batches if (b, longest) in grid}
    best = max(speeds.values())
    seqs = min(b for b, s in speeds.items() if s >= 0.9 * best)
    seqs = min(seqs, max(1, capacity // longest)) if capacity else seqs
    prefill = {(b, n): c["prefill_tok_s"] for (b, n), c in grid.items()}
    top = max(prefill.values())
    tokens = min(b * n for (b, n), s in prefill.items() if s >= 0.9 * top)
    return {"max_num_seqs": seqs, "max_num_batched_tokens": tokens}


def run_throughput(ctx: Any, progress: Any) -> CheckResult:
    from hyla.validate.plots import heatmap

    result = CheckResult("throughput", "Throughput grid")
    batches, lengths, out = (
        ((1, 4), (32, 128), 8) if ctx.quick else ((1, 8, 32, 64), (512, 2048, 8192), 64)
    )
    lengths = [n for n in lengths if n + out <= ctx.llm.engine.max_model_len] or [16]
    grid: dict[tuple[int, int], dict[str, float]] = {}
    for b in batches:
        for n in lengths:
            try:
                grid[(b, n)] = _cell(ctx.llm, b, n, out, ctx.prompt_vocab_size)
            except (RuntimeError, ValueError) as e:  # OOM, or a request the engine refuses
                result.fail(f"batch {b} x length {n}: {type(e).__name__}: {str(e)[:200]}")
        progress.update(1 / len(batches))
    rows = [[b, n, c["output_tok_s"], c["tpot_ms"], c["prefill_tok_s"]]
            for (b, n), c in sorted(grid.items())]  # fmt: skip
    result.tables.append(("cells", ["batch", "prompt len", "output tok/s", "TPOT ms",
                                    "prefill tok/s"], rows))  # fmt: skip
    if grid:
        stats = ctx.llm.engine.get_stats()
        capacity = stats.num_total_blocks * ctx.llm.engine.config.cache.block_size
        result.metrics = {**_recommend(grid, list(batches), lengths, capacity),
                          "cache_capacity_tokens": capacity, "output_tokens": out}  # fmt: skip
        values = [[grid.get((b, n), {}).get("output_tok_s", 0.0) for n in lengths]
                  for b in batches]  # fmt: skip
        heatmap(ctx.out_dir / "throughput.png", values, [f"B={b}" for b in batches],
                [f"L={n}" for n in lengths], title="output tokens/s", label="tok/s")  # fmt: skip
        result.plots.append("throughput.png")
    result.bound = "every cell runs (speeds are measured, not bounded)"
    return result
