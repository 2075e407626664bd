"""Speculative decoding (`hyla.spec`): greedy output with drafts on is token-identical to drafts
off (fp32 CPU), for KDA (kimi_linear), GDN (qwen3_next) and DSA (deepseek_v32) models, with
verify steps mixed with chunked prefills, an abort, a prefix-cache hit and preemptions.

Oracle: the same requests through an engine without drafts. Drafts come from an oracle that
knows that run's output and corrupts one draft position by the sequence length (every draft
right, the first, a middle or the last one wrong), so full, partial and zero acceptance and
every rollback point are exercised; one test uses the real n-gram drafter (whose drafts a
random model mostly rejects) and the off-switch.
Every run ends with every block, slot and checkpoint free (I4).
"""

from __future__ import annotations

import pytest

import hyla.spec.decoder
from hyla.cache.manager import num_blocks_for
from hyla.request import SamplingParams
from tests.engine.engine_util import (
    assert_i4,
    assert_same_completion,
    make_engine,
    one_torch_thread,
    prompt_ids,
)

FAMILIES = ["kimi_linear", "qwen3_next", "deepseek_v32"]
SPEC = {"method": "ngram", "num_speculative_tokens": 3}
PARAMS = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=2)


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


class OracleDrafts:
    """Drafts = the reference run's continuation, one position corrupted by the length."""

    def __init__(self, reference: dict[tuple[int, ...], list[int]], vocab: int) -> None:
        self.reference, self.vocab = reference, vocab

    def right(self, tokens: list[int], k: int) -> list[int]:
        prompt = max((p for p in self.reference if tuple(tokens[: len(p)]) == p), key=len)
        done = len(tokens) - len(prompt)
        return list(self.reference[prompt][done : done + k])

    def __call__(self, tokens, k, lo, hi):  # noqa: ARG002 - propose_ngram's signature
        drafts = self.right(tokens, k)
        wrong = len(tokens) % 4 - 1  # -1: all right
        if 0 <= wrong < len(drafts):
            drafts[wrong] = (drafts[wrong] + 1) % self.vocab
        return drafts


def run(engine, arrivals: dict[int, dict], aborts: dict[int, list[str]] | None = None):
    """Add requests (id -> prompt, or (prompt, params)) at step numbers, abort ids at step
    numbers, step until idle."""
    final, step = {}, 0
    while arrivals or engine.has_unfinished_requests():
        for rid, prompt in arrivals.pop(step, {}).items():
            prompt, params = prompt if isinstance(prompt, tuple) else (prompt, PARAMS)
            engine.add_request(rid, prompt, params)
        for rid in (aborts or {}).get(step, []):
            engine.abort_request(rid)
        outs = engine.step()
        if engine.spec is not None:  # verify steps settled: no block past a request's tokens
            outs += engine.flush()
            for req in engine.scheduler.running:
                table = engine.cache.block_tables.get(req.request_id, [])
                assert len(table) <= num_blocks_for(req.num_tokens, engine.cache.block_size)
        final.update({out.request_id: out for out in outs if out.finished})
        step += 1
    assert_i4(engine)
    return final


def scenario(vocab: int) -> tuple[dict[int, dict], dict[int, list[str]]]:
    shared = prompt_ids(30, 1, vocab)
    arrivals = {
        0: {"r0": shared, "r1": prompt_ids(9, 2, vocab)},
        3: {"r2": prompt_ids(25, 3, vocab)},
        14: {"r3": shared[:24] + prompt_ids(4, 4, vocab)},  # a prefix hit on r0's blocks
    }
    return arrivals, {8: ["r1"]}


def spec_run(model, path, monkeypatch, arrivals, aborts=None, **kw):
    """The drafts-off run, then the drafts-on run with oracle drafts; both outputs."""
    want = run(make_engine(model, path, **kw), {s: dict(r) for s, r in arrivals.items()})
    reference = {}
    for reqs in arrivals.values():
        for rid, prompt in reqs.items():
            reference[tuple(prompt)] = want[rid].outputs[0].token_ids
    oracle = OracleDrafts(reference, model.config.vocab_size)
    monkeypatch.setattr(hyla.spec.decoder, "propose_ngram", oracle)
    engine = make_engine(model, path, speculative_config=SPEC, **kw)
    got = run(engine, arrivals, aborts)
    return engine, got, want


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_identical_with_abort_and_prefix_hit(checkpoints, monkeypatch, family):
    model, path = checkpoints(family)
    arrivals, aborts = scenario(model.config.vocab_size)
    kw = dict(block_size=8, max_num_batched_tokens=16, enable_prefix_caching=True,
              state_checkpoint_stride=8)  # fmt: skip
    engine, got, want = spec_run(model, path, monkeypatch, arrivals, aborts, **kw)
    for rid in ("r0", "r2", "r3"):
        assert_same_completion(got[rid], want[rid])
    cut = got["r1"].outputs[0].token_ids
    assert got["r1"].outputs[0].finish_reason == "abort"
    assert cut == want["r1"].outputs[0].token_ids[: len(cut)]
    stats = engine.get_stats()
    assert stats.prefix_cache_hit_tokens > 0 and got["r3"].num_cached_tokens > 0
    assert 0 < stats.spec_decode_num_accepted_tokens < stats.spec_decode_num_draft_tokens


