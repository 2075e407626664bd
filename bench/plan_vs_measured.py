"""`hyla plan`'s roofline estimates against measured H200 numbers (no GPU needed).

Rebuilds the two bench models from the workload recorded in their result files, estimates them
with `hyla.plan` on one H200 (datasheet 4.8 TB/s, 989 bf16 TFLOP/s) and writes
estimate / measured per figure:

    gpu_e2e_h200.json             the 1.5B Kimi-shaped model: decode step at B = 1, 16, 64
                                  (prompt 128 + 128 decoded: mean context 192), prefill 8K TTFT
    gpu_long_context_1m_h200.json the KDA + DSA model at 1,048,576 tokens: TTFT and TPOT

A ratio below 1 means the engine is slower than the roofline (the roofline is a lower bound on
time). The e2e file also records the H200's measured copy bandwidth; the ratio against a
roofline at that bandwidth is given too.

    PYTHONPATH=. python3 bench/plan_vs_measured.py
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from hyla.models.registry import config_from_hf  # noqa: E402
from hyla.plan.costs import param_split  # noqa: E402
from hyla.plan.estimate import Workload, tpot_terms, ttft_s  # noqa: E402
from hyla.plan.gpus import gpu_spec  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _tpot(config, split, gpu, context: int, batch: int) -> float:
    work = Workload(num_gpus=1, context=context, concurrency=batch, weight_dtype=config.dtype)
    terms = tpot_terms(config, split, gpu, work, tp=1, ep=1, batch=batch)
    return max(terms["memory"], terms["compute"]) + terms["comm"]


def _ttft(config, split, gpu, prompt_len: int) -> float:
    work = Workload(num_gpus=1, context=prompt_len, concurrency=1, weight_dtype=config.dtype)
    return ttft_s(config, split, gpu, work, tp=1, ep=1)


def _row(what: str, estimate: float, measured: float, **extra) -> dict:
    return dict(what=what, estimate_s=estimate, measured_s=measured,
                ratio=estimate / measured, **extra)  # fmt: skip


def e2e_rows(gpus: dict) -> list[dict]:
    from gpu_e2e import hf_config

    data = _load("gpu_e2e_h200.json")
    args = argparse.Namespace(**data["workload"])
    config = config_from_hf(hf_config(args).to_dict()).replace(dtype=args.dtype)
    split = param_split(config)
    context = args.prompt_len + args.decode_tokens // 2
    rows = []
    for run in data["results"]["hyla_decode"]:
        b = run["batch"]
        rows.append(_row(f"1.5B decode step B={b}", _tpot(config, split, gpus["datasheet"],
                                                          context, b), run["step_ms"] / 1e3,
                         ratio_at_copy_bw=_tpot(config, split, gpus["copy"], context, b)
                         / (run["step_ms"] / 1e3)))  # fmt: skip
    for run in data["results"]["hyla_prefill"]:
        n = run["prompt_len"]
        rows.append(_row(f"1.5B prefill {n} TTFT", _ttft(config, split, gpus["datasheet"], n),
                         run["ttft_s"]))  # fmt: skip
    return rows


def long_context_rows(gpus: dict) -> list[dict]:
    from gpu_long_context import model_config

    data = _load("gpu_long_context_1m_h200.json")
    args = argparse.Namespace(**data["workload"])
    config = model_config(args)
    split = param_split(config)
    n, res = args.prompt_len, data["results"]
    return [
        _row(f"1M model prefill {n} TTFT", _ttft(config, split, gpus["datasheet"], n),
             res["prefill"]["ttft_s"]),
        _row(f"1M model decode TPOT at {n} (median)",
             _tpot(config, split, gpus["datasheet"], n, 1), res["decode"]["tpot_median_s"]),
    ]  # fmt: skip


def main() -> None:
    h200 = gpu_spec("H200")
    copy_bw = _load("gpu_e2e_h200.json")["results"]["copy_bandwidth_bytes_per_s"]
    gpus = {"datasheet": h200, "copy": h200.replace(memory_bw=copy_bw)}
    rows = e2e_rows(gpus) + long_context_rows(gpus)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip()  # fmt: skip
    out = dict(command="python3 bench/plan_vs_measured.py", commit=commit,
               hardware="estimates: H200 datasheet; measured: bench/results (H200)",
               note="ratio = roofline estimate / measured; below 1: slower than the roofline",
               rows=rows)  # fmt: skip
    path = RESULTS / "plan_vs_measured.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    for r in rows:
        print(f"{r['what']:<44} estimate {r['estimate_s'] * 1e3:10.3f} ms  measured "
              f"{r['measured_s'] * 1e3:10.3f} ms  ratio {r['ratio']:.3f}")  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
