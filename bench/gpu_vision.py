"""Images on one GPU: a ~2B GLM-5.3-Flash-shaped model (random weights, bf16: 12 layers
[KDA, DSA, shared DSA, KDA] x 3 with pooled indexers, 4 hyper-connection streams, 32-expert MoE)
with its ~0.5B vision tower (GLM's default vision config), through hyla's engine.

    encode   the vision tower on one 448 x 448 image (1024 patches -> 256 placeholder rows):
             median ms, and the image processor's CPU ms; baseline: the text model's prefill
             of as many tokens (an engine request of the expanded prompt's length, no image)
    ttft     time to first token of a request with one image vs a text request of the same
             expanded length (each image distinct, prefix caching off): ratio image / text
    decode   tokens/s at batch 1 / 16 / 64 after prefill, every request with its own image vs
             text-only requests of the same length (same CUDA graphs): ratio image / text

    PYTHONPATH=. python3 bench/gpu_vision.py            # H200, ~3 min; writes
                                                        # bench/results/gpu_vision_h200.json
    PYTHONPATH=. python3 bench/gpu_vision.py --smoke    # CPU, tiny sizes: a bug check
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from hyla.config import EngineConfig  # noqa: E402
from hyla.engine.llm import random_model  # noqa: E402
from hyla.engine.llm_engine import LLMEngine  # noqa: E402
from hyla.engine.warmup import warm_up  # noqa: E402
from hyla.layers.glm5_next_vision import Glm5NextVisionTower, VisionConfig  # noqa: E402
from hyla.models.glm5_next import config_from_hf  # noqa: E402
from hyla.multimodal.inputs import ImageLimits, VisionSpec, process_images  # noqa: E402
from hyla.multimodal.runtime import MultimodalRuntime  # noqa: E402
from hyla.request import SamplingParams  # noqa: E402

LIN, IDX = "linear_attention", "indexed_attention"
TEXT_2B = dict(
    vocab_size=154880, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=512,
    num_hidden_layers=12, num_attention_heads=16, num_key_value_heads=16, rms_norm_eps=1e-5,
    kv_lora_rank=512, q_lora_rank=768, qk_rope_head_dim=0, qk_nope_head_dim=192, v_head_dim=128,
    n_routed_experts=32, num_experts_per_tok=4, n_shared_experts=1, n_group=1, topk_group=1,
    routed_scaling_factor=2.5, norm_topk_prob=True, index_topk=2048, index_head_dim=128,
    index_n_heads=32, index_kpool=16, layer_types=[LIN, IDX, IDX, LIN] * 3,
    indexer_types=["full", "full", "shared", "full"] * 3,
    mlp_layer_types=["dense"] + ["sparse"] * 11, linear_head_dim=128, linear_num_heads=16,
    hc_mult=4, swiglu_limit=10.0, max_position_embeddings=131072, bos_token_id=1,
    eos_token_id=2, pad_token_id=0,
)  # fmt: skip
VISION_2B = dict(out_hidden_size=2048, patch_size=14)  # the rest: GLM's defaults (~0.5B)
TEXT_SMOKE = dict(
    TEXT_2B, vocab_size=1024, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32,
    q_lora_rank=24, qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=8,
    num_experts_per_tok=2, index_topk=8, index_head_dim=16, index_n_heads=4, index_kpool=4,
    layer_types=[LIN, IDX, IDX, LIN], indexer_types=["full", "full", "shared", "full"],
    mlp_layer_types=["dense"] + ["sparse"] * 3, linear_head_dim=16, linear_num_heads=4, hc_mult=2,
)  # fmt: skip
VISION_SMOKE = dict(depth=2, hidden_size=32, num_heads=2, intermediate_size=32, out_hidden_size=64,
                    projection_intermediate_size=32, patch_size=14)  # fmt: skip
RESULTS = ROOT / "bench" / "results" / "gpu_vision_h200.json"


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def build(smoke: bool, device: str) -> tuple[LLMEngine, MultimodalRuntime]:
    from transformers.models.glm5_next.image_processing_pil_glm5_next import (
        Glm5NextImageProcessorPil,
    )

    text, vision = (TEXT_SMOKE, VISION_SMOKE) if smoke else (TEXT_2B, VISION_2B)
    dtype = torch.float32 if smoke else torch.bfloat16
    model = random_model(config_from_hf({"model_type": "glm5_next", "text_config": text}),
                         seed=0, device=device).to(dtype)  # fmt: skip
    torch.manual_seed(0)
    tower = Glm5NextVisionTower(VisionConfig.from_hf(vision)).to(device, dtype).eval()
    vocab = text["vocab_size"]
    spec = VisionSpec("glm5_next", vocab - 3, vocab - 2, vocab - 1, merge_size=2)
    processor = Glm5NextImageProcessorPil(patch_size=14, temporal_patch_size=2, merge_size=2)
    runtime = MultimodalRuntime(tower, processor, spec, False, ImageLimits(max_images=1))
    options = dict(device=device, max_model_len=2048, max_num_seqs=64,
                   max_num_batched_tokens=8192, enable_prefix_caching=False)  # fmt: skip
    if smoke:
        options.update(kv_cache_memory=256 << 20, max_num_batched_tokens=2048)
    engine = LLMEngine(model, None, EngineConfig.from_kwargs(**options), runtime)
    warm_up(engine)
    return engine, runtime


def images(n: int, seed: int, side: int = 448) -> list:
    from PIL import Image

    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8))
            for _ in range(n)]  # fmt: skip


def image_prompt(spec: VisionSpec, seed: int, num_text: int = 16) -> list[int]:
    rng = np.random.default_rng(seed)
    text = rng.integers(3, spec.image_token_id - 8, num_text).tolist()
    return text[:4] + [spec.start_token_id, spec.image_token_id, spec.end_token_id] + text[4:]


def text_prompt(length: int, seed: int, vocab: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, vocab - 8, length).tolist()


def time_encode(runtime: MultimodalRuntime, device: str, reps: int) -> dict:
    image = images(1, seed=1)[0]
    t0 = time.perf_counter()
    for _ in range(reps):
        processed = process_images(runtime.processor, [image], 2)[0]
    processor_ms = (time.perf_counter() - t0) / reps * 1e3
    pixels = processed.pixel_values.to(device)
    times = []
    with torch.inference_mode():
        for i in range(reps + 3):
            sync(device)
            t0 = time.perf_counter()
            runtime.tower(pixels, [processed.grid_thw])
            sync(device)
            if i >= 3:
                times.append((time.perf_counter() - t0) * 1e3)
    return {"grid_thw": processed.grid_thw, "image_tokens": processed.num_tokens,
            "encode_ms": statistics.median(times), "processor_cpu_ms": processor_ms}  # fmt: skip


def _run_to_first_token(engine: LLMEngine, rid: str, prompt, data) -> float:
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    t0 = time.perf_counter()
    engine.add_request(rid, prompt, params, multi_modal_data=data)
    while engine.has_unfinished_requests():
        engine.step()
    return (time.perf_counter() - t0) * 1e3


def time_ttft(engine: LLMEngine, runtime: MultimodalRuntime, reps: int, length: int) -> dict:
    vocab = engine.model_config.vocab_size
    text, image = [], []
    for i in range(reps + 1):  # the first of each is a warm-up
        text.append(_run_to_first_token(engine, f"t{i}", text_prompt(length, i, vocab), None))
        data = {"image": images(1, seed=100 + i)}
        image.append(_run_to_first_token(engine, f"i{i}", image_prompt(runtime.spec, i), data))
    t, m = statistics.median(text[1:]), statistics.median(image[1:])
    return {"text_ttft_ms": t, "image_ttft_ms": m, "image_over_text": m / t}


def decode_rate(engine: LLMEngine, batch: int, steps: int, with_images: bool, length: int) -> float:
    """Output tokens/s over `steps` steps once every request has its first token."""
    params = SamplingParams(temperature=0, max_tokens=steps + 16, ignore_eos=True)
    vocab = engine.model_config.vocab_size
    pics = images(batch, seed=1000 + batch) if with_images else [None] * batch
    for i in range(batch):
        if with_images:
            prompt, data = image_prompt(engine.multimodal.spec, i), {"image": [pics[i]]}
        else:
            prompt, data = text_prompt(length, i, vocab), None
        engine.add_request(f"d{i}", prompt, params, multi_modal_data=data)
    counts: dict[str, int] = {}
    while len(counts) < batch or min(counts.values()) < 1:
        for out in engine.step():
            counts[out.request_id] = len(out.outputs[0].token_ids)
    before = sum(counts.values())
    sync(engine.device.type)
    t0 = time.perf_counter()
    for _ in range(steps):
        for out in engine.step():
            counts[out.request_id] = len(out.outputs[0].token_ids)
    sync(engine.device.type)
    elapsed = time.perf_counter() - t0
    engine.abort_request([f"d{i}" for i in range(batch)])
    while engine.has_unfinished_requests():
        engine.step()
    return (sum(counts.values()) - before) / elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="CPU, tiny sizes (a bug check)")
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    device = "cpu" if args.smoke else "cuda"
    batches = [1, 2] if args.smoke else [int(b) for b in args.batches.split(",")]
    steps, reps = (4, 2) if args.smoke else (args.steps, 10)
    from gpu_e2e import git_commit
    from throughput import hardware

    engine, runtime = build(args.smoke, device)
    encode = time_encode(runtime, device, reps)
    length = len(image_prompt(runtime.spec, 0)) - 1 + encode["image_tokens"]
    ttft = time_ttft(engine, runtime, reps, length)
    encode["prefill_ms_same_length"] = ttft["text_ttft_ms"]  # to the first token, no image
    encode["encode_over_prefill"] = encode["encode_ms"] / encode["prefill_ms_same_length"]
    print(f"encode: {encode}", flush=True)
    print(f"ttft:   {ttft}", flush=True)
    decode = {}
    for b in batches:
        text = decode_rate(engine, b, steps, False, length)
        image = decode_rate(engine, b, steps, True, length)
        decode[str(b)] = {"text_tok_s": text, "image_tok_s": image, "image_over_text": image / text}
        print(f"decode B={b}: {decode[str(b)]}", flush=True)
    stats = engine.get_stats()
    assert stats.encoder_cache_entries == 0, stats  # every image released
    result = {
        "command": " ".join(["python3", "bench/gpu_vision.py", *sys.argv[1:]]),
        "commit": git_commit(),
        "hardware": {**hardware(), "gpu": torch.cuda.get_device_name() if device == "cuda"
                     else None},  # fmt: skip
        "model": {"text_params": sum(p.numel() for p in engine.model.parameters()),
                  "vision_params": sum(p.numel() for p in runtime.tower.parameters()),
                  "dtype": str(next(engine.model.parameters()).dtype)},  # fmt: skip
        "image_side": 448, "encode": encode, "ttft": ttft, "decode": decode,
        "num_encoded_images": stats.num_encoded_images,
    }  # fmt: skip
    out = Path(args.out) if args.out else (None if args.smoke else RESULTS)
    if out is not None:
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {out}")
        if os.environ.get("OUT"):
            shutil.copy(out, Path(os.environ["OUT"]) / out.name)


if __name__ == "__main__":
    main()
