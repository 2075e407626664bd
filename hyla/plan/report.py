"""Text and JSON renderings of a PlanReport."""

from __future__ import annotations

import dataclasses
from typing import Any

from hyla.cache.spec import kv_dtype
from hyla.models.inspect import _bytes, _count
from hyla.plan.planner import ESTIMATE_NOTE, PlanReport, serve_command


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds < 10 else f"{seconds:.1f} s"


def _peak(gpu: Any, weight_dtype: str) -> str:
    name = gpu.peak_name(weight_dtype)
    same = {"bf16": "bfloat16", "fp8": "fp8"}[name] == weight_dtype
    return f"{name} peak" if same else f"{name} peak, used for {weight_dtype} weights"


def _replicas(e: Any) -> str:
    return f"  (x {e.dp} servers, {e.tp} GPU{'s' * (e.tp > 1)} each)" if e.dp > 1 else ""


def format_plan(report: PlanReport) -> str:
    """Human-readable plan: the model's costs, then one row per layout, best first."""
    c, w, g, s = report.config, report.work, report.gpu, report.split
    head = [
        f"model     {c.architecture} ({report.path}): {_count(s.total)} parameters "
        f"({_count(s.experts)} in routed experts), weights in {w.weight_dtype}, "
        f"cache in {kv_dtype(c)}",
        f"hardware  {w.num_gpus} x {g.name}: {_bytes(g.memory)}, {g.memory_bw / 1e12:.2f} TB/s, "
        f"{g.flops(w.weight_dtype) / 1e12:.0f} TFLOP/s ({_peak(g, w.weight_dtype)}), "
        f"link {g.link_bw / 1e9:.0f} GB/s",
        f"workload  {w.concurrency} sequences x {w.context:,} tokens; TTFT for one "
        f"{w.context:,}-token prompt, TPOT at that context",
        "",
    ]
    cols = (
        "layout",
        "weights/GPU",
        "cache/token/GPU",
        "state/seq/GPU",
        "max seqs",
        "TTFT",
        "TPOT",
        "tok/s",
        "binding constraint",
    )
    rows = [cols]
    for e in report.layouts:
        rows.append(
            (
                f"TP{e.tp} DP{e.dp} EP{e.ep}",
                _bytes(e.weight_bytes),
                _bytes(e.cache_bytes_per_token),
                _bytes(e.state_bytes_per_seq),
                str(e.max_seqs),
                _ms(e.ttft_s),
                _ms(e.tpot_s) if e.fits else "-",
                f"{e.output_tokens_per_s:,.0f}" if e.fits else "-",
                e.binding,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols) - 1)]
    body = [
        "  ".join(v.ljust(wd) for v, wd in zip(r[:-1], widths, strict=True)) + "  " + r[-1]
        for r in rows
    ]
    best = next((e for e in report.layouts if e.fits), None)
    tail = [] if best is None else [f"serve     {serve_command(best)}" + _replicas(best)]
    tail += [f"refused   {name}: {why}" for name, why in report.refused]
    return "\n".join(head + body + tail + ["", f"note: {ESTIMATE_NOTE}"])


def plan_to_json(report: PlanReport) -> dict[str, Any]:
    return {
        "path": report.path,
        "architecture": report.config.architecture,
        "gpu": dataclasses.asdict(report.gpu),
        "workload": dataclasses.asdict(report.work),
        "params": {**dataclasses.asdict(report.split), "total": report.split.total},
        "layouts": [
            {**dataclasses.asdict(e), "output_tokens_per_s": e.output_tokens_per_s,
             "serve_command": serve_command(e)}
            for e in report.layouts
        ],
        "refused": [{"layout": n, "reason": r} for n, r in report.refused],
        "note": ESTIMATE_NOTE,
    }
