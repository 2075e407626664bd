"""Sampler: one batched pass over every row (hyla.engine.sampler) against the per-row reference
loop (hyla.engine.sampling_reference.sample_row, the shape of the old per-row host sampler),
on the same logits and rows, in the same run.

A mixed batch: a quarter plain greedy, a quarter greedy with penalties, a quarter seeded
temperature + top-p, a quarter top-k + min-p + penalties. Reports ms per step for both and
their ratio, and checks that both give the same tokens (same generators).

    PYTHONPATH=$PWD python3 bench/sampler.py [--rows 64] [--vocab 32000] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import git_commit, hardware  # noqa: E402

from hyla.engine.sampler import Sampler, SamplingRow, make_generator  # noqa: E402
from hyla.engine.sampling_reference import sample_row  # noqa: E402
from hyla.request import SamplingParams  # noqa: E402

KINDS = [
    dict(temperature=0),
    dict(temperature=0, repetition_penalty=1.2, presence_penalty=0.3),
    dict(temperature=0.8, top_p=0.9),
    dict(temperature=1.0, top_k=50, min_p=0.05, frequency_penalty=0.5),
]


def make_rows(n: int, vocab: int, device: str, seed_base: int) -> list[SamplingRow]:
    g = torch.Generator().manual_seed(0)
    rows = []
    for i in range(n):
        params = SamplingParams(seed=i, **KINDS[i % len(KINDS)])
        prompt = torch.randint(0, vocab, (200,), generator=g).tolist()
        output = torch.randint(0, vocab, (100,), generator=g).tolist()
        rows.append(
            SamplingRow(params, prompt, output, (2,), make_generator(seed_base + i, device))
        )
    return rows


def timed(fn, repeats: int, device: str) -> tuple[float, list[int]]:
    fn()  # warm
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        out = fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats, out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default="bench/results/sampler_cpu.json")
    args = p.parse_args()
    torch.set_num_threads(1)
    logits = torch.randn(args.rows, args.vocab, device=args.device) * 3
    batched_rows = make_rows(args.rows, args.vocab, args.device, 0)
    ref_rows = make_rows(args.rows, args.vocab, args.device, 0)
    sampler = Sampler(make_generator(0, args.device))
    t_batched, _ = timed(lambda: sampler(logits, batched_rows).token_ids, args.repeats,
                         args.device)  # fmt: skip
    t_rows, _ = timed(
        lambda: [sample_row(logits[i].clone(), r.params, r.prompt_token_ids, r.output_token_ids,
                            r.eos_token_ids, r.generator) for i, r in enumerate(ref_rows)],
        args.repeats, args.device,
    )  # fmt: skip
    same = sampler(logits, make_rows(args.rows, args.vocab, args.device, 7)).token_ids == [
        sample_row(logits[i].clone(), r.params, r.prompt_token_ids, r.output_token_ids,
                   r.eos_token_ids, r.generator)
        for i, r in enumerate(make_rows(args.rows, args.vocab, args.device, 7))
    ]  # fmt: skip
    result = dict(
        command=" ".join(sys.argv),
        commit=git_commit(),
        hardware=hardware(),
        rows=args.rows,
        vocab=args.vocab,
        device=args.device,
        batched_ms=1e3 * t_batched,
        per_row_reference_ms=1e3 * t_rows,
        speedup=t_rows / t_batched,
        same_tokens=same,
    )
    print(json.dumps(result, indent=1))
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
