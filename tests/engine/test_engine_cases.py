"""Reference cases at engine level: C01 split invariance, C04 batch transparency, and
preemption by recompute. "Equal" = identical greedy token ids and top-5 logprobs of every
generated token within 1e-5 (fp32 CPU). Oracle: the same request run alone, unchunked,
uninterrupted. Caches are NaN-poisoned first, so a read of an unwritten entry or a stale
state slot shows up as a non-finite logprob."""

from __future__ import annotations

import math

import pytest

from hyla.request import SamplingParams
from tests.engine.engine_util import (
    GREEDY,
    assert_all_free,
    assert_same_completion,
    load,
    make_engine,
    one_torch_thread,
    prompt_ids,
    run_all,
    save_checkpoint,
    solo,
)

FAMILIES = ("kimi_linear", "qwen3_next", "deepseek_v32")  # KDA+MLA, GDN+GQA, DSA


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


@pytest.fixture(scope="module", params=FAMILIES)
def model(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    save_checkpoint(request.param, path)
    return load(path)


def poisoned(engine):
    for layer in engine.runner.caches:
        for t in layer.values():
            t.fill_(float("nan"))
    return engine


def assert_finite(out) -> None:
    for c in out.outputs:
        assert math.isfinite(c.cumulative_logprob)
        for lp in c.logprobs or []:
            assert all(math.isfinite(v) for v in lp.values())


@pytest.mark.parametrize(
    "prompt_len,budgets",
    [(1000, (16, 63, 64, 65, 999, 1001)), (130, (1, 2, 3, 64, 129, 131))],
    ids=["1000", "130"],
)
def test_c01_chunked_prefill_split_invariance(model, prompt_len, budgets):
    ids = prompt_ids(prompt_len, seed=prompt_len)
    whole = solo(make_engine(model, max_model_len=1024, max_num_batched_tokens=2048), ids)
    assert_finite(whole)
    for budget in budgets:
        engine = poisoned(make_engine(model, max_model_len=1024, max_num_batched_tokens=budget))
        out = solo(engine, ids)
        assert_finite(out)
        assert_same_completion(out, whole)
        assert_all_free(engine)


@pytest.mark.parametrize("num_others", [1, 7, 31])
def test_c04_batch_transparency_with_mixed_steps(model, num_others):
    target = prompt_ids(40, seed=99)
    alone = solo(poisoned(make_engine(model)), target)
    engine = poisoned(make_engine(model, max_num_batched_tokens=64, max_num_seqs=40))
    lens = [3 + (17 * i) % 60 for i in range(num_others)]
    lens[0] = 200  # one long prompt packed with short ones
    others = [(f"o{i}", prompt_ids(n, seed=i)) for i, n in enumerate(lens)]
    early, late = others[: (num_others + 1) // 2], others[(num_others + 1) // 2 :]
    for rid, ids in early:
        params = SamplingParams(temperature=0, max_tokens=3 + len(ids) % 9, logprobs=5)
        engine.add_request(rid, ids, params)
    finals = {}
    for _ in range(2):  # early neighbours are mid-prefill or decoding when the target arrives
        finals.update({o.request_id: o for o in engine.step() if o.finished})
    engine.add_request("target", target, GREEDY)
    for rid, ids in late:
        engine.add_request(rid, ids, SamplingParams(temperature=0, max_tokens=6, logprobs=5))
    finals.update(run_all(engine))
    assert_same_completion(finals["target"], alone)
    for out in finals.values():
        assert_finite(out)
    assert len(finals) == num_others + 1
    assert_all_free(engine)


def test_preempted_requests_finish_identical_to_uninterrupted(model):
    prompts = {f"r{i}": prompt_ids(12 + 5 * i, seed=i) for i in range(6)}
    greedy = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True, logprobs=5)
    seeded = SamplingParams(temperature=1.0, seed=7, max_tokens=14, ignore_eos=True, logprobs=5)

    def run(engine):
        for rid, ids in prompts.items():
            engine.add_request(rid, ids, greedy if int(rid[1:]) % 2 else seeded)
        return run_all(engine)

    roomy = run(make_engine(model, max_model_len=64))
    # 20 blocks of 4 tokens: each request needs up to 10; six at once cannot fit
    tight_engine = poisoned(
        make_engine(model, max_model_len=64, block_size=4, num_blocks=20, max_num_batched_tokens=32)
    )
    tight = run(tight_engine)
    assert tight_engine.scheduler.num_preemptions > 0
    for rid in prompts:
        assert_same_completion(tight[rid], roomy[rid])
        assert_finite(tight[rid])
    assert_all_free(tight_engine)
