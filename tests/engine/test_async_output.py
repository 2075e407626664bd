"""`async_output` (a step's tokens are detokenized and turned into outputs during the next step,
while that step runs on the GPU) against the synchronous engine: the same model and request
script on two engines; final outputs must be identical (token ids, text, finish and stop
reasons; logprobs within `I3_LOGPROB_ATOL`: a request finished by a stop string is scheduled
once more in the async modes, so its neighbours' batches differ, and a row on the CPU may round
by its neighbours: tests/engine/test_batch_transparency_threads.py says why) and both
engines must end with every block and slot free.

Scenarios: greedy + seeded sampling + parallel sampling with logprobs and prompt logprobs, stop
strings met while the request is already scheduled for the next step (its extra token is
dropped), stop token ids and max_tokens, aborts of requests whose last token is still being
processed, prefix-cache hits with state checkpoints, and preemption. Also checked: outputs come
one step later, and every streamed output is a prefix of the final one.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from hyla.engine.llm_engine import LLMEngine
from hyla.request import RequestOutput, SamplingParams
from tests.engine.engine_util import (
    I3_LOGPROB_ATOL,
    assert_all_free,
    make_engine,
    one_torch_thread,
    prompt_ids,
)

FAMILIES = ["kimi_linear", "deepseek_v32", "qwen3_next"]
Script = Callable[[LLMEngine], tuple[dict[str, RequestOutput], list[RequestOutput]]]


def drive(engine: LLMEngine, requests: dict, abort_at: dict[int, list[str]] | None = None):
    """Add `requests` (id -> (prompt, params)), step until idle, aborting ids at given step
    numbers. Returns (final output per id, every output in order)."""
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params)
    final: dict[str, RequestOutput] = {}
    stream: list[RequestOutput] = []
    step = 0
    while engine.has_unfinished_requests():
        for rid in (abort_at or {}).get(step, []):
            engine.abort_request(rid)
        for out in engine.step():
            stream.append(out)
            if out.finished:
                final[out.request_id] = out
        step += 1
    return final, stream


# (async_output, async_scheduling): the synchronous engine first, the one compared against
MODES = ((False, False), (True, False), (True, True))


def compare(model, path, script: Script, **engine_kw) -> list[LLMEngine]:
    """Run `script` synchronously, with async_output, and with async_output + async
    scheduling; assert equal finals and no leaks. Returns the three engines."""
    finals, streams, engines = [], [], []
    for async_output, async_scheduling in MODES:
        engine = make_engine(
            model, path, async_output=async_output, async_scheduling=async_scheduling, **engine_kw
        )
        assert engine.async_output is async_output
        assert engine.async_scheduling is async_scheduling
        with one_torch_thread():
            final, stream = script(engine)
        assert_all_free(engine)
        assert not engine._deferred and engine._inflight is None
        assert not any(r.num_placeholders for r in engine.scheduler.requests.values())
        finals.append(final)
        streams.append(stream)
        engines.append(engine)
    sync = finals[0]
    for other in finals[1:]:
        assert sync.keys() == other.keys()
        for rid in sync:
            assert_identical(sync[rid], other[rid])
    for stream, final in zip(streams, finals, strict=True):
        assert_stream_prefixes(stream, final)
    return engines


def assert_identical(a: RequestOutput, b: RequestOutput) -> None:
    assert a.finished and b.finished
    assert_close_logprobs(a.prompt_logprobs, b.prompt_logprobs)
    assert len(a.outputs) == len(b.outputs)
    for x, y in zip(a.outputs, b.outputs, strict=True):
        assert x.token_ids == y.token_ids
        assert x.text == y.text
        assert (x.finish_reason, x.stop_reason) == (y.finish_reason, y.stop_reason)
        assert_close_logprobs(x.logprobs, y.logprobs)
        tol = I3_LOGPROB_ATOL * max(1, len(x.token_ids))
        assert abs(x.cumulative_logprob - y.cumulative_logprob) <= tol


def assert_close_logprobs(a: list | None, b: list | None) -> None:
    """Same positions and token ids; each logprob within `I3_LOGPROB_ATOL`."""
    assert (a is None) == (b is None)
    for x, y in zip(a or [], b or [], strict=True):
        assert (x is None) == (y is None)
        if x is not None:
            assert x.keys() == y.keys()
            assert all(abs(x[t] - y[t]) <= I3_LOGPROB_ATOL for t in x), (x, y)


def assert_stream_prefixes(stream: list[RequestOutput], final: dict[str, RequestOutput]) -> None:
    """Every streamed output's tokens and text are prefixes of its request's final output."""
    for out in stream:
        if out.request_id not in final:
            continue
        want = final[out.request_id].outputs
        for o in out.outputs:
            w = want[o.index] if o.index < len(want) else None
            if w is None:
                continue
            assert w.token_ids[: len(o.token_ids)] == o.token_ids
            assert w.text.startswith(o.text)


def sampling_mix(vocab: int) -> dict:
    greedy = SamplingParams(temperature=0, max_tokens=9, ignore_eos=True, logprobs=2)
    return {
        "greedy": (prompt_ids(7, 1, vocab), greedy),
        "seeded": (prompt_ids(5, 2, vocab), SamplingParams(temperature=0.9, top_p=0.9, seed=3,
                                                           max_tokens=8, ignore_eos=True)),
        "n2": (prompt_ids(6, 3, vocab), SamplingParams(temperature=0.8, n=2, best_of=3, seed=4,
                                                       max_tokens=6, ignore_eos=True)),
        "plp": (prompt_ids(9, 4, vocab), SamplingParams(temperature=0, max_tokens=4,
                                                        prompt_logprobs=2, ignore_eos=True)),
        "short": (prompt_ids(3, 5, vocab), SamplingParams(temperature=0, max_tokens=1)),
    }  # fmt: skip


@pytest.mark.parametrize("family", FAMILIES)
def test_sampling_mix_matches_sync(checkpoints, family):
    model, path = checkpoints(family)
    vocab = model.config.vocab_size
    compare(model, path, lambda e: drive(e, sampling_mix(vocab)), max_num_batched_tokens=8)


def stop_requests(engine: LLMEngine) -> dict:
    """Requests whose stop string / stop token is met mid-generation, beside a long one."""
    vocab = engine.model_config.vocab_size
    prompt = prompt_ids(6, 11, vocab)
    base = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    probe = make_engine(engine.model, None)
    probe.add_request("probe", prompt, base)
    tokens = []
    while probe.has_unfinished_requests():
        for out in probe.step():
            tokens = out.outputs[0].token_ids
    text = engine.tokenizer.decode(tokens[3:5])
    stop = text.strip()[:2] or text[:1]
    kw = dict(temperature=0, max_tokens=12, ignore_eos=True)
    return {
        "long": (prompt_ids(8, 12, vocab), SamplingParams(**kw)),
        "stop": (prompt, SamplingParams(stop=[stop], **kw)),
        "stop_incl": (prompt, SamplingParams(stop=[stop], include_stop_str_in_output=True, **kw)),
        "stop_token": (prompt, SamplingParams(stop_token_ids=[tokens[4]], **kw)),
    }


@pytest.mark.parametrize("family", ["kimi_linear", "deepseek_v32"])
def test_stop_strings_and_tokens_match_sync(checkpoints, family):
    model, path = checkpoints(family)

    def script(engine):
        requests = stop_requests(engine)
        final, stream = drive(engine, requests)
        assert final["stop"].outputs[0].finish_reason == "stop"
        assert len(final["stop"].outputs[0].token_ids) < 12
        return final, stream

    compare(model, path, script)


@pytest.mark.parametrize("family", FAMILIES)
def test_aborts_with_pending_tokens_match_sync(checkpoints, family):
    model, path = checkpoints(family)
    vocab = model.config.vocab_size
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    requests = {f"r{i}": (prompt_ids(4 + i, 20 + i, vocab), params) for i in range(5)}
    aborts = {2: ["r1"], 4: ["r3", "r0"], 6: ["r4"]}
    compare(model, path, lambda e: drive(e, requests, aborts))


@pytest.mark.parametrize("family", ["kimi_linear", "deepseek_v32"])
def test_prefix_hits_match_sync(checkpoints, family):
    model, path = checkpoints(family)
    vocab = model.config.vocab_size
    shared = prompt_ids(40, 30, vocab)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)

    def script(engine):
        first, s1 = drive(engine, {"a": (shared + [5, 6], params)})
        second, s2 = drive(engine, {f"b{i}": (shared + prompt_ids(3, 40 + i, vocab), params)
                                    for i in range(4)})  # fmt: skip
        assert any(o.num_cached_tokens > 0 for o in second.values())
        return {**first, **second}, s1 + s2

    compare(model, path, script, enable_prefix_caching=True, state_checkpoint_stride=16)


@pytest.mark.parametrize("family", ["kimi_linear", "qwen3_next"])
def test_preemption_matches_sync(checkpoints, family):
    model, path = checkpoints(family)
    vocab = model.config.vocab_size
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    requests = {f"r{i}": (prompt_ids(20 + i, 110 + i, vocab), params) for i in range(3)}
    engines = compare(model, path, lambda e: drive(e, requests), num_blocks=8, max_model_len=64,
                      enable_prefix_caching=False)  # fmt: skip
    assert all(e.get_stats().num_preemptions > 0 for e in engines)
    assert engines[2].num_inflight_steps > 0


def test_outputs_come_one_step_later(checkpoints):
    model, path = checkpoints("kimi_linear")
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    prompt = prompt_ids(5, 50, model.config.vocab_size)
    counts = []
    for async_output, async_scheduling in MODES:
        engine = make_engine(
            model, path, async_output=async_output, async_scheduling=async_scheduling
        )
        engine.add_request("x", prompt, params)
        per_step = []
        while engine.has_unfinished_requests():
            per_step.append([len(o.outputs[0].token_ids) for o in engine.step()])
        counts.append(per_step)
        assert_all_free(engine)
    assert counts[0] == [[1], [2], [3]]
    assert counts[1] == counts[2] == [[], [1], [2], [3]]
