"""Qwen3.5 (`qwen3_5`) text model: hyla vs transformers, and hyla's own invariants.

Oracle: transformers' `Qwen3_5ForConditionalGeneration` (fp32, eager) with the same random
weights (`tests.qwen35_tiny`: flat GDN projections with GVA, gated GQA with partial multimodal
RoPE); hyla loads the saved checkpoint through its loader and runs its paged cache with shuffled
blocks and NaN-poisoned caches (`SequenceRunner`). Tolerance: prefill logits max abs error
<= 1e-4 (fp32); 32 greedy steps identical to `generate`.
"""

from __future__ import annotations

import pytest
import torch

from hyla.models.loader import load_model
from hyla.models.runner import SequenceRunner
from tests.qwen35_tiny import save_tiny_qwen35

PROMPT_LENS = (1, 3, 4, 5, 9, 40, 67)
LOGIT_ATOL = 1e-4
NUM_GREEDY = 32


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3_5")
    torch.set_num_threads(1)
    hf = save_tiny_qwen35(path, seed=0)
    return hf, load_model(path, dtype="float32")


def _prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(1234)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in PROMPT_LENS]


def test_config_maps_the_text_model(pair):
    _, model = pair
    cfg = model.config
    assert cfg.layer_pattern == ("gdn", "gdn", "gdn", "gqa")
    assert cfg.linear.projection_layout == "flat" and cfg.norm_offset == 1.0
    assert cfg.rope.rotary_dim == 12 and cfg.ffn_pattern == ("dense",) * 4


@torch.no_grad()
def test_prefill_logits_match_transformers(pair):
    hf, model = pair
    prompts = _prompts(model.config.vocab_size)
    runner = SequenceRunner(model, num_seqs=len(prompts), max_len=128, block_size=8)
    got = runner.step(dict(enumerate(prompts)), all_logits=True)  # one mixed-length batch
    worst = 0.0
    for i, ids in enumerate(prompts):
        ref = hf(torch.tensor([ids])).logits[0].float()
        err = (got[i] - ref).abs().max().item()
        worst = max(worst, err)
        assert err <= LOGIT_ATOL, f"len={len(ids)} max abs logit error {err:.3e}"
    print(f"qwen3_5: max abs prefill logit error {worst:.3e}")


@torch.no_grad()
def test_greedy_decode_matches_transformers_generate(pair):
    hf, model = pair
    prompts = [p for p in _prompts(model.config.vocab_size) if len(p) in (1, 5, 40)]
    runner = SequenceRunner(model, num_seqs=len(prompts), max_len=128, block_size=8)
    logits = runner.step(dict(enumerate(prompts)))
    outs: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    for _ in range(NUM_GREEDY):
        nxt = {i: int(logits[i].argmax()) for i in outs}
        for i, t in nxt.items():
            outs[i].append(t)
        logits = runner.step({i: [t] for i, t in nxt.items()})
    for i, ids in enumerate(prompts):
        ref = hf.generate(
            torch.tensor([ids]), max_new_tokens=NUM_GREEDY, do_sample=False, pad_token_id=0,
            eos_token_id=None,
        )[0, len(ids) :].tolist()  # fmt: skip
        assert outs[i] == ref, f"len={len(ids)}: {outs[i]} != {ref}"


@pytest.mark.parametrize("chunk", [1, 3, 4, 7, 16])
@torch.no_grad()
def test_chunked_prefill_equals_one_prefill(pair, chunk):
    """I1 split: the GDN state and conv state carried across chunks."""
    _, model = pair
    ids = _prompts(model.config.vocab_size)[-1]  # 67 tokens
    whole = SequenceRunner(model, 1, 128, block_size=8).step({0: ids}, all_logits=True)[0]
    runner = SequenceRunner(model, 1, 128, block_size=8, seed=3)
    parts = [runner.step({0: ids[s : s + chunk]}, all_logits=True)[0]
             for s in range(0, len(ids), chunk)]  # fmt: skip
    assert torch.allclose(torch.cat(parts), whole, atol=1e-5, rtol=0)
