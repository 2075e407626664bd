"""The one overlapped step pipeline (launch step N+1, then process step N) against independent
oracles: each request run alone in an idle engine (I3 batch transparency: identical token ids,
text, finish and stop reasons; logprobs within 1e-5, not bitwise: a batch of another height
can take another blocking of the fp32 CPU matmul, which reorders its sums; issue 16 item 0 saw
such a 5e-7 difference on an AMD machine), the greedy tokens of a solo probe for
the stop scenarios, and `transformers` greedy generation with a repetition penalty (penalties
counting a token still on the device). Every run ends with every block and slot free.

Scenarios: greedy, seeded and parallel sampling (n, best_of) with logprobs and prompt
logprobs under a small token budget; stop strings, stop token ids (on the last allowed token:
"stop", not "length") and min_tokens; aborts of requests whose last token is in flight;
prefix-cache hits with state checkpoints; preemption; outputs one step later; no value other
than a vocabulary id ever in a token list.
"""

from __future__ import annotations

import pytest
import torch

from hyla.engine.llm_engine import LLMEngine
from hyla.request import RequestOutput, SamplingParams
from tests.engine.engine_util import (
    assert_all_free,
    assert_same_completion,
    make_engine,
    one_torch_thread,
    prompt_ids,
    run_all,
)

FAMILIES = ["kimi_linear", "deepseek_v32", "qwen3_next"]


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


def drive(engine: LLMEngine, requests: dict, abort_at: dict[int, list[str]] | None = None):
    """Add `requests` (id -> (prompt, params)), step until idle, aborting ids at given step
    numbers; checks that token lists only ever hold vocabulary ids. Returns (final output per
    id, every output in order)."""
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params)
    final: dict[str, RequestOutput] = {}
    stream: list[RequestOutput] = []
    step = 0
    vocab = engine.model_config.vocab_size
    while engine.has_unfinished_requests():
        for rid in (abort_at or {}).get(step, []):
            engine.abort_request(rid)
        for out in engine.step():
            stream.append(out)
            if out.finished:
                final[out.request_id] = out
        for req in engine.scheduler.requests.values():
            assert all(0 <= t < vocab for t in req.all_token_ids)
            assert req.num_placeholders <= 1
        step += 1
    assert_all_free(engine)
    return final, stream


def solo_runs(model, path, requests: dict, **engine_kw) -> dict[str, RequestOutput]:
    """The oracle: each request alone in a fresh idle engine."""
    out = {}
    for rid, (prompt, params) in requests.items():
        engine = make_engine(model, path, **engine_kw)
        engine.add_request(rid, prompt, params)
        out[rid] = run_all(engine)[rid]
        assert_all_free(engine)
    return out


def assert_equal_outputs(a: RequestOutput, b: RequestOutput) -> None:
    assert a.finished and b.finished
    assert len(a.outputs) == len(b.outputs)
    for x, y in zip(a.outputs, b.outputs, strict=True):
        assert x.text == y.text
        assert (x.finish_reason, x.stop_reason) == (y.finish_reason, y.stop_reason)
        assert abs(x.cumulative_logprob - y.cumulative_logprob) <= 1e-5 * max(1, len(x.token_ids))
    assert_same_completion(a, b, atol=1e-5)
    assert (a.prompt_logprobs is None) == (b.prompt_logprobs is None)
    if a.prompt_logprobs is not None:
        for lx, ly in zip(a.prompt_logprobs, b.prompt_logprobs, strict=True):
            assert (lx is None) == (ly is None)
            if lx is not None:
                assert lx.keys() == ly.keys()
                assert all(abs(lx[t] - ly[t]) <= 1e-5 for t in lx)


def assert_stream_prefixes(stream: list[RequestOutput], final: dict[str, RequestOutput]) -> None:
    for out in stream:
        want = final[out.request_id].outputs
        for o in out.outputs:
            if o.index < len(want):
                assert want[o.index].token_ids[: len(o.token_ids)] == o.token_ids
                assert want[o.index].text.startswith(o.text)


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
        "pen": (prompt_ids(8, 6, vocab), SamplingParams(temperature=0.7, seed=5, top_k=20,
                                                        repetition_penalty=1.4,
                                                        frequency_penalty=0.5, min_p=0.05,
                                                        max_tokens=7, ignore_eos=True)),
        "short": (prompt_ids(3, 5, vocab), SamplingParams(temperature=0, max_tokens=1)),
    }  # fmt: skip


@pytest.mark.parametrize("family", FAMILIES)
def test_sampling_mix_equals_solo_runs(checkpoints, family):
    model, path = checkpoints(family)
    requests = sampling_mix(model.config.vocab_size)
    engine = make_engine(model, path, max_num_batched_tokens=8)
    final, stream = drive(engine, requests)
    want = solo_runs(model, path, requests, max_num_batched_tokens=8)
    for rid in requests:
        assert_equal_outputs(final[rid], want[rid])
    assert_stream_prefixes(stream, final)
    assert engine.num_device_token_steps > 0  # decode input ids came from the device


