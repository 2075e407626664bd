"""Adversarial checks of the static-shape decode path (`DecodeGraphs(capture=False)`, the CUDA
graph step run eagerly on the CPU) against plain eager steps: the same model and the same
request script run on two engines, one of which routes its pure decode steps through the
static path; token ids must match exactly and logprobs within 1e-4, and both engines must end
with every block and slot free.

Scenarios: prefix-cache hits (state checkpoints of the hybrid model, blocks of DSA), prompt
logprobs over 1-token prefill chunks (pure-decode-shaped steps with unsampled prompt rows and
fresh sequences at context 0), 1-token prompts on reused state slots, seeded parallel sampling,
aborts that shrink and grow the batch across buckets, a context crossing the 256 bucket under a
small max_model_len, more requests than the largest captured size, and preemption.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from hyla.engine.cuda_graphs import DecodeGraphs, DecodeInputs
from hyla.engine.llm_engine import LLMEngine
from hyla.forward_batch import allocate_caches, build_forward_batch
from hyla.request import RequestOutput, SamplingParams
from tests.engine.engine_util import (
    assert_all_free,
    assert_same_completion,
    make_engine,
    one_torch_thread,
    prompt_ids,
    run_all,
)

ATOL = 1e-4
FAMILIES = ["kimi_linear", "deepseek_v32", "qwen3_next"]
Script = Callable[[LLMEngine], dict[str, RequestOutput]]


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=3, **kw)


class Recorder:
    """Wraps `DecodeGraphs.run` to record each static step's (rows, context lengths)."""

    def __init__(self, graphs: DecodeGraphs) -> None:
        self.graphs, self.steps, self.num_device_tokens = graphs, [], 0
        self._run = graphs.run
        graphs.run = self.run

    def run(self, step, device_tokens=None):
        self.steps.append((step.num_seqs, list(step.positions)))
        if device_tokens is not None:
            self.num_device_tokens += len(device_tokens.dst)
        return self._run(step, device_tokens)


def compare(
    model, script: Script, sizes=(1, 2, 4), **engine_kw
) -> tuple[dict[str, RequestOutput], Recorder, LLMEngine]:
    """Run `script` on a plain and on a static engine; assert the same outputs and no leaks.
    Both run the one overlapped pipeline (a decode step's input ids come from the previous
    step's tokens on the device). Returns the static engine's outputs, its recorder and the
    static engine."""
    results, recorder, engine = [], None, None
    for static in (False, True):
        engine = make_engine(model, **engine_kw)
        if static:
            runner = engine.runner
            runner.graphs = DecodeGraphs(
                model, runner.caches, runner.block_size, sizes, capture=False,
                max_model_len=engine.max_model_len,
            )  # fmt: skip
            recorder = Recorder(runner.graphs)
        with one_torch_thread():
            results.append(script(engine))
        assert_all_free(engine)
    plain, static_out = results
    assert plain.keys() == static_out.keys()
    for rid in plain:
        assert_same_output(plain[rid], static_out[rid])
    assert recorder is not None and recorder.steps, "no step took the static path"
    return static_out, recorder, engine


def assert_same_output(a: RequestOutput, b: RequestOutput) -> None:
    assert a.finished and b.finished
    assert len(a.outputs) == len(b.outputs)
    assert [o.finish_reason for o in a.outputs] == [o.finish_reason for o in b.outputs]
    assert_same_completion(a, b, atol=ATOL)
    for x, y in zip(a.outputs, b.outputs, strict=True):
        assert abs(x.cumulative_logprob - y.cumulative_logprob) <= ATOL * max(1, len(x.token_ids))
    assert (a.prompt_logprobs is None) == (b.prompt_logprobs is None)
    if a.prompt_logprobs is not None:
        assert len(a.prompt_logprobs) == len(b.prompt_logprobs)
        for lx, ly in zip(a.prompt_logprobs, b.prompt_logprobs, strict=True):
            assert (lx is None) == (ly is None)
            if lx is not None:
                assert lx.keys() == ly.keys()
                for t in lx:
                    assert abs(lx[t] - ly[t]) <= ATOL, (t, lx[t], ly[t])


def add_all(engine: LLMEngine, requests: dict[str, tuple[list[int], SamplingParams]]) -> None:
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params)


# -- prefix caching -------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_prefix_hit_after_finished_request(checkpoints, family):
    """A second request shares a long prefix with a finished first one: it is admitted at a
    cached prefix (restoring a state checkpoint on the hybrid model) and decodes statically; a
    third one's prompt is the cached prefix plus one token (a 1-token step right after the
    restore), a fourth repeats the first prompt exactly, a fifth continues the first's
    completion (a chat turn) from the checkpoint a static decode step saved at 80 tokens."""
    base = prompt_ids(70, seed=1)

    def script(engine):
        final = {}
        for rid, prompt in (
            ("a", base),
            ("b", base[:64] + prompt_ids(9, seed=2)),
            ("c", base[:48] + [7]),
            ("d", list(base)),
        ):
            engine.add_request(rid, prompt, greedy(14))
            final.update(run_all(engine))
        engine.add_request("e", base + final["a"].outputs[0].token_ids + [5, 6, 7], greedy(5))
        final.update(run_all(engine))
        return final

    out, rec, _ = compare(
        checkpoints(family)[0], script, enable_prefix_caching=True, state_checkpoint_stride=16,
        max_num_batched_tokens=48,  # a's prompt: chunks cut at 48 and 64, checkpoints there
    )  # fmt: skip
    assert [out[r].num_cached_tokens for r in "abcde"] == [0, 64, 48, 64, 80]
    assert (1, [48]) in rec.steps and (1, [79]) in rec.steps  # c's 1-token step; a's save
    assert rec.num_device_tokens > 0  # a's save step decoded a token still on the device


