"""FP8 on one GPU: decode tokens/s with fp8 weights (and an fp8 cache) vs bf16, same run, and
the cache capacity at a fixed budget.

The model is bench/gpu_e2e.py's ~1.5B Kimi-Linear-shaped random model, saved once with
`save_pretrained` (bf16) and loaded three times by hyla's loader:

    bf16         as stored
    fp8          `quantization="fp8"`: 128x128 block-scaled e4m3 projections and experts (the
                 Triton GEMV for decode rows, W8A8 GEMM for prefill), bf16 cache
    fp8+fp8kv    and `kv_cache_dtype="fp8"` (MLA latents e4m3 + a scale per token)

Decode rows as gpu_e2e.py's (greedy, fixed lengths, CUDA graphs, B = 1/16/64): step time,
tokens/s, MBU (bytes a step must read, fp8 weights at 1 byte + scales); ratio = fp8 step time /
bf16 step time (goal at B=1: <= 0.6). Capacity: tokens a `--kv-cache-gib` budget holds
(budget minus the state slots, over the cache bytes per token: `hyla.cache.spec`), bf16 vs
fp8. `--big` adds a ~30B-parameter random model of the same shape family built in memory
(bf16, then fp8), decode rows only.

    PYTHONPATH=. python3 bench/gpu_fp8.py             # H200, ~4 min
    PYTHONPATH=. python3 bench/gpu_fp8.py --big       # + the ~30B model, ~8 min
    PYTHONPATH=. python3 bench/gpu_fp8.py --smoke     # CPU, tiny model, a bug check
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import gpu_e2e  # noqa: E402

from hyla.cache.spec import bytes_per_state_slot, bytes_per_token  # noqa: E402
from hyla.config import EngineConfig, QuantizationConfig  # noqa: E402
from hyla.engine.llm_engine import LLMEngine  # noqa: E402
from hyla.models.loader import build_empty_model  # noqa: E402
from hyla.models.quantization import choose_fp8, convert_modules  # noqa: E402
from hyla.models.registry import config_from_hf  # noqa: E402

VARIANTS = {
    "bf16": {},
    "fp8": {"quantization": "fp8"},
    "fp8+fp8kv": {"quantization": "fp8", "kv_cache_dtype": "fp8"},
}


def engine_options(args: argparse.Namespace) -> dict:
    longest = args.prompt_len + args.decode_tokens + 16
    return dict(
        device=args.device, dtype=args.dtype, max_num_seqs=max(args.batches),
        max_num_batched_tokens=args.chunk, max_model_len=longest, enable_prefix_caching=False,
        kv_cache_memory=args.kv_cache_gib << 30,
    )  # fmt: skip


def free(engine: LLMEngine | None) -> None:
    del engine
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def decode_rows(engine: LLMEngine, args, bandwidth: float, name: str) -> list[dict]:
    rows = gpu_e2e.hyla_decode(engine, args, bandwidth)
    graphs = engine.runner.graphs  # a failed capture empties it and decode runs eagerly
    captured = [s for s in graphs.steps.values() if s.graph is not None] if graphs else []
    for row in rows:
        row["variant"] = name
        row["graphs_captured"] = len(captured)
        row["weight_bytes"] = sum(p.numel() * p.element_size() for p in engine.model.parameters())
        row.pop("tokens", None)
    return rows


def ratios(rows: list[dict]) -> list[dict]:
    """fp8 step time / bf16 step time per variant and batch."""
    base = {r["batch"]: r["step_ms"] for r in rows if r["variant"].endswith("bf16")}
    out = []
    for r in rows:
        if r["batch"] in base and not r["variant"].endswith("bf16"):
            out.append(dict(variant=r["variant"], batch=r["batch"],
                            step_time_vs_bf16=r["step_ms"] / base[r["batch"]]))  # fmt: skip
            ratio = out[-1]["step_time_vs_bf16"]
            print(f"{r['variant']:14s} B={r['batch']:3d}: step {ratio:.2f}x bf16")
    return out


def capacity(config, args) -> dict:
    """Tokens the cache budget holds, bf16 vs fp8 entries (max_num_seqs state slots first)."""
    budget = args.kv_cache_gib << 30
    slots = (max(args.batches) + 1) * bytes_per_state_slot(config)
    out = {}
    for dtype in ("bfloat16", "fp8"):
        per_token = bytes_per_token(config.replace(kv_cache_dtype=dtype))
        out[dtype] = {"bytes_per_token": per_token, "tokens": (budget - slots) // per_token}
    out["fp8_vs_bf16"] = out["fp8"]["tokens"] / out["bfloat16"]["tokens"]
    print(f"capacity at {args.kv_cache_gib} GiB: bf16 {out['bfloat16']['tokens']:,} tokens, "
          f"fp8 {out['fp8']['tokens']:,} ({out['fp8_vs_bf16']:.2f}x)")  # fmt: skip
    return out


def small_model(args, bandwidth: float) -> dict:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        hf = gpu_e2e.build_hf_model(args, torch.bfloat16)
        hf.save_pretrained(tmp, safe_serialization=True)
        config = config_from_hf(hf.config.to_dict())
        del hf
        free(None)
        for name, extra in VARIANTS.items():
            t0 = time.perf_counter()
            engine = LLMEngine.from_path(tmp, **engine_options(args), **extra)
            print(f"{name}: loaded in {time.perf_counter() - t0:.1f} s")
            rows += decode_rows(engine, args, bandwidth, name)
            free(engine)
    return {"decode": rows, "ratios": ratios(rows), "capacity": capacity(config, args)}


@torch.no_grad()
def random_fill(model) -> None:
    gen = torch.Generator(device=model.embed_tokens.weight.device).manual_seed(0)
    for name, p in model.named_parameters():
        if p.dtype == torch.float8_e4m3fn:  # e4m3 codes in [-448, 448]; scales ~ 1/448 / sqrt(D)
            codes = torch.randn(p.shape, generator=gen, device=p.device).mul_(100)
            p.copy_(codes.clamp_(-448, 448))
        elif name.endswith("_scale_inv"):
            p.fill_(1.0 / 448 / 30)
        elif p.dim() >= 2:
            p.normal_(0.0, p.shape[-1] ** -0.5, generator=gen)
        else:
            p.fill_(1.0 if "norm" in name else 0.0)


def big_model(args, bandwidth: float) -> dict:
    big = argparse.Namespace(**vars(args))
    big.layers, big.hidden, big.heads, big.experts = 28, 4096, 32, 64
    big.experts_per_tok, big.moe_intermediate, big.kv_lora_rank = 6, 1408, 512
    config = config_from_hf(gpu_e2e.hf_config(big).to_dict()).replace(dtype="bfloat16")
    rows = []
    for name in ("bf16", "fp8"):
        quant = QuantizationConfig() if name == "fp8" else None
        model = build_empty_model(config.replace(quantization=quant), args.device)
        if quant is not None:
            convert_modules(model, choose_fp8(model, set(), True), torch.bfloat16, args.device)
        random_fill(model)
        params = sum(p.numel() for p in model.parameters())
        print(f"big {name}: {params / 1e9:.1f} B parameters")
        engine = LLMEngine(model.eval(), None, EngineConfig.from_kwargs(**engine_options(args)))
        rows += decode_rows(engine, args, bandwidth, f"big_{name}")
        del model
        free(engine)
    return {"decode": rows, "ratios": ratios(rows), "num_params": params}


def run(args: argparse.Namespace) -> dict:
    bandwidth = gpu_e2e.copy_bandwidth(args.device)
    result = {"copy_bandwidth_TBps": bandwidth / 1e12, "small": small_model(args, bandwidth)}
    if args.big:
        result["big"] = big_model(args, bandwidth)
    return result


def main() -> None:
    argv = sys.argv[1:]
    big = "--big" in argv
    argv = [a for a in argv if a != "--big"]
    args = gpu_e2e.parse_args(argv + ["--skip-hf", "--skip-eager", "--prefill-lens", ""])
    args.big = big and not args.smoke
    if args.smoke:  # fla's kernels need a GPU: let transformers take its PyTorch fallback
        sys.modules["fla"] = None  # type: ignore[assignment]
    if "--out" not in argv:
        args.out = str(ROOT / "bench" / "results" / "gpu_fp8_h200.json")
    gpu_e2e.run_and_record("bench/gpu_fp8.py", args, run)


if __name__ == "__main__":
    main()