def _greedy_probe(model, path, prompt: list[int], n: int) -> list[int]:
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    return solo_runs(model, path, {"p": (prompt, params)})["p"].outputs[0].token_ids


@pytest.mark.parametrize("family", FAMILIES)
def test_stop_strings_stop_ids_and_min_tokens(checkpoints, family):
    model, path = checkpoints(family)
    vocab = model.config.vocab_size
    prompt = prompt_ids(12, 41, vocab)
    tokens = _greedy_probe(model, path, prompt, 12)
    engine = make_engine(model, path)
    text = engine.tokenizer.decode(tokens[3:5])
    stop = text.strip()[:2] or text[:1]
    last, mid = tokens[7], tokens[3]
    kw = dict(temperature=0, ignore_eos=True)
    requests = {
        "long": (prompt_ids(8, 12, vocab), SamplingParams(max_tokens=12, **kw)),
        "stop": (prompt, SamplingParams(stop=[stop], max_tokens=12, **kw)),
        "stop_incl": (prompt, SamplingParams(stop=[stop], include_stop_str_in_output=True,
                                             max_tokens=12, **kw)),
        "last": (prompt, SamplingParams(max_tokens=8, stop_token_ids=[last], **kw)),
        "mid": (prompt, SamplingParams(max_tokens=8, stop_token_ids=[mid], **kw)),
        "min": (prompt, SamplingParams(max_tokens=8, stop_token_ids=[mid], min_tokens=6, **kw)),
    }  # fmt: skip
    final, _ = drive(engine, requests)
    want = solo_runs(model, path, requests)
    for rid in requests:
        assert_equal_outputs(final[rid], want[rid])
    out = {rid: o.outputs[0] for rid, o in final.items()}
    full = engine.tokenizer.decode(tokens)
    assert out["stop"].finish_reason == "stop" and out["stop"].stop_reason == stop
    assert stop not in out["stop"].text
    assert full.replace(" ", "").startswith(out["stop"].text.replace(" ", ""))
    assert out["stop_incl"].text.endswith(stop)
    assert len(out["long"].token_ids) == 12
    if last not in tokens[:7]:  # the stop id first comes as the 8th and last allowed token
        assert (out["last"].finish_reason, out["last"].stop_reason) == ("stop", last)
        assert out["last"].token_ids == tokens[:8]
    k = tokens.index(mid)
    assert out["mid"].token_ids == tokens[: k + 1] and out["mid"].stop_reason == mid
    assert len(out["min"].token_ids) >= 6 and mid not in out["min"].token_ids[:5]


@pytest.mark.parametrize("family", FAMILIES)
def test_aborts_with_tokens_in_flight(checkpoints, family):
    model, path = checkpoints(family)
    vocab = model.config.vocab_size
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=1)
    requests = {f"r{i}": (prompt_ids(4 + i, 20 + i, vocab), params) for i in range(5)}
    aborts = {2: ["r1"], 4: ["r3", "r0"], 6: ["r4"]}
    final, _ = drive(make_engine(model, path), requests, aborts)
    want = solo_runs(model, path, {"r2": requests["r2"]})
    assert_equal_outputs(final["r2"], want["r2"])
    solo = _greedy_probe(model, path, requests["r0"][0], 10)
    for rid in ("r0", "r1", "r3", "r4"):
        o = final[rid].outputs[0]
        assert o.finish_reason == "abort" and len(o.token_ids) < 10
        assert len(o.logprobs) == len(o.token_ids)  # a logprob for every token reported
    assert final["r0"].outputs[0].token_ids == solo[: len(final["r0"].outputs[0].token_ids)]


@pytest.mark.parametrize("family", ["kimi_linear", "deepseek_v32"])
def test_prefix_hits_equal_cold_runs(checkpoints, family):
    model, path = checkpoints(family)
    vocab = model.config.vocab_size
    shared = prompt_ids(40, 30, vocab)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
    kw = dict(enable_prefix_caching=True, state_checkpoint_stride=16)
    engine = make_engine(model, path, **kw)
    drive(engine, {"a": (shared + [5, 6], params)})
    second = {f"b{i}": (shared + prompt_ids(3, 40 + i, vocab), params) for i in range(4)}
    final, _ = drive(engine, second)
    assert all(o.num_cached_tokens > 0 for o in final.values())
    want = solo_runs(model, path, second, enable_prefix_caching=False)
    for rid in second:
        assert_equal_outputs(final[rid], want[rid])


@pytest.mark.parametrize("family", ["kimi_linear", "qwen3_next"])
def test_preemption_equals_solo_runs(checkpoints, family):
    model, path = checkpoints(family)
    vocab = model.config.vocab_size
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    requests = {f"r{i}": (prompt_ids(20 + i, 110 + i, vocab), params) for i in range(3)}
    kw = dict(num_blocks=8, max_model_len=64, enable_prefix_caching=False)
    engine = make_engine(model, path, **kw)
    final, _ = drive(engine, requests)
    assert engine.get_stats().num_preemptions > 0
    want = solo_runs(model, path, requests, **kw)
    for rid in requests:
        assert_equal_outputs(final[rid], want[rid])