@pytest.mark.parametrize("family", ["kimi_linear", "qwen3_next"])
def test_greedy_identical_under_preemption(checkpoints, monkeypatch, family):
    model, path = checkpoints(family)
    vocab = model.config.vocab_size
    arrivals = {0: {f"r{i}": prompt_ids(20 + i, 110 + i, vocab) for i in range(3)}}
    kw = dict(num_blocks=8, max_model_len=64, block_size=8)
    engine, got, want = spec_run(model, path, monkeypatch, arrivals, **kw)
    assert engine.get_stats().num_preemptions > 0
    for rid in want:
        assert_same_completion(got[rid], want[rid])
    assert engine.get_stats().spec_decode_num_accepted_tokens > 0


def test_ngram_drafts_and_off_switch(checkpoints):
    """The real drafter on repetitive prompts; no step drafts while more than
    `disable_by_batch_size` sequences run, and drafting resumes when fewer do."""
    model, path = checkpoints("kimi_linear")
    vocab = model.config.vocab_size
    prompts = {}
    for k in range(4):  # two long requests: drafting starts when the two short ones end
        base = prompt_ids(6 + k, 20 + k, vocab)
        params = SamplingParams(temperature=0, max_tokens=40 if k < 2 else 8, ignore_eos=True)
        prompts[f"r{k}"] = (base * 3 + base[:2], params)
    want = run(make_engine(model, path), {0: dict(prompts)})
    spec = dict(SPEC, prompt_lookup_min=1, prompt_lookup_max=3, disable_by_batch_size=2)
    engine = make_engine(model, path, speculative_config=spec)
    drafting_batches = []
    plan = engine.spec.plan_states

    def watch(out, requests):
        if out.spec_token_ids:
            drafting_batches.append(engine.scheduler.num_running)
        plan(out, requests)

    engine.spec.plan_states = watch
    got = run(engine, {0: dict(prompts)})
    for rid in prompts:
        assert_same_completion(got[rid], want[rid])
    assert engine.get_stats().spec_decode_num_draft_tokens > 0  # (a random model rejects most)
    assert drafting_batches and max(drafting_batches) <= 2


@pytest.mark.parametrize("wrong", [False, True], ids=["all-right", "all-wrong"])
def test_acceptance_counters_and_metrics(checkpoints, monkeypatch, wrong):
    from hyla.server.metrics import ServerMetrics

    model, path = checkpoints("kimi_linear")
    vocab = model.config.vocab_size
    arrivals = {0: {"a": prompt_ids(11, 5, vocab), "b": prompt_ids(17, 6, vocab)}}
    want = run(make_engine(model, path), {0: dict(arrivals[0])})
    reference = {tuple(p): want[r].outputs[0].token_ids for r, p in arrivals[0].items()}
    oracle = OracleDrafts(reference, vocab)
    shift = 1 if wrong else 0
    drafter = lambda t, k, lo, hi: [(d + shift) % vocab for d in oracle.right(t, k)]  # noqa: E731
    monkeypatch.setattr(hyla.spec.decoder, "propose_ngram", drafter)
    engine = make_engine(model, path, speculative_config=SPEC)
    got = run(engine, arrivals)
    for rid in want:
        assert_same_completion(got[rid], want[rid])
    s = engine.get_stats()
    assert s.spec_decode_num_draft_tokens > 0
    assert s.spec_decode_num_accepted_tokens == (0 if wrong else s.spec_decode_num_draft_tokens)
    assert s.spec_decode_acceptance_rate == (0.0 if wrong else 1.0)
    engine.num_in_flight = lambda: 0  # the collector's AsyncEngine hook
    text = ServerMetrics(engine).render()[0].decode()
    for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        value = float(getattr(s, f"spec_decode_{name}"))
        assert f"hyla_spec_decode_{name}_total {value}" in text
    assert f"hyla_engine_spec_decode_acceptance_rate {s.spec_decode_acceptance_rate}" in text
