"""bfloat16 inference of each tiny checkpoint against the same checkpoint in float32.

Oracles: hyla in fp32 (the reference-parity path), and `transformers` itself in bf16: with random
weights, routers and the DSA indexer sit near exact ties, so bf16 rounding flips some expert /
top-k choices and moves single logits by up to ~0.15 (logits span ~0.7) in the reference too.
hyla's bf16 error must look like transformers' own bf16 error.

Measured (prompts 1, 17, 80, 150; seed 5), max / mean abs logit error vs fp32, argmax agreement:
  kimi_linear   hyla 0.048 / 0.0023, 98.0%   transformers bf16 0.062 / 0.0027, 97.2%
  qwen3_next    hyla 0.051 / 0.0010, 98.4%   transformers bf16 0.050 / 0.0009, 98.8%
  deepseek_v32  hyla 0.152 / 0.0073, 91.5%   transformers bf16 0.124 / 0.0071, 91.9%
Teacher-forced greedy decode (measured over 32 steps x 4 sequences): 96.9-99.2% agree.
Bounds below: max abs <= 0.25, mean abs <= 1.5x transformers' + 1e-3, argmax agreement >= 85%
and within 8 points of transformers', greedy agreement >= 85%.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from hyla.models.loader import load_model
from hyla.models.runner import SequenceRunner
from tests.hf_tiny import FAMILIES, save_tiny_hf_model

PROMPT_LENS = (1, 17, 80, 150)
NUM_DECODE = 16


@pytest.fixture(scope="module", params=FAMILIES)
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"bf16_{request.param}")
    save_tiny_hf_model(request.param, path, seed=0)
    return path


def _prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in PROMPT_LENS]


@torch.no_grad()
def test_bf16_logits_track_fp32_like_transformers_bf16(checkpoint) -> None:
    f32 = load_model(checkpoint, dtype="float32", progress=False)
    b16 = load_model(checkpoint, dtype="bfloat16", progress=False)
    assert b16.config.dtype == "bfloat16" and b16.lm_head.weight.dtype == torch.bfloat16
    prompts = _prompts(f32.config.vocab_size)
    runners = [SequenceRunner(m, len(prompts), 200) for m in (f32, b16)]
    ref, got = (r.step(dict(enumerate(prompts)), all_logits=True) for r in runners)
    hf = AutoModelForCausalLM.from_pretrained(
        checkpoint, dtype=torch.bfloat16, attn_implementation="eager"
    ).eval()
    hf_out = [hf(torch.tensor([p])).logits[0].float() for p in prompts]
    a, b = torch.cat([ref[i] for i in range(4)]), torch.cat([got[i] for i in range(4)])
    c = torch.cat(hf_out)
    assert b.dtype == torch.float32 and torch.isfinite(b).all()
    err, hf_err = (a - b).abs(), (a - c).abs()
    agree = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    hf_agree = (a.argmax(-1) == c.argmax(-1)).float().mean().item()
    family = f32.config.architecture
    print(
        f"{family} bf16: max {err.max():.4f} mean {err.mean():.5f} agree {agree:.3f} | "
        f"transformers bf16: max {hf_err.max():.4f} mean {hf_err.mean():.5f} agree {hf_agree:.3f}"
    )
    assert err.max() <= 0.25
    assert err.mean() <= 1.5 * hf_err.mean() + 1e-3
    assert agree >= 0.85 and agree >= hf_agree - 0.08

    # teacher-forced greedy decode: feed fp32's greedy token to both, compare bf16's choice
    last = [{i: ref[i][-1] for i in range(4)}, {i: got[i][-1] for i in range(4)}]
    same = 0
    for _ in range(NUM_DECODE):
        nxt = {i: int(last[0][i].argmax()) for i in range(4)}
        same += sum(int(last[1][i].argmax()) == t for i, t in nxt.items())
        last = [r.step({i: [t] for i, t in nxt.items()}) for r in runners]
    assert same / (4 * NUM_DECODE) >= 0.85, f"{family}: greedy agreement {same}/{4 * NUM_DECODE}"
    # linear states stay float32 in a bf16 model; per-token caches follow the model dtype
    for cache in runners[1].caches:
        if "recurrent_state" in cache:
            assert cache["recurrent_state"].dtype == torch.float32
        for name in ("latent", "k"):
            if name in cache:
                assert cache[name].dtype == torch.bfloat16
