"""Check (b): long-context stability, one request per doubling length. Fails on an error, cache
blocks outside [ceil(L / B), ceil((L + out) / B) + 1], > 1 state slot per sequence, or (CUDA)
non-cache memory growing > 25% + 64 MiB; TPOT jitter and retrieval depth are reported only."""

from __future__ import annotations

import math
import random
import time
from typing import Any

from hyla.validate.result import CheckResult

JITTER_FLAG = 3.0
DEPTHS = (0.1, 0.5, 0.9)


def _lengths(max_len: int, out: int, quick: bool) -> list[int]:
    n, top, lengths = (64 if quick else 1024), (512 if quick else max_len) - out, []
    while n <= min(top, max_len - out):
        lengths.append(n)
        n *= 2
    return lengths or [max(1, max_len - out)]


def _peak(device: str) -> int | None:
    if not device.startswith("cuda"):
        return None
    import torch

    return torch.cuda.max_memory_allocated()


def _run_one(llm: Any, ids: list[int], out: int, device: str) -> dict[str, Any]:
    from hyla.request import SamplingParams

    if device.startswith("cuda"):
        import torch

        torch.cuda.reset_peak_memory_stats()
    params = SamplingParams(max_tokens=out, temperature=0.0, ignore_eos=True)
    start, stamps, blocks, slots = time.perf_counter(), [], 0, 0
    for o in llm.stream(ids, params):
        stats = llm.engine.get_stats()
        blocks = max(blocks, stats.num_total_blocks - stats.num_free_blocks)
        slots = max(slots, stats.num_total_slots - stats.num_free_slots)
        stamps += [time.perf_counter()] * (len(o.outputs[0].token_ids) - len(stamps))
    gaps = sorted(b - a for a, b in zip(stamps, stamps[1:], strict=False))
    p50 = gaps[len(gaps) // 2] if gaps else 0.0
    p99 = gaps[min(len(gaps) - 1, math.ceil(0.99 * len(gaps)) - 1)] if gaps else 0.0
    return {"ttft_s": stamps[0] - start, "tpot_p50_ms": 1e3 * p50, "tpot_p99_ms": 1e3 * p99,
            "jitter": p99 / p50 if p50 else 0.0, "blocks": blocks, "slots": slots,
            "peak_bytes": _peak(device)}  # fmt: skip


def _check_row(result: CheckResult, n: int, r: dict, out: int, block: int, cache_tok: int):
    lo, hi = math.ceil(n / block), math.ceil((n + out) / block) + 1
    if not lo <= r["blocks"] <= hi:
        result.fail(f"length {n}: {r['blocks']} cache blocks in use, expected {lo}..{hi}")
    if r["slots"] > 1:
        result.fail(f"length {n}: {r['slots']} state slots for one sequence (state not flat)")
    r["cache_bytes"] = r["blocks"] * block * cache_tok


def _memory_flat(result: CheckResult, rows: dict[int, dict]) -> None:
    peaks = {n: r["peak_bytes"] - r["cache_bytes"] for n, r in rows.items()
             if r["peak_bytes"] is not None}  # fmt: skip
    if len(peaks) >= 2:
        first, last = peaks[min(peaks)], peaks[max(peaks)]
        if last > 1.25 * first + (64 << 20):
            result.fail(
                f"device memory beyond the cache grew {first / 2**20:.0f} -> "
                f"{last / 2**20:.0f} MiB from length {min(peaks)} to {max(peaks)}"
            )


def _probe(llm: Any, length: int) -> list[list[Any]]:
    from hyla.request import SamplingParams

    tok, rng, rows = llm.tokenizer, random.Random(3), []
    filler = tok.encode("The grass is green and the sky is blue. " * (length // 8 + 1))
    question = tok.encode(" What is the secret code? The secret code is")
    for depth in DEPTHS:
        code = str(rng.randrange(1000, 9999))
        fact = tok.encode(f" The secret code is {code}. ")
        body = filler[: max(0, length - len(fact) - len(question))]
        cut = int(depth * len(body))
        ids = body[:cut] + fact + body[cut:] + question
        got = llm.generate([ids], SamplingParams(max_tokens=8, temperature=0.0))[0]
        rows.append([depth, len(ids), code, got.outputs[0].text.strip(),
                     int(code in got.outputs[0].text)])  # fmt: skip
    return rows


def run_long_context(ctx: Any, progress: Any) -> CheckResult:
    from hyla.cache.spec import bytes_per_token
    from hyla.validate.plots import line_plot

    result, llm = CheckResult("long_context", "Long-context stability"), ctx.llm
    out = 8 if ctx.quick else 32
    lengths = _lengths(llm.engine.max_model_len, out, ctx.quick)
    block, cache_tok = llm.engine.config.cache.block_size, bytes_per_token(llm.engine.model_config)
    rng, rows = random.Random(5), {}
    for n in lengths:
        ids = [rng.randrange(3, ctx.prompt_vocab_size) for _ in range(n)]
        try:
            rows[n] = _run_one(llm, ids, out, ctx.device)
        except (RuntimeError, ValueError) as e:  # out of memory, or a request refused
            result.fail(f"length {n}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            break
        _check_row(result, n, rows[n], out, block, cache_tok)
        progress.update(0.5 / len(lengths))
    _memory_flat(result, rows)
    table = [[n, r["ttft_s"], r["tpot_p50_ms"], r["tpot_p99_ms"],
              f"{r['jitter']:.2f}" + (" (flag)" if r["jitter"] > JITTER_FLAG else ""),
              r["blocks"], r["cache_bytes"], r["slots"],
              "n/a" if r["peak_bytes"] is None else r["peak_bytes"]]
             for n, r in rows.items()]  # fmt: skip
    result.tables.append(("per length", ["tokens", "TTFT s", "TPOT p50 ms", "TPOT p99 ms",
                                         "jitter p99/p50", "cache blocks", "cache bytes",
                                         "state slots", "peak bytes"], table))  # fmt: skip
    if llm.tokenizer is not None and lengths:
        probe = _probe(llm, lengths[-1])
        result.tables.append(
            (
                "retrieval probe (scored, not bounded)",
                ["depth", "tokens", "code", "answer", "found"],
                probe,
            )
        )
        result.metrics["retrieval_found"] = sum(r[-1] for r in probe) / len(probe)
    xs = list(rows)
    line_plot(ctx.out_dir / "long_context.png",
              {"TTFT ms": [1e3 * rows[n]["ttft_s"] for n in xs],
               "TPOT p50 ms": [rows[n]["tpot_p50_ms"] for n in xs],
               "TPOT p99 ms": [rows[n]["tpot_p99_ms"] for n in xs]},
              x=xs, xlabel="prompt tokens", ylabel="ms", title="latency per length",
              log_x=True, log_y=True)  # fmt: skip
    result.plots.append("long_context.png")
    result.metrics.update(max_length=max(xs) if xs else 0, state_slots_max=max(
        (r["slots"] for r in rows.values()), default=0))  # fmt: skip
    result.bound = (
        "no error; cache blocks = the tokens held; one state slot per sequence at "
        "every length; (CUDA) non-cache memory flat within 25% + 64 MiB"
    )
    progress.update(0.5)
    return result
