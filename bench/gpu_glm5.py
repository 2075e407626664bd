"""GLM-5.3-Flash against Kimi-Linear on one GPU, in one run (issue 30's goals).

Two random-weight bf16 models through hyla's engine (CUDA graphs on, prefix caching off):
  glm5_next    bench/gpu_vision.py's ~2B text model: [KDA, DSA, shared DSA, KDA] x 3, pooled
               indexers (P = 16, top-2048), 4 hyper-connection streams, 32-expert MoE
  kimi_linear  bench/gpu_e2e.py's ~1.5B shape: [KDA, KDA, KDA, MLA] x 3, 32-expert MoE

    decode    B = 1 / 16 / 64 after a 128-token prompt: step ms, tok/s, and step ms per GB of
              weights a step reads (dense weights + the experts the batch is expected to hit,
              `gpu_e2e.decode_bytes`); ratio glm5 / kimi of that (goal <= 1.3 at B=1 and 64)
    prefill   one 8K prompt: tok/s and tok/s times the weight bytes one token reads (B=1);
              ratio glm5 / kimi (goal >= 0.8)
    profile   one glm5 decode step's captured graph replayed under torch.profiler: the share of
              GPU time in PyTorch's generic reduce / elementwise kernels (goal <= 10%), top 15
    long      glm5: one 128K-token prompt: TTFT, then TPOT over 32 tokens (--skip-long: off)

    PYTHONPATH=. python3 bench/gpu_glm5.py --out-dir "$OUT"   # H200, ~5 min; writes
                                                              # bench/results/glm5_h200.json
    PYTHONPATH=. python3 bench/gpu_glm5.py --device cpu --tiny  # a bug check, < 60 s
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu_e2e import (  # noqa: E402
    LINEAR,
    copy_bandwidth,
    decode_bytes,
    environment,
    git_commit,
    hyla_decode,
    hyla_prefill,
    random_prompts,
    run_engine,
    write_result,
)
from gpu_vision import TEXT_2B, TEXT_SMOKE  # noqa: E402
from throughput import hardware  # noqa: E402

from hyla.config import EngineConfig  # noqa: E402
from hyla.engine.llm import random_model  # noqa: E402
from hyla.engine.llm_engine import LLMEngine  # noqa: E402
from hyla.engine.warmup import warm_up  # noqa: E402
from hyla.request import SamplingParams  # noqa: E402

KIMI_1P5B = dict(
    vocab_size=32000, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=512,
    num_hidden_layers=12, num_attention_heads=16, num_key_value_heads=16, kv_lora_rank=512,
    q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
    num_local_experts=32, num_experts_per_tok=4, n_shared_experts=1, n_group=1, topk_group=1,
    routed_scaling_factor=2.446, norm_topk_prob=True,
    linear_attn_config={"head_dim": 128, "num_heads": 16, "short_conv_kernel_size": 4},
    layer_types=[LINEAR, LINEAR, LINEAR, "full_attention"] * 3,
    mlp_layer_types=["dense"] + ["sparse"] * 11, rms_norm_eps=1e-6, pad_token_id=0,
    bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, model_type="kimi_linear",
)  # fmt: skip
KIMI_TINY = dict(
    KIMI_1P5B, vocab_size=512, hidden_size=64, intermediate_size=192, moe_intermediate_size=32,
    num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=32,
    qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, num_local_experts=8,
    num_experts_per_tok=2, linear_attn_config={"head_dim": 16, "num_heads": 2,
    "short_conv_kernel_size": 4}, layer_types=[LINEAR, LINEAR, LINEAR, "full_attention"],
    mlp_layer_types=["dense"] + ["sparse"] * 3,
)  # fmt: skip
RESULTS = ROOT / "bench" / "results" / "glm5_h200.json"
GENERIC = ("reduce_kernel", "elementwise_kernel")  # at::native's generic kernels


def model_config(family: str, tiny: bool, max_len: int):
    if family == "glm5_next":
        from hyla.models.glm5_next import config_from_hf

        text = dict(TEXT_SMOKE if tiny else TEXT_2B, max_position_embeddings=max_len)
        return config_from_hf({"model_type": "glm5_next", "text_config": text})
    from hyla.models.kimi_linear import config_from_hf

    return config_from_hf(dict(KIMI_TINY if tiny else KIMI_1P5B, max_position_embeddings=max_len))


def build_engine(family: str, args: argparse.Namespace, max_len: int) -> LLMEngine:
    dtype = torch.float32 if args.tiny else torch.bfloat16
    model = random_model(model_config(family, args.tiny, max_len), seed=0, device=args.device)
    model = model.to(dtype)
    options = dict(device=args.device, max_model_len=max_len, max_num_seqs=max(args.batches),
                   max_num_batched_tokens=args.chunk, enable_prefix_caching=False,
                   kv_cache_memory=args.kv_cache_gib << 30)  # fmt: skip
    engine = LLMEngine(model, None, EngineConfig.from_kwargs(**options))
    warm_up(engine)
    return engine


def workload(engine: LLMEngine, args: argparse.Namespace, prefill_lens: list[int]):
    """The fields `gpu_e2e.hyla_decode` / `hyla_prefill` read."""
    return SimpleNamespace(batches=args.batches, prompt_len=args.prompt_len,
                           decode_tokens=args.decode_tokens, device=args.device,
                           vocab=engine.model_config.vocab_size, prefill_lens=prefill_lens,
                           chunk=args.chunk)  # fmt: skip


def weight_bytes(engine: LLMEngine, batch: int) -> float:
    moved = decode_bytes(engine.model, batch, 0)
    return moved["weights"] + moved["experts"]


def measure(family: str, args: argparse.Namespace, bandwidth: float) -> tuple[dict, LLMEngine]:
    max_len = max(args.prefill_len, args.prompt_len + 2 * args.decode_tokens) + 64
    if family == "glm5_next" and not args.skip_long:
        max_len = max(max_len, args.long_len + 64)
    t0 = time.perf_counter()
    engine = build_engine(family, args, max_len)
    print(f"{family}: built and warmed up in {time.perf_counter() - t0:.1f} s", flush=True)
    w = workload(engine, args, [args.prefill_len])
    decode = hyla_decode(engine, w, bandwidth)
    for row in decode:
        row["weight_bytes"] = weight_bytes(engine, row["batch"])
        row["ms_per_weight_gb"] = row["step_ms"] / (row["weight_bytes"] / 1e9)
    prefill = hyla_prefill(engine, w)[0]
    prefill["weight_bytes_per_token"] = weight_bytes(engine, 1)
    prefill["tok_s_times_weight_gb"] = (
        prefill["tokens_per_s"] * prefill["weight_bytes_per_token"] / 1e9
    )
    params = sum(p.numel() for p in engine.model.parameters())
    return dict(params=params, decode=decode, prefill=prefill), engine


def _device_us(event) -> float:
    for name in ("device_time_total", "cuda_time_total"):
        if hasattr(event, name):
            return float(getattr(event, name))
    return 0.0


def profile_decode(engine: LLMEngine, args: argparse.Namespace, batch: int) -> dict:
    """Kernels of a captured decode step of `batch` requests, replayed under torch.profiler."""
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    prompts = random_prompts(batch, args.prompt_len, engine.model_config.vocab_size, seed=7)
    for i, p in enumerate(prompts):
        engine.add_request(f"prof{i}", p, params)
    for _ in range(8):
        engine.step()
    graphs = engine.runner.graphs
    if graphs is None or not graphs.steps:
        engine.abort_request([f"prof{i}" for i in range(batch)])
        while engine.has_unfinished_requests():
            engine.step()
        return {"batch": batch, "note": "no captured graph (CPU or graphs off)"}
    static = max(graphs.steps.values(), key=lambda s: (s.size >= batch, -s.size))
    reps = 5
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            static.graph.replay()
        torch.cuda.synchronize()
    while engine.has_unfinished_requests():
        engine.step()
    kernels = [(e.key, _device_us(e) / reps) for e in prof.key_averages() if _device_us(e) > 0]
    total = sum(us for _, us in kernels)
    generic = sum(us for name, us in kernels if "at::native" in name and
                  any(g in name for g in GENERIC))  # fmt: skip
    top = sorted(kernels, key=lambda k: -k[1])[:15]
    return dict(batch=batch, graph_batch=static.size, kernel_us_per_step=total,
                generic_us_per_step=generic, generic_share=generic / total if total else None,
                top=[dict(kernel=name[:160], us_per_step=us, share=us / total)
                     for name, us in top])  # fmt: skip


def long_prompt(engine: LLMEngine, args: argparse.Namespace) -> dict:
    prompt = random_prompts(1, args.long_len, engine.model_config.vocab_size, seed=11)
    t = run_engine(engine, prompt, 33, args.device, "long")
    return dict(prompt_len=args.long_len, ttft_s=t["prefill_s"],
                tpot_ms=1e3 * t["decode_s"] / max(t["decode_steps"], 1),
                prefill_tokens_per_s=args.long_len / t["prefill_s"])  # fmt: skip


def ratios(glm: dict, kimi: dict) -> dict:
    kimi_rows = {r["batch"]: r for r in kimi["decode"]}
    decode = {str(r["batch"]): r["ms_per_weight_gb"] / kimi_rows[r["batch"]]["ms_per_weight_gb"]
              for r in glm["decode"]}  # fmt: skip
    prefill = glm["prefill"]["tok_s_times_weight_gb"] / kimi["prefill"]["tok_s_times_weight_gb"]
    return dict(decode_ms_per_weight_byte_glm5_over_kimi=decode,
                prefill_tok_s_per_weight_byte_glm5_over_kimi=prefill)  # fmt: skip


def run(args: argparse.Namespace) -> dict:
    bandwidth = copy_bandwidth(args.device)
    out: dict = {"copy_bandwidth_gb_s": bandwidth / 1e9}
    kimi, engine = measure("kimi_linear", args, bandwidth)
    del engine
    gc.collect()
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    glm, engine = measure("glm5_next", args, bandwidth)
    out.update(glm5_next=glm, kimi_linear=kimi, ratios=ratios(glm, kimi))
    out["profile"] = [profile_decode(engine, args, b) for b in (1, max(args.batches))]
    for p in out["profile"]:
        print(f"profile B={p['batch']}: generic share {p.get('generic_share')}", flush=True)
    if not args.skip_long:
        out["long"] = long_prompt(engine, args)
        print(f"long: {out['long']}", flush=True)
    print(f"ratios: {out['ratios']}", flush=True)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="tiny fp32 models (a bug check)")
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--decode-tokens", type=int, default=128)
    p.add_argument("--prefill-len", type=int, default=8192)
    p.add_argument("--long-len", type=int, default=131072)
    p.add_argument("--skip-long", action="store_true", help="no 128K-prompt TTFT/TPOT")
    p.add_argument("--chunk", type=int, default=8192, help="max_num_batched_tokens")
    p.add_argument("--kv-cache-gib", type=int, default=16)
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--out-dir", default=None, help="also copy the JSON here (e.g. $OUT)")
    args = p.parse_args(argv)
    if args.tiny:
        args.batches, args.prompt_len, args.decode_tokens = "1,4", 16, 4
        args.prefill_len, args.long_len, args.chunk, args.kv_cache_gib = 128, 256, 128, 1
    args.batches = [int(b) for b in args.batches.split(",")]
    return args


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)
    start = time.perf_counter()
    result = {
        "command": " ".join(["python3", "bench/gpu_glm5.py", *sys.argv[1:]]),
        "commit": git_commit(),
        "hardware": {**hardware(), **environment(args.device)},
        "workload": {k: v for k, v in vars(args).items() if k not in ("out", "out_dir")},
        "results": run(args),
    }
    result["wall_s"] = time.perf_counter() - start
    print(f"total {result['wall_s']:.1f} s")
    if args.tiny and args.out == str(RESULTS):
        return  # a bug check: no result file
    write_result(Path(args.out), args.out_dir, result)


if __name__ == "__main__":
    main()
