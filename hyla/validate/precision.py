"""Check (a): teacher-forced precision on the reference's greedy continuation. float32: |logprob
diff| <= 1e-3, KL <= 1e-5, all top-1, same text; bf16/fp16: <= 1.5x the reference's own error
pooled over all samples (one is too noisy a bound), + 1e-3."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from hyla.validate.result import CheckResult
from hyla.validate.ties import Tie

FP32_LOGPROB_BOUND, FP32_KL_BOUND = 1e-3, 1e-5
LOW_PRECISION_FACTOR, LOW_PRECISION_SLACK = 1.5, 1e-3
TOP_K = 20


@dataclass
class Errors:
    logprob: list[float]
    kl: list[float]
    top1: list[bool]


def position_errors(
    ref: torch.Tensor, got: list[dict[int, float]], ids: list[int], tie: float
) -> Errors:
    """`ref`: reference log-probs `[T, V]`; `got[j]`: hyla's top-k dict for token j + 1."""
    out = Errors([], [], [])
    for j, d in enumerate(got):
        row = ref[j]
        top = row.topk(TOP_K).indices.tolist()
        common = [t for t in dict.fromkeys([ids[j + 1], *top]) if t in d]
        diffs = [abs(d[t] - float(row[t])) for t in common]
        out.logprob.append(max(diffs))
        p = [math.exp(float(row[t])) for t in common]
        kl = sum(pi * (float(row[t]) - d[t]) for pi, t in zip(p, common, strict=True))
        rest_p = max(1.0 - sum(p), 1e-12)
        rest_q = max(1.0 - sum(math.exp(d[t]) for t in common), 1e-12)
        out.kl.append(max(0.0, kl + rest_p * math.log(rest_p / rest_q)))
        best = max(d, key=d.get)
        out.top1.append(float(row[best]) >= float(row.max()) - tie)
    return out


def ref_self_errors(low: torch.Tensor, ref: torch.Tensor, ids: list[int]) -> Errors:
    got = []
    for j in range(len(ids) - 1):
        top = low[j].topk(TOP_K).indices.tolist() + [ids[j + 1]]
        got.append({t: float(low[j][t]) for t in top})
    return position_errors(ref, got, ids, tie=0.0)


def _first_divergence(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)


def bounds(dtype: str, own: Errors | None) -> tuple[float, float, float]:
    if dtype == "float32" or own is None:
        return FP32_LOGPROB_BOUND, FP32_KL_BOUND, 1.0
    lp = LOW_PRECISION_FACTOR * max(own.logprob) + LOW_PRECISION_SLACK
    kl = LOW_PRECISION_FACTOR * max(own.kl) + LOW_PRECISION_SLACK
    agree = sum(own.top1) / len(own.top1) - 0.02
    return lp, kl, agree


def pooled(parts: list[Errors]) -> Errors:
    return Errors(*(sum((getattr(p, f) for p in parts), []) for f in ("logprob", "kl", "top1")))


def bound_text(dtype: str, has_low_reference: bool) -> str:
    if not has_low_reference:
        return (f"fp32: |logprob diff| <= {FP32_LOGPROB_BOUND:g}, KL <= {FP32_KL_BOUND:g}, "
                "top-1 agreement 1, identical greedy text")  # fmt: skip
    return (f"{dtype}: <= {LOW_PRECISION_FACTOR}x the reference's own {dtype}-vs-fp32 error "
            f"+ {LOW_PRECISION_SLACK:g}")  # fmt: skip