def test_outputs_come_one_step_later(kimi):
    model, path = kimi
    engine = make_engine(model, path)
    engine.add_request("x", prompt_ids(5, 50), SamplingParams(temperature=0, max_tokens=3))
    per_step = []
    while engine.has_unfinished_requests():
        per_step.append([len(o.outputs[0].token_ids) for o in engine.step()])
    assert per_step == [[], [1], [2], [3]]
    assert_all_free(engine)


def test_repetition_penalty_with_tokens_in_flight_matches_transformers(tmp_path):
    """Greedy with a repetition penalty: each step's penalty must count the token the previous
    step sampled, still on the device when this step samples. Oracle: transformers
    `generate(repetition_penalty=...)` (CTRL penalty over prompt + output)."""
    from hyla.models.loader import load_model
    from tests.engine.engine_util import save_checkpoint

    hf = save_checkpoint("kimi_linear", tmp_path)
    hf.generation_config.eos_token_id = None
    engine = make_engine(load_model(str(tmp_path), dtype="float32"), tmp_path)
    ids = prompt_ids(9, 77)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, repetition_penalty=1.8)
    engine.add_request("x", ids, params)
    got = run_all(engine)["x"].outputs[0].token_ids
    with torch.no_grad():
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=10, do_sample=False,
                          repetition_penalty=1.8, pad_token_id=0)  # fmt: skip
    assert got == ref[0, len(ids) :].tolist()
    assert engine.num_device_token_steps > 0


def _greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


def test_repeat_across_checkpointed_boundary_keeps_other_checkpoints(kimi):
    """A repeat of a greedy request decodes across a stride boundary its first run already
    checkpointed; the block ending there ends in a placeholder when the save is planned. With
    every checkpoint keyed, reserving one would evict another prompt's blindly: a later request
    of that prompt must still hit its checkpoint at 16."""
    model, path = kimi
    vocab = model.config.vocab_size
    other, repeated = prompt_ids(20, 4, vocab), prompt_ids(10, 3, vocab)
    kw = dict(enable_prefix_caching=True, state_checkpoint_stride=16, num_state_checkpoints=2)
    engine = make_engine(model, path, **kw)
    final = {}
    script = (
        ("other", other, _greedy(2)),  # checkpoint at 16 of `other` (least recently used)
        ("first", repeated, _greedy(10)),  # checkpoint at 16 of its generated text
        ("again", repeated, _greedy(10)),  # decodes across that boundary once more
        ("other2", other + [7, 8], _greedy(2)),  # hits `other`'s checkpoint
    )
    for rid, prompt, params in script:
        final.update(drive(engine, {rid: (prompt, params)})[0])
    assert final["other2"].num_cached_tokens == 16
    cold = solo_runs(model, path, {r: (p, s) for r, p, s in script})
    for rid in final:
        assert_equal_outputs(final[rid], cold[rid])


@pytest.mark.parametrize("family", FAMILIES)
def test_multi_turn_hits_checkpoints_saved_at_placeholders(checkpoints, family):
    """Checkpoints inside generated text are planned while the block ending there still holds
    a placeholder and keyed when its value arrives; the next turns hit them and equal cold
    runs."""
    model, path = checkpoints(family)
    vocab = model.config.vocab_size
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, logprobs=1)
    engine = make_engine(model, path, enable_prefix_caching=True, state_checkpoint_stride=16)
    prompt = prompt_ids(9, 5, vocab)
    final, _ = drive(engine, {"t1": (prompt, params)})
    second = prompt + final["t1"].outputs[0].token_ids + prompt_ids(3, 6, vocab)
    final.update(drive(engine, {"t2": (second, params), "t2b": (second[:20], params)})[0])
    third = second + final["t2"].outputs[0].token_ids + [9]
    final.update(drive(engine, {"t3": (third, params)})[0])
    assert final["t2"].num_cached_tokens >= 32 and final["t3"].num_cached_tokens >= 64
    cold = solo_runs(model, path, {"t2": (second, params), "t3": (third, params)})
    for rid in cold:
        assert_equal_outputs(final[rid], cold[rid])


def test_stop_string_of_the_last_request_leaves_nothing_in_flight(kimi):
    """The last running request ends by a stop string read while its next step runs: the
    engine goes idle with no launched step held (its logits and tokens freed)."""
    model, path = kimi
    engine = make_engine(model, path)
    tokens = _greedy_probe(model, path, prompt_ids(6, 11, model.config.vocab_size), 8)
    stop = engine.tokenizer.decode(tokens[3:5]).strip()[:2]
    prompt = prompt_ids(6, 11, model.config.vocab_size)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=[stop])
    final, _ = drive(engine, {"stop": (prompt, params)})
    assert final["stop"].outputs[0].finish_reason == "stop"
    assert engine._inflight is None
