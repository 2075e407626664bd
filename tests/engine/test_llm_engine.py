"""LLMEngine and LLM behaviour on a tiny kimi_linear checkpoint with a local tokenizer:
request validation, abort, n/best_of, seeds, stop conditions, logprobs and prompt logprobs
(oracle: the `transformers` model's log-softmax), timeouts, queue limits, priority, streaming."""

from __future__ import annotations

import math
import time

import pytest
import torch

from hyla.config import ConfigError
from hyla.engine.llm import LLM
from hyla.request import InvalidRequestError, QueueFullError, SamplingParams, SamplingParamsError
from tests.engine.engine_util import (
    GREEDY,
    assert_all_free,
    load,
    make_engine,
    one_torch_thread,
    prompt_ids,
    run_all,
    save_checkpoint,
    solo,
)

LOGPROB_ATOL = 2e-4  # hyla vs transformers logits agree within 1e-4 (tests/models alignment)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("kimi_ckpt")
    hf = save_checkpoint("kimi_linear", path)
    return path, hf, load(path)


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


@pytest.fixture
def engine(ckpt):
    path, _, model = ckpt
    return make_engine(model, path, max_model_len=128, max_num_batched_tokens=32)


def hf_logprobs(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)


# -- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "prompt,params,field,numbers",
    [
        ([], None, "prompt", ()),
        ("", None, "prompt", ()),
        ([1, 256], None, "prompt", ("256",)),
        ([-1], None, "prompt", ()),
        ([1.5], None, "prompt", ()),
        (list(range(3, 131)), None, "prompt", ("128",)),
        (list(range(3, 103)), SamplingParams(max_tokens=40), "max_tokens", ("100", "40", "128")),
        ([5], "not params", "params", ()),
    ],
    ids=["empty", "empty-text", "vocab", "negative", "float", "too-long", "max_tokens", "type"],
)
def test_add_request_rejects_and_leaves_nothing_allocated(engine, prompt, params, field, numbers):
    with pytest.raises(InvalidRequestError) as e:
        engine.add_request("x", prompt, params)
    assert e.value.field == field
    for n in numbers:
        assert n in e.value.message
    assert not engine.has_unfinished_requests()
    assert_all_free(engine)
    engine.add_request("x", [5, 6], SamplingParams(max_tokens=2))  # the id is still free
    assert run_all(engine)["x"].finished


def test_duplicate_id_and_stop_strings_without_tokenizer(ckpt):
    _, _, model = ckpt
    engine = make_engine(model)  # no tokenizer
    engine.add_request("a", [5, 6], SamplingParams(max_tokens=2))
    with pytest.raises(InvalidRequestError) as e:
        engine.add_request("a", [5], SamplingParams())
    assert e.value.field == "request_id"
    with pytest.raises(SamplingParamsError, match="stop"):
        engine.add_request("b", [5], SamplingParams(stop=["x"]))
    with pytest.raises(InvalidRequestError, match="tokenizer"):
        engine.add_request("c", "text", SamplingParams())
    assert engine.get_num_unfinished_requests() == 1


def test_unknown_engine_option_is_named(ckpt):
    with pytest.raises(ConfigError, match="no_such_option"):
        make_engine(ckpt[2], no_such_option=1)


def test_budget_too_small_for_one_sequence(ckpt):
    with pytest.raises(ConfigError, match="kv_cache_memory"):
        make_engine(ckpt[2], kv_cache_memory=4096, max_model_len=512)


# -- abort, timeout, queue ---------------------------------------------------------------------


def test_abort_frees_at_once_and_reports_next_step(engine):
    engine.add_request("run", prompt_ids(20, 1), GREEDY)
    engine.add_request("wait", prompt_ids(50, 2), GREEDY)
    engine.step()
    stats = engine.get_stats()
    assert stats.num_free_blocks < stats.num_total_blocks
    engine.abort_request(["run", "wait", "unknown"])
    assert_all_free(engine)
    outs = {o.request_id: o for o in engine.step()}
    assert set(outs) == {"run", "wait"}
    for out in outs.values():
        assert out.finished and out.outputs[0].finish_reason == "abort"
    assert not engine.has_unfinished_requests()
    assert engine.step() == []


