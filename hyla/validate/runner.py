"""`hyla validate`: run the selected checks via the engine's public APIs; write the report."""

from __future__ import annotations

import platform
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hyla.validate.result import CheckResult

CHECK_NAMES = ("precision", "long_context", "throughput", "service", "vision")


@dataclass
class Context:
    model: Path
    reference: Path
    out_dir: Path
    device: str
    dtype: str
    quick: bool
    url: str | None = None
    engine_options: dict[str, Any] = field(default_factory=dict)
    _llm: Any = None

    @property
    def llm(self) -> Any:
        if self._llm is None:
            from hyla.engine.llm import LLM

            options = {"device": self.device, "dtype": self.dtype, **self.engine_options}
            if self.quick:
                options.setdefault("max_num_batched_tokens", 32)  # several prefill chunks
                options.setdefault("max_num_encoder_input_tokens", 4096)  # whole images
            self._llm = LLM(str(self.model), **options)
        return self._llm

    @property
    def vocab_size(self) -> int:
        return self.llm.engine.model_config.vocab_size

    @property
    def prompt_vocab_size(self) -> int:
        """Random prompt ids stay below this (a multimodal checkpoint's first image/video id)."""
        from hyla.multimodal.inputs import read_config

        config = read_config(self.model) if (self.model / "config.json").exists() else {}
        special = [v for k, v in config.items() if k.endswith("_token_id") and isinstance(v, int)
                   and any(w in k for w in ("image", "video", "vision"))]  # fmt: skip
        return min([self.vocab_size, *special])

    def samples(self, max_tokens: int) -> list[tuple[str, list[int]]]:
        from hyla.validate.samples import precision_samples

        return precision_samples(self.llm.tokenizer, self.prompt_vocab_size, max_tokens)


def _checks() -> dict[str, Callable[[Context, Any], CheckResult]]:
    from hyla.validate.long_context import run_long_context
    from hyla.validate.precision import run_precision
    from hyla.validate.service import run_service
    from hyla.validate.throughput import run_throughput
    from hyla.validate.vision import run_vision

    return {
        "precision": run_precision,
        "long_context": run_long_context,
        "throughput": run_throughput,
        "service": run_service,
        "vision": run_vision,
    }


def _commit() -> str:
    root = Path(__file__).resolve().parent
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                          capture_output=True, text=True)  # fmt: skip
    return done.stdout.strip() or "unknown"


def run_validate(ctx: Context, checks: tuple[str, ...]) -> tuple[dict[str, Any], list]:
    """Run `checks` in order and write the report. Returns (meta, results)."""
    from tqdm import tqdm

    from hyla.validate.report import write_report

    unknown = [c for c in checks if c not in CHECK_NAMES]
    if unknown:
        raise ValueError(f"checks: unknown {unknown}; choose from {', '.join(CHECK_NAMES)}")
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    registry, results, start = _checks(), [], time.perf_counter()
    # fractional progress: a percentage, not "2.1666666666666665/6"
    fmt = "{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}{postfix}]"
    total = len(checks) + checks.count("precision")
    with tqdm(total=total, desc="validate", bar_format=fmt) as bar:
        for name in checks:
            bar.set_postfix_str(name)
            try:
                results.append(registry[name](ctx, bar))
            except Exception as e:  # noqa: BLE001 - one broken check must not lose the report
                crashed = CheckResult(name, name)
                crashed.fail(f"the check crashed: {type(e).__name__}: {str(e)[:300]}")
                results.append(crashed)
    if ctx._llm is not None:  # tensor-parallel ranks end here, not at interpreter exit
        ctx._llm.shutdown()
    meta = {"model": str(ctx.model), "reference": str(ctx.reference), "device": ctx.device,
            "dtype": ctx.dtype, "quick": ctx.quick, "commit": _commit(),
            "host": platform.node(), "wall_s": round(time.perf_counter() - start, 2)}  # fmt: skip
    write_report(ctx.out_dir, meta, results)
    return meta, results
