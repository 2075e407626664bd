"""`hyla plan` against every family's full-size model built on the meta device (no GPU, no
memory): per-rank weight, cache and state bytes of the plan vs the sharded meta build
(`hyla.plan.meta_check`), on 8 H200 at a 128K context.

Models: transformers' config classes at their defaults (the released sizes: Kimi-Linear-48B,
DeepSeek-V3.2 671B, Qwen3-Next-80B, Qwen3.5 9B with its vision tower, GLM-5.3-Flash 313B with
its vision tower), DeepSeek-V3.2 with its released fp8 `quantization_config`.

    PYTHONPATH=. python3 bench/plan_meta_check.py   # writes bench/results/plan_meta_check.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hyla.plan.estimate import Workload  # noqa: E402
from hyla.plan.gpus import gpu_spec  # noqa: E402
from hyla.plan.meta_check import CASES, check_layout, default_config, write_config  # noqa: E402


def run(context: int, num_gpus: int) -> list[dict]:
    gpu = gpu_spec("H200")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, cls, extra, weights, cache, layouts in CASES:
            path = write_config(default_config(cls, extra), Path(tmp) / cls)
            work = Workload(num_gpus=num_gpus, context=context, concurrency=64,
                            weight_dtype=weights)  # fmt: skip
            for tp, ep in layouts:
                row = check_layout(path, gpu, work, tp, ep, kv_cache_dtype=cache)
                rows.append({"name": name, **row})
                print(
                    f"{name:20s} {row['layout']:12s} max rel err {row['max_rel_err']:.2e} "
                    f"weights/GPU {row['plan']['weight_bytes'] / 2**30:7.1f} GiB "
                    f"fits {row['fits']!s:5s} seqs {row['max_seqs']:4d} "
                    f"{'refused: ' + row['engine_refuses'] if row['engine_refuses'] else ''}"
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--context", type=int, default=131072)
    parser.add_argument("--num-gpus", type=int, default=8)
    parser.add_argument("--out", default=str(ROOT / "bench/results/plan_meta_check.json"))
    args = parser.parse_args()
    start = time.perf_counter()
    rows = run(args.context, args.num_gpus)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    result = {"command": "PYTHONPATH=. python3 bench/plan_meta_check.py", "commit": commit,
              "hardware": f"{platform.node()} (CPU only: meta device, no memory)",
              "gpu": "H200 (datasheet)", "num_gpus": args.num_gpus, "context": args.context,
              "bound": "plan within 2% of the meta build per rank", "rows": rows,
              "all_within_bound": all(r["max_rel_err"] <= 0.02 for r in rows),
              "wall_s": round(time.perf_counter() - start, 1)}  # fmt: skip
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