# -- prompt logprobs and 1-token prefill chunks ----------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_prompt_logprobs_in_one_token_chunks(checkpoints, family):
    """Under a 4-token budget three decoding requests leave one token per step to a prompt that
    wants prompt logprobs: its chunks are single tokens (the first at context 0), so the steps
    are pure-decode-shaped with unsampled prompt rows. The state slots are reused (a first wave
    of requests held them), so a fresh sequence reading its slot would see stale state."""

    def script(engine):
        final = {}
        add_all(engine, {f"w{i}": (prompt_ids(9, seed=20 + i), greedy(5)) for i in range(4)})
        final.update(run_all(engine))
        add_all(engine, {f"d{i}": (prompt_ids(5 + i, seed=30 + i), greedy(20)) for i in range(3)})
        started: set[str] = set()
        while len(started) < 3:  # until all three decode
            started.update(o.request_id for o in engine.step() if o.outputs[0].token_ids)
        engine.add_request("p", prompt_ids(7, seed=40), greedy(4, prompt_logprobs=2))
        final.update(run_all(engine))
        return final

    out, rec, _ = compare(
        checkpoints(family)[0], script, max_num_batched_tokens=4, max_num_seqs=4,
        enable_prefix_caching=False,
    )  # fmt: skip
    assert len(out["p"].prompt_logprobs) == 7
    # the prompt's first token (context 0) runs eagerly; its next 1-token chunks (context < 5,
    # below every decode's context) run static, next to the three decodes
    assert all(0 not in ctx for _, ctx in rec.steps)
    assert any(n == 4 and min(ctx) < 5 for n, ctx in rec.steps)


@pytest.mark.parametrize("family", FAMILIES)
def test_one_token_prompt_on_a_reused_slot(checkpoints, family):
    """A 1-token prompt is a pure-decode-shaped step at context 0 whose state slot was used
    before: it must start from the zero state (it runs eagerly), its decodes run static."""

    def script(engine):
        final = {}
        add_all(engine, {f"w{i}": (prompt_ids(12, seed=50 + i), greedy(4)) for i in range(2)})
        final.update(run_all(engine))
        add_all(engine, {"one": ([9], greedy(5)), "two": ([17], greedy(5))})
        final.update(run_all(engine))
        return final

    _, rec, _ = compare(checkpoints(family)[0], script, max_num_seqs=2, enable_prefix_caching=False)
    assert all(0 not in ctx for _, ctx in rec.steps) and (2, [1, 1]) in rec.steps


# -- sampling ------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_seeded_parallel_sampling(checkpoints, family):
    """n / best_of sequences with their own seeded generators, plus an unseeded request on the
    engine's generator: the same logits give the same draws."""
    params = [
        SamplingParams(temperature=0.9, top_p=0.95, max_tokens=7, ignore_eos=True, logprobs=2,
                       n=2, best_of=3, seed=1234),
        SamplingParams(temperature=1.0, top_k=20, max_tokens=7, ignore_eos=True, n=2, seed=7),
        SamplingParams(temperature=0.7, max_tokens=7, ignore_eos=True, logprobs=1),
    ]  # fmt: skip

    def script(engine):
        for i, p in enumerate(params):
            engine.add_request(f"s{i}", prompt_ids(11 + 4 * i, seed=60 + i), p)
        return run_all(engine)

    out, rec, _ = compare(checkpoints(family)[0], script, sizes=(1, 2, 4, 8))
    assert len(out["s0"].outputs) == 2 and len(out["s1"].outputs) == 2
    assert {n for n, _ in rec.steps} == {6}  # 3 + 2 + 1 sequences, padded to 8


# -- batch shrinking and growing -----------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_abort_mid_decode_then_add(checkpoints, family):
    """Aborts shrink the batch across buckets (5 -> 3 -> 1) and new requests grow it again."""

    def script(engine):
        final = {}
        add_all(engine, {f"r{i}": (prompt_ids(6 + i, seed=70 + i), greedy(14)) for i in range(5)})
        for _ in range(3):
            engine.step()
        engine.abort_request(["r1", "r3"])
        for _ in range(2):
            for o in engine.step():
                if o.finished:
                    final[o.request_id] = o
        engine.abort_request(["r0", "r4"])
        for o in engine.step():
            if o.finished:
                final[o.request_id] = o
        add_all(engine, {f"n{i}": (prompt_ids(8 + i, seed=80 + i), greedy(5)) for i in range(3)})
        final.update(run_all(engine))
        return final

    out, rec, _ = compare(checkpoints(family)[0], script, sizes=(1, 2, 4, 8))
    assert {out[r].outputs[0].finish_reason for r in ("r0", "r1", "r3", "r4")} == {"abort"}
    assert {n for n, _ in rec.steps} >= {5, 3, 1, 4}


