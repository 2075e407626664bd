"""Prefix-cache workloads of bench/prefix_cache.py: a shared system prompt, multi-turn chats, and
the stride / keep-policy sweep (hit rate against checkpoint memory).

    system-prompt  one `system_len`-token prefix (2,000: no multiple of the stride nor of a
                   prefill chunk, as a real one), `questions` different questions after it,
                   one request in flight: the first computes everything, the others reuse
                   floor(2000 / stride) * stride tokens or more
    multi-turn     `conversations` chats of `turns` turns: turn k's prompt is turn k-1's prompt
                   + its reply (`reply_len` tokens) + a new message; each turn should reuse all
                   of the previous turn but at most one block

TTFT hit vs cold: the same prompts on an engine with prefix caching off, in the same run (the
first token must be equal). Every row also says what the request cost the host
(`prefix_counts.count_step(ops=False)`, on while timing): `fla_calls` (fla chunk-pipeline
calls: linear layers x rounds, less `short_rounds` run by the recurrent kernel), `rounds`,
`checkpoint_saves` (states
written) and `prefix_ms` (Python time in the prefix cache). The sweep replays both workloads
(cached engine only) per stride and keep policy and reports the hit rate, the checkpoints
written and the bytes they hold.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch
from prefix_counts import count_step

from hyla.engine.llm_engine import LLMEngine
from hyla.request import SamplingParams

EngineFactory = Callable[..., LLMEngine]


def tokens(n: int, vocab: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=gen).tolist()


def first_token(engine: LLMEngine, rid: str, prompt: list[int], max_tokens: int = 1):
    """(TTFT seconds, final output, host work): one request alone, run to its end."""
    import time

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=1)
    saves = engine.get_stats().prefix_cache_checkpoint_saves
    with count_step(ops=False) as counts:
        start = time.perf_counter()
        engine.add_request(rid, prompt, params)
        elapsed, final = None, None
        while engine.has_unfinished_requests():
            for out in engine.step():
                if elapsed is None and out.request_id == rid and out.outputs[0].token_ids:
                    elapsed = time.perf_counter() - start
                if out.finished:
                    final = out
    work = host_work(counts, engine.get_stats().prefix_cache_checkpoint_saves - saves)
    return elapsed, final, work


def host_work(counts, checkpoint_saves: int) -> dict:
    """The per-request breakdown of a row (see the module docstring)."""
    return {
        "fla_calls": counts.fla_calls,
        "rounds": counts.rounds,
        "short_rounds": counts.short_rounds,
        "checkpoint_saves": checkpoint_saves,
        "prefix_ms": round(1e3 * counts.prefix_seconds, 3),
    }


def _hit_rate(engine: LLMEngine, before) -> float:
    s = engine.get_stats()
    queried = s.prefix_cache_queried_tokens - before.prefix_cache_queried_tokens
    return (s.prefix_cache_hit_tokens - before.prefix_cache_hit_tokens) / max(queried, 1)


def system_prompt_prompts(args) -> list[list[int]]:
    system = tokens(args.system_len, args.vocab, seed=7)
    return [system + tokens(args.question_len, args.vocab, 1000 + i) for i in range(args.questions)]


def run_system_prompt(cached: LLMEngine, plain: LLMEngine | None, args) -> dict:
    """TTFT per question (cached engine; the first is the miss) and, for `cold_samples` of the
    hits, the same prompt on `plain`."""
    before = cached.get_stats()
    prompts = system_prompt_prompts(args)
    rows = []
    for i, prompt in enumerate(prompts):
        ttft, out, work = first_token(cached, f"sys{i}", prompt)
        row = {"ttft_s": ttft, "num_cached_tokens": out.num_cached_tokens, **work}
        if plain is not None and 0 < i <= args.cold_samples:
            cold_s, ref, cold_work = first_token(plain, f"sys-cold{i}", prompt)
            same = ref.outputs[0].token_ids == out.outputs[0].token_ids
            row.update(cold_s=cold_s, same_first_token=same, cold_fla_calls=cold_work["fla_calls"])
        rows.append(row)
    return _summary(rows, _hit_rate(cached, before), miss=rows[0]["ttft_s"])


def run_multi_turn(cached: LLMEngine, plain: LLMEngine | None, args) -> dict:
    """Every turn of every chat on `cached`; turns 2.. also on `plain` (cold) when given."""
    before = cached.get_stats()
    rows = []
    for c in range(args.conversations):
        prompt: list[int] = []
        previous = 0
        for t in range(args.turns):
            prompt = prompt + tokens(args.message_len, args.vocab, 5000 + 100 * c + t)
            ttft, out, work = first_token(cached, f"chat{c}-{t}", prompt, args.reply_len)
            row = {"turn": t, "prompt_len": len(prompt), "ttft_s": ttft,
                   "num_cached_tokens": out.num_cached_tokens,
                   "reused_all_but_one_block": out.num_cached_tokens >= previous - 16,
                   **work}  # fmt: skip
            if plain is not None and t > 0:
                cold_s, ref, cold_work = first_token(
                    plain, f"chat-cold{c}-{t}", prompt, args.reply_len
                )
                row.update(cold_s=cold_s, same_first_token=ref.outputs[0].token_ids[:1]
                           == out.outputs[0].token_ids[:1],
                           cold_fla_calls=cold_work["fla_calls"])  # fmt: skip
            rows.append(row)
            prompt = prompt + out.outputs[0].token_ids
            previous = len(prompt) - 1
    later = [r for r in rows if r["turn"] > 0]
    summary = _summary(later, _hit_rate(cached, before))
    summary["all_turns_reuse_all_but_one_block"] = all(r["reused_all_but_one_block"] for r in later)
    return summary


def _summary(rows: list[dict], hit_rate: float, miss: float | None = None) -> dict:
    hits = [r for r in rows if "cold_s" in r]
    out = {"hit_rate": hit_rate, "rows": rows}
    if hits:
        hit_s = statistics.median(r["ttft_s"] for r in hits)
        cold_s = statistics.median(r["cold_s"] for r in hits)
        out["fla_calls_hit_vs_cold"] = [
            statistics.median(r["fla_calls"] for r in hits),
            statistics.median(r["cold_fla_calls"] for r in hits),
        ]
        out.update(median_ttft_hit_s=hit_s, median_ttft_cold_s=cold_s,
                   ttft_cold_over_hit=cold_s / hit_s,
                   all_first_tokens_equal=all(r["same_first_token"] for r in hits))  # fmt: skip
    if miss is not None:
        out["ttft_miss_s"] = miss
    return out


def sweep(factory: EngineFactory, args) -> list[dict]:
    """Hit rate vs checkpoint memory per stride and keep policy (cached engines only)."""
    results = []
    for stride in args.sweep_strides:
        for policy in ("all", "deepest"):
            engine = factory(prefix_caching=True, stride=stride, policy=policy)
            sys_run = run_system_prompt(engine, None, args)
            chat = run_multi_turn(engine, None, args)
            stats = engine.get_stats()
            per = engine.cache_plan.bytes_per_slot
            results.append({
                "stride": stride, "policy": policy,
                "system_prompt_hit_rate": sys_run["hit_rate"],
                "multi_turn_hit_rate": chat["hit_rate"],
                "bytes_per_checkpoint": per,
                "num_checkpoints_reserved": engine.cache_plan.num_checkpoints,
                "checkpoint_bytes_reserved": engine.cache_plan.num_checkpoints * per,
                "checkpoints_written": stats.prefix_cache_checkpoint_saves,
                "checkpoints_cached_at_end": stats.num_cached_checkpoints,
            })  # fmt: skip
            r = results[-1]
            print(
                f"sweep stride {stride} {policy}: hit rate system "
                f"{r['system_prompt_hit_rate']:.3f} chat {r['multi_turn_hit_rate']:.3f}; "
                f"{r['checkpoints_written']} written, {r['checkpoints_cached_at_end']} cached "
                f"x {per} B",
                flush=True,
            )
    return results
