"""The checks the per-family parity tests share: hyla's model (through `SequenceRunner`: paged
caches, shuffled blocks, NaN-poisoned pools) against the `transformers` model of the same
weights, fp32."""

from __future__ import annotations

import torch

from hyla.models.runner import SequenceRunner


@torch.no_grad()
def assert_prefill_matches(hf, model, prompts, atol: float, label: str, **runner) -> float:
    """Every prompt's prefill logits (one mixed-length batch) within `atol` of `hf`'s; returns
    the largest error (printed: the closing notes quote it)."""
    seqs = SequenceRunner(model, num_seqs=len(prompts), **{"max_len": 256, **runner})
    got = seqs.step(dict(enumerate(prompts)), all_logits=True)
    worst = 0.0
    for i, ids in enumerate(prompts):
        err = (got[i] - hf(torch.tensor([ids])).logits[0].float()).abs().max().item()
        worst = max(worst, err)
        assert err <= atol, f"{label} len={len(ids)} max abs logit error {err:.3e}"
    print(f"{label}: max abs prefill logit error {worst:.3e}")
    return worst


@torch.no_grad()
def assert_greedy_matches_generate(
    hf, model, prompts, steps: int, label: str, stop_at_eos: bool = True, **runner
) -> None:
    """`steps` greedy tokens of a batch equal `hf.generate`'s for each prompt (with
    `stop_at_eos`, generate stops early only on EOS, which hyla's raw loop must then have
    produced too; without, all `steps` are compared)."""
    seqs = SequenceRunner(model, num_seqs=len(prompts), **{"max_len": 256, **runner})
    logits = seqs.step(dict(enumerate(prompts)))
    outs: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    for _ in range(steps):
        nxt = {i: int(logits[i].argmax()) for i in outs}
        for i, t in nxt.items():
            outs[i].append(t)
        logits = seqs.step({i: [t] for i, t in nxt.items()})
    for i, ids in enumerate(prompts):
        eos = {} if stop_at_eos else {"eos_token_id": None}
        ref = hf.generate(
            torch.tensor([ids]), max_new_tokens=steps, do_sample=False, pad_token_id=0, **eos
        )[0, len(ids) :].tolist()
        assert len(ref) == steps or ref[-1] == hf.generation_config.eos_token_id
        assert outs[i][: len(ref)] == ref, f"{label} len={len(ids)}: {outs[i]} != {ref}"


@torch.no_grad()
def assert_chunked_equals_whole(model, ids: list[int], chunk: int, block_size: int = 8) -> None:
    """I1 split: the prompt's logits prefilled `chunk` tokens at a time (another block layout)
    equal one prefill's within 1e-5."""
    whole = SequenceRunner(model, 1, 128, block_size=block_size).step({0: ids}, all_logits=True)
    runner = SequenceRunner(model, 1, 128, block_size=block_size, seed=3)
    parts = [runner.step({0: ids[s : s + chunk]}, all_logits=True)[0]
             for s in range(0, len(ids), chunk)]  # fmt: skip
    assert torch.allclose(torch.cat(parts), whole[0], atol=1e-5, rtol=0)