def test_request_timeout(ckpt):
    engine = make_engine(ckpt[2], request_timeout=0.05)
    engine.add_request("slow", prompt_ids(10, 3), SamplingParams(max_tokens=50))
    engine.step()
    time.sleep(0.1)
    (out,) = engine.step()
    assert out.finished and out.outputs[0].finish_reason == "timeout"
    assert_all_free(engine)


def test_max_queue_len(ckpt):
    engine = make_engine(ckpt[2], max_queue_len=2)
    engine.add_request("a", [5], SamplingParams())
    engine.add_request("b", [5], SamplingParams())
    with pytest.raises(QueueFullError):
        engine.add_request("c", [5], SamplingParams())


def test_priority_policy_serves_lower_value_first(ckpt):
    engine = make_engine(ckpt[2], policy="priority", max_num_seqs=1)
    engine.add_request("late", [5, 6], SamplingParams(max_tokens=2), priority=3)
    engine.add_request("urgent", [7, 8], SamplingParams(max_tokens=2), priority=-1)
    order = [o.request_id for _ in range(6) for o in engine.step() if o.finished]
    assert order == ["urgent", "late"]


# -- sampling ----------------------------------------------------------------------------------


def test_n_and_seeds_are_reproducible_and_batch_independent(engine):
    params = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=8, ignore_eos=True)
    alone = solo(engine, prompt_ids(9, 4), params)
    assert [c.index for c in alone.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in alone.outputs}) > 1
    for i in range(5):
        engine.add_request(f"n{i}", prompt_ids(5 + 7 * i, i), SamplingParams(max_tokens=6))
    engine.add_request("seeded", prompt_ids(9, 4), params)
    crowd = run_all(engine)["seeded"]
    assert [c.token_ids for c in crowd.outputs] == [c.token_ids for c in alone.outputs]


def test_best_of_returns_the_most_likely_and_only_at_the_end(engine):
    params = SamplingParams(n=1, best_of=4, temperature=1.0, seed=3, max_tokens=5)
    engine.add_request("b", prompt_ids(6, 5), params)
    seen = []
    while engine.has_unfinished_requests():
        seen.extend(engine.step())
    assert len(seen) == 1 and seen[0].finished and len(seen[0].outputs) == 1
    all4 = solo(
        engine, prompt_ids(6, 5), SamplingParams(n=4, temperature=1.0, seed=3, max_tokens=5)
    )
    best = max(all4.outputs, key=lambda c: c.cumulative_logprob)
    assert seen[0].outputs[0].token_ids == best.token_ids


def test_logprobs_match_transformers(ckpt, engine):
    _, hf, _ = ckpt
    ids = prompt_ids(11, 6)
    out = solo(engine, ids, SamplingParams(temperature=0, max_tokens=6, logprobs=3))
    comp = out.outputs[0]
    full = hf_logprobs(hf, ids + comp.token_ids)
    total = 0.0
    for i, (tok, lp) in enumerate(zip(comp.token_ids, comp.logprobs, strict=True)):
        ref = full[len(ids) - 1 + i]
        assert tok == int(ref.argmax())
        top3 = set(torch.topk(ref, 3).indices.tolist())
        assert set(lp) == top3 | {tok}
        for t, v in lp.items():
            assert abs(v - float(ref[t])) < LOGPROB_ATOL
        total += float(ref[tok])
    assert abs(comp.cumulative_logprob - total) < 6 * LOGPROB_ATOL


def test_prompt_logprobs_match_transformers_across_chunks_and_preemption(ckpt):
    path, hf, model = ckpt
    engine = make_engine(model, max_model_len=64, max_num_batched_tokens=7, block_size=4)
    ids = prompt_ids(30, 7)
    out = solo(engine, ids, SamplingParams(max_tokens=2, prompt_logprobs=2))
    ref = hf_logprobs(hf, ids)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(ids)
    for p in range(1, len(ids)):
        entry = out.prompt_logprobs[p]
        assert ids[p] in entry and len(entry) in (2, 3)
        assert set(torch.topk(ref[p - 1], 2).indices.tolist()) <= set(entry)
        for t, v in entry.items():
            assert abs(v - float(ref[p - 1, t])) < LOGPROB_ATOL


