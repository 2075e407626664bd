"""C05 conservation under cancellation.

200 requests, most sharing one of a few prefixes, each cancelled at a random point: while
queued, mid-prefill chunk, mid-decode, or by a client that stops reading its stream (the
abort comes between steps, right after an output arrived). Afterwards every block and state
slot is free (I4), and the requests that were not cancelled equal their solo runs (same token
ids, top-5 logprobs within 1e-5). Oracle for the survivors: each run alone in an idle engine.
"""

from __future__ import annotations

import random

import pytest

from hyla.request import RequestStatus, SamplingParams
from tests.engine.engine_util import (
    assert_all_free,
    assert_same_completion,
    load,
    make_engine,
    one_torch_thread,
    prompt_ids,
    save_checkpoint,
    solo,
)

NUM_REQUESTS = 200
MODES = ("keep", "keep", "queued", "prefill", "decode", "stream")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("kimi_linear")
    save_checkpoint("kimi_linear", path)
    return load(path)


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


def make_requests(rng: random.Random):
    prefixes = [prompt_ids(n, seed=1000 + n) for n in (16, 24, 40)]
    reqs = []
    for i in range(NUM_REQUESTS):
        if rng.random() < 0.75:
            ids = rng.choice(prefixes) + prompt_ids(rng.randint(1, 12), seed=i)
        else:
            ids = prompt_ids(rng.randint(1, 50), seed=i)
        params = SamplingParams(
            temperature=0, max_tokens=rng.randint(1, 6), ignore_eos=True, logprobs=5
        )
        reqs.append((f"r{i}", ids, params, rng.choice(MODES), rng.randint(1, 5)))
    return reqs


def should_cancel(engine, rid: str, mode: str, k: int, step: int, outputs) -> bool:
    group = engine.requests.groups.get(rid)
    if group is None or group.is_finished:
        return False
    req = group.sequences[0].request
    if mode == "queued":
        return req.status is RequestStatus.WAITING and step >= k
    if mode == "prefill":
        return 0 < req.num_computed_tokens < req.num_prompt_tokens
    if mode == "decode":
        return req.num_output_tokens >= min(k, req.params.max_tokens - 1) > 0
    if mode == "stream":
        return rid in outputs and len(outputs[rid].outputs[0].token_ids) >= k
    return False


def test_c05_conservation_under_cancellation(model):
    rng = random.Random(5)
    reqs = make_requests(rng)
    engine = make_engine(model, max_num_seqs=12, max_num_batched_tokens=48, block_size=8)
    pending = list(reqs)
    latest, cancelled, final = {}, set(), {}
    step = 0
    while pending or engine.has_unfinished_requests():
        for _ in range(min(len(pending), rng.randint(0, 12))):
            rid, ids, params, _, _ = pending.pop(0)
            engine.add_request(rid, ids, params)
        for rid, _, _, mode, k in reqs:
            if mode != "keep" and should_cancel(engine, rid, mode, k, step, latest):
                engine.abort_request(rid)
                cancelled.add(rid)
        for out in engine.step():
            latest[out.request_id] = out
            if out.finished:
                final[out.request_id] = out
        step += 1
    assert_all_free(engine)
    assert len(final) == NUM_REQUESTS
    modes = {rid: mode for rid, _, _, mode, _ in reqs}
    assert {modes[r] for r in cancelled} == {"queued", "prefill", "decode", "stream"}
    for rid in cancelled:
        assert final[rid].outputs[0].finish_reason == "abort"
    survivors = [(rid, ids, p) for rid, ids, p, _, _ in reqs if rid not in cancelled]
    assert len(survivors) > 50
    ref_engine = make_engine(model, block_size=8)
    for rid, ids, params in survivors:
        assert final[rid].outputs[0].finish_reason == "length"
        assert_same_completion(final[rid], solo(ref_engine, ids, params))
    assert_all_free(ref_engine)