def check_sample(
    result: CheckResult,
    name: str,
    ids: list[int],
    seq: list[int],
    hyla_lp: list,
    hyla_greedy: list[int],
    ref_lp: torch.Tensor,
    own: Errors | None,
    dtype: str,
    tie: Tie | None = None,
) -> list[Any]:
    """Score one sample, record failures, return its table row; misses from `tie` on are notes."""
    lp_bound, kl_bound, agree_bound = bounds(dtype, own)
    err = position_errors(ref_lp, hyla_lp[1:], seq, tie=lp_bound)
    untied = len(err.logprob) if tie is None else min(tie.position, len(err.logprob))
    notes: list[str] = []

    def miss(position: int, message: str) -> None:
        if position < untied:
            result.fail(f"{name}: {message}")
        else:
            notes.append(message)

    bad = next((j for j, e in enumerate(err.logprob) if e > lp_bound), None)
    if bad is not None:
        miss(bad, f"|logprob diff| {err.logprob[bad]:.3g} > {lp_bound:.3g} first at position "
             f"{bad} (token {seq[bad]} -> {seq[bad + 1]})")  # fmt: skip
    bad_kl = next((j for j, e in enumerate(err.kl) if e > kl_bound), None)
    if bad_kl is not None:
        miss(bad_kl, f"KL {err.kl[bad_kl]:.3g} > {kl_bound:.3g} first at position {bad_kl}")
    agree = sum(err.top1) / len(err.top1)
    if agree < agree_bound:
        first = err.top1.index(False)
        strict = err.top1[:untied]
        position = first if not strict or sum(strict) / len(strict) < agree_bound else untied
        miss(position, f"top-1 agreement {agree:.3f} < {agree_bound:.3f} (first disagreement "
             f"at position {first})")  # fmt: skip
    ref_greedy = seq[len(ids) :]
    diverge = _first_divergence(hyla_greedy, ref_greedy)
    if dtype == "float32" and diverge is not None:  # token g is predicted at len(ids) + g - 1
        miss(len(ids) + diverge - 1, f"greedy text differs from the reference at generated "
             f"token {diverge} (position {len(ids) + diverge})")  # fmt: skip
    if notes and tie is not None:
        result.notes.append(
            f"{name}: the reference's indexer top-k boundary scores tie from position "
            f"{tie.position} on ({tie.module}, {tie.num_rows} tied row(s)): its selection there "
            f"is arbitrary, so positions >= {tie.position} are not held to the bound; there: "
            + "; ".join(notes)
        )
    return [name, len(seq), max(err.logprob), max(err.kl), agree,
            "none" if diverge is None else diverge,
            "-" if tie is None else tie.position]  # fmt: skip


def _plot(path, series: dict[str, list[float]], bound: float) -> None:
    from hyla.validate.plots import line_plot

    line_plot(path, series, xlabel="position", ylabel="max |logprob diff|", log_y=True,
              hline=(bound, "bound"), title="per-position |logprob diff| vs reference")  # fmt: skip


def run_precision(ctx: Any, progress: Any) -> CheckResult:
    from hyla.request import SamplingParams
    from hyla.validate.references import load_reference

    result = CheckResult("precision", "Precision alignment")
    ref = load_reference(ctx.reference, "float32", ctx.device)
    low = None if ctx.dtype == "float32" else load_reference(ctx.reference, ctx.dtype, ctx.device)
    max_tokens, num_greedy = (48, 8) if ctx.quick else (1024, 32)
    # prompt + greedy tokens + the scored step must fit --max-model-len
    max_tokens = max(1, min(max_tokens, ctx.llm.engine.max_model_len - num_greedy - 1))
    samples = ctx.samples(max_tokens)
    seqs = [ids + ref.greedy(ids, num_greedy) for _, ids in samples]
    progress.update(1)
    scored = ctx.llm.generate(seqs, SamplingParams(max_tokens=1, temperature=0.0,
                                                   prompt_logprobs=TOP_K))  # fmt: skip
    greedy = ctx.llm.generate([ids for _, ids in samples], SamplingParams(
        max_tokens=num_greedy, temperature=0.0, ignore_eos=True))  # fmt: skip
    ref_lps, ties = [], []
    for seq in seqs:
        ref_lps.append(ref.logprobs(seq))
        ties.append(getattr(ref, "last_tie", None))
    parts, own = [], None
    if low is not None:
        parts = [ref_self_errors(low.logprobs(q), r, q) for q, r in zip(seqs, ref_lps, strict=True)]
        own = pooled(parts)
    rows, series = [], {}
    for i, ((name, ids), seq, out, g) in enumerate(zip(samples, seqs, scored, greedy, strict=True)):
        got = list(g.outputs[0].token_ids)
        row = check_sample(result, name, ids, seq, out.prompt_logprobs, got, ref_lps[i], own,
                           ctx.dtype, ties[i])  # fmt: skip
        rows.append([*row, max(parts[i].logprob) if parts else "-"])
        series[name] = position_errors(ref_lps[i], out.prompt_logprobs[1:], seq, tie=0.0).logprob
    lp_bound = bounds(ctx.dtype, own)[0]
    result.bound = bound_text(ctx.dtype, low is not None)
    result.reason = f"reference: {ref.name}"
    result.tables.append(("per sample", ["sample", "tokens", "max |logprob diff|", "max KL",
                                         "top-1 agreement", "greedy divergence",
                                         "first indexer tie", "reference's own max diff"],
                           rows))  # fmt: skip
    result.metrics = {"max_logprob_diff": max(r[2] for r in rows),
                      "max_kl": max(r[3] for r in rows),
                      "min_top1_agreement": min(r[4] for r in rows)}  # fmt: skip
    _plot(ctx.out_dir / "precision.png", series, lp_bound)
    result.plots.append("precision.png")
    progress.update(1)
    return result
