"""Speculative decoding with temperature > 0 samples from the target model: the joint
distribution of the first two generated tokens, the second decided by a verify step (its draft
accepted, or rejected and replaced), against the exact distribution computed from the
`transformers` model (temperature, top-k, softmax), by a chi-square test at fixed seeds with a
generous threshold (p > 1e-3)."""

from __future__ import annotations

import pytest
import torch

import hyla.spec.decoder
from hyla.request import SamplingParams
from tests.engine.engine_util import make_engine, one_torch_thread, prompt_ids, run_all
from tests.hf_tiny import build_tiny_hf_model

NUM_RUNS = 600
TOP_K = 4
TEMPERATURE = 0.8


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


def next_probs(hf, ids: list[int]) -> torch.Tensor:
    """[V] the target distribution after `ids`: logits / T, top-k, softmax."""
    with torch.no_grad():
        x = hf(torch.tensor([ids])).logits[0, -1].double() / TEMPERATURE
    kth = torch.topk(x, TOP_K).values[-1]
    return torch.softmax(x.masked_fill(x < kth, float("-inf")), dim=-1)


def chi_square_p(counts: list[int], expected: list[float]) -> float:
    """p-value of Pearson's statistic; cells expected below 5 are pooled into one."""
    obs, exp, pool_o, pool_e = [], [], 0, 0.0
    for o, e in zip(counts, expected, strict=True):
        if e < 5:
            pool_o, pool_e = pool_o + o, pool_e + e
        else:
            obs.append(o)
            exp.append(e)
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp, strict=True))
    dof = len(obs) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2), torch.tensor(stat / 2)))


def test_first_two_tokens_follow_the_target_distribution(checkpoints, monkeypatch):
    model, path = checkpoints("kimi_linear")  # saved from build_tiny_hf_model(seed=0)
    hf = build_tiny_hf_model("kimi_linear", seed=0)
    prompt = prompt_ids(12, 7, model.config.vocab_size)
    p1 = next_probs(hf, prompt)
    firsts = torch.nonzero(p1).flatten().tolist()
    cond = {t: next_probs(hf, prompt + [t]) for t in firsts}
    draft = int(torch.argmax(cond[int(torch.argmax(p1))]))  # often right, sometimes wrong
    monkeypatch.setattr(hyla.spec.decoder, "propose_ngram", lambda tokens, k, lo, hi: [draft][:k])
    spec = {"method": "ngram", "num_speculative_tokens": 1, "disable_by_batch_size": 64}
    engine = make_engine(model, path, speculative_config=spec, max_num_seqs=64,
                         max_num_batched_tokens=1024)  # fmt: skip
    for i in range(NUM_RUNS):
        params = SamplingParams(temperature=TEMPERATURE, top_k=TOP_K, max_tokens=3, seed=i,
                                ignore_eos=True)  # fmt: skip
        engine.add_request(f"s{i}", prompt, params)
    outs = run_all(engine)
    cells = [(a, b) for a in firsts for b in torch.nonzero(cond[a]).flatten().tolist()]
    index = {c: j for j, c in enumerate(cells)}
    counts = [0] * len(cells)
    for out in outs.values():
        counts[index[tuple(out.outputs[0].token_ids[:2])]] += 1
    expected = [NUM_RUNS * float(p1[a] * cond[a][b]) for a, b in cells]
    stats = engine.get_stats()
    assert stats.spec_decode_num_drafts == NUM_RUNS  # every second token came from a verify
    assert 0 < stats.spec_decode_num_accepted_tokens < NUM_RUNS
    assert chi_square_p(counts, expected) > 1e-3, (counts, expected)