# -- context buckets -----------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_context_crosses_the_256_bucket_under_max_model_len(checkpoints, family):
    """A 250-token prompt decoding 12 tokens crosses the 256 bucket into the capped bucket
    (max_model_len 300); a short request shares the batch, and a third one, added later,
    ends exactly at max_model_len (its last step computes position 298, in the last block of
    the 300 bucket; the 300th token is sampled, never fed back)."""

    def script(engine):
        add_all(engine, {
            "long": (prompt_ids(250, seed=90), greedy(12)),
            "short": (prompt_ids(20, seed=91), greedy(12)),
        })  # fmt: skip
        for _ in range(3):
            engine.step()
        engine.add_request("edge", prompt_ids(289, seed=92), greedy(11))
        return run_all(engine)

    out, rec, engine = compare(
        checkpoints(family)[0], script, max_model_len=300, max_num_batched_tokens=512,
        enable_prefix_caching=False,
    )  # fmt: skip
    assert {bucket for _, bucket in engine.runner.graphs.steps} == {256, 300}
    assert max(max(ctx) for _, ctx in rec.steps) == 298
    assert out["edge"].outputs[0].finish_reason == "length"


@pytest.mark.parametrize("family", FAMILIES)
def test_more_requests_than_the_largest_size(checkpoints, family):
    """Sizes (1, 2) with 5 requests of different lengths: the 5-, 4- and 3-row steps run
    eagerly, then the static path takes over as requests finish (2 rows, then 1)."""

    def script(engine):
        add_all(engine, {f"r{i}": (prompt_ids(5 + i, seed=100 + i), greedy(3 + 2 * i))
                         for i in range(5)})  # fmt: skip
        return run_all(engine)

    _, rec, _ = compare(checkpoints(family)[0], script, sizes=(1, 2))
    assert {n for n, _ in rec.steps} == {1, 2}


@pytest.mark.parametrize("family", FAMILIES)
def test_preemption_and_recompute(checkpoints, family):
    """A tiny block pool preempts requests mid-decode; they recompute and decode again."""

    def script(engine):
        add_all(engine, {f"r{i}": (prompt_ids(20 + i, seed=110 + i), greedy(30)) for i in range(3)})
        return run_all(engine)

    _, _, engine = compare(
        checkpoints(family)[0], script, num_blocks=8, max_model_len=64, enable_prefix_caching=False
    )
    assert engine.get_stats().num_preemptions > 0


# -- the static step itself ----------------------------------------------------------------


def test_unpadded_single_row_updates_its_own_slot(checkpoints):
    """A batch of one in the size-1 bucket (no padding row) writes the sequence's state slot,
    not row 0: the static step's host slots are placeholders (`[0]`), so the CPU in-place
    decode on a contiguous slot range must not trust them."""
    model = checkpoints("kimi_linear")[0]
    block = 4
    caches = allocate_caches(model.config, 8, block, 5)
    for layer in caches:
        for t in layer.values():
            t.normal_()
    before = [{k: t.clone() for k, t in layer.items()} for layer in caches]
    table, n = [3, 6], 5
    step = DecodeInputs([11], [n], [table[n // block] * block + n % block], [3], [n + 1], [table])
    graphs = DecodeGraphs(model, caches, block, (1,), capture=False)
    with torch.inference_mode():
        hidden = graphs.run(step)
    for layer, old in zip(caches, before, strict=True):
        for name, t in layer.items():
            if t.shape[0] == 5:  # state rows: only slot 3 changed
                changed = (t != old[name]).flatten(1).any(-1)
                assert changed.nonzero().flatten().tolist() == [3], name
            t.copy_(old[name])
    batch = build_forward_batch([1], [n], [table], [3], block, caches)
    with torch.inference_mode():
        plain = model(torch.tensor([11]), batch.positions, batch)
    torch.testing.assert_close(hidden, plain, rtol=1e-4, atol=1e-5)


def test_fresh_sequences_do_not_run_static(checkpoints):
    """A 1-token step at context 0 must start from the zero state, which a static step (whose
    host context lengths are placeholders) cannot tell: `can_run` sends it to the eager step."""
    model = checkpoints("kimi_linear")[0]
    caches = allocate_caches(model.config, 8, 4, 5)
    graphs = DecodeGraphs(model, caches, 4, (1, 2), capture=False)
    assert graphs.can_run([1, 1], [3, 7]) and not graphs.can_run([1, 1], [3, 0])
    assert not graphs.can_run([1, 1, 1], [3, 4, 5]) and not graphs.can_run([2], [3])
    with pytest.raises(ValueError):
        graphs.run(DecodeInputs([5], [0], [4], [1], [1], [[1]]))