def test_stop_token_ids_and_min_tokens(engine):
    ids = prompt_ids(10, 8)
    ref = solo(engine, ids, GREEDY).outputs[0].token_ids
    stop = ref[3]
    first = ref.index(stop)
    out = solo(engine, ids, SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[stop]))
    comp = out.outputs[0]
    assert comp.token_ids == ref[: first + 1]
    assert (comp.finish_reason, comp.stop_reason) == ("stop", stop)
    late = SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[stop], min_tokens=first + 2)
    held = solo(engine, ids, late).outputs[0].token_ids
    assert held[:first] == ref[:first] and stop not in held[: first + 2]


def test_text_prompts_stop_strings(engine):
    tok = engine.tokenizer
    prompt = "hello world the quick"
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    ref = solo(engine, prompt, params)
    head = tok.decode(ref.prompt_token_ids, skip_special_tokens=True)
    full = tok.decode(ref.prompt_token_ids + ref.outputs[0].token_ids, skip_special_tokens=True)
    text = ref.outputs[0].text
    assert ref.prompt_token_ids == tok.encode(prompt) and text == full[len(head) :]
    assert len(text) > 4
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    cut = text.index(stop)
    out = solo(engine, prompt, SamplingParams(**{**_kw(params), "stop": [stop]})).outputs[0]
    assert out.text == text[:cut]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)
    incl = SamplingParams(**{**_kw(params), "stop": [stop], "include_stop_str_in_output": True})
    assert solo(engine, prompt, incl).outputs[0].text == text[: cut + len(stop)]


def _kw(p: SamplingParams) -> dict:
    return {"temperature": p.temperature, "max_tokens": p.max_tokens, "ignore_eos": p.ignore_eos}


def test_max_tokens_none_runs_to_the_context_limit(ckpt):
    engine = make_engine(ckpt[2], max_model_len=24)
    out = solo(engine, prompt_ids(20, 9), SamplingParams(max_tokens=None, ignore_eos=True))
    assert len(out.outputs[0].token_ids) == 4 and out.outputs[0].finish_reason == "length"


def test_metrics_and_stats(engine):
    out = solo(engine, prompt_ids(12, 10), GREEDY)
    m = out.metrics
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.last_token_time
    assert m.last_token_time <= m.finished_time
    assert math.isfinite(out.outputs[0].cumulative_logprob)
    stats = engine.get_stats()
    assert stats.num_total_blocks > 0 and stats.num_total_slots == 32


# -- LLM -----------------------------------------------------------------------------------------


def test_llm_generate_and_stream(ckpt):
    path, _, _ = ckpt
    llm = LLM(str(path), max_model_len=128, max_num_seqs=8, dtype="float32")
    assert llm.tokenizer is not None and llm.engine.model_name == path.name
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    outs = llm.generate(["hello world", [5, 6, 7], "the quick fox"], greedy)
    assert [len(o.outputs[0].token_ids) for o in outs] == [6, 6, 6]
    assert outs[0].prompt == "hello world" and outs[1].prompt is None
    single = llm.generate([5, 6, 7], greedy)
    assert single[0].outputs[0].token_ids == outs[1].outputs[0].token_ids
    streamed = list(llm.stream([5, 6, 7], greedy))
    assert [len(o.outputs[0].token_ids) for o in streamed] == [1, 2, 3, 4, 5, 6]
    assert (
        streamed[-1].finished
        and streamed[-1].outputs[0].token_ids == single[0].outputs[0].token_ids
    )
    it = llm.stream([5, 6, 7], SamplingParams(max_tokens=50, ignore_eos=True))
    next(it)
    it.close()  # a client that goes away aborts its request
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
    assert_all_free(llm.engine)
    with pytest.raises(InvalidRequestError):
        llm.generate([[5], []], greedy)  # the first one is withdrawn again
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
    assert_all_free(llm.engine)


def test_llm_from_a_model_config_has_random_finite_weights(ckpt):
    config = ckpt[2].config
    llm = LLM(config, max_model_len=64, max_num_seqs=4, seed=3)
    assert llm.tokenizer is None
    params = SamplingParams(max_tokens=5, ignore_eos=True, logprobs=1)
    (out,) = llm.generate([[5, 6, 7]], params)
    assert len(out.outputs[0].token_ids) == 5 and math.isfinite(out.outputs[0].cumulative_logprob)
    again = LLM(config, max_model_len=64, max_num_seqs=4, seed=3).generate([[5, 6, 7]], params)
    assert again[0].outputs[0].token_ids == out.outputs[0].token_ids
