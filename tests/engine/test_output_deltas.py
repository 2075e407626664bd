"""Outputs as deltas (issue 18 item 1): a DELTA request's outputs carry only what is new, and
joined they equal the CUMULATIVE output of the same request in the same batch (the oracle: the
cumulative path, run in a fresh engine over the same requests; `LLM.generate`'s FINAL_ONLY
result too). No output re-sends a token, a piece of text, a logprob or a finish."""

from __future__ import annotations

import dataclasses

import pytest

from hyla.engine.llm import LLM
from hyla.request import RequestOutput, RequestOutputKind, SamplingParams
from tests.engine.engine_util import make_engine, one_torch_thread, prompt_ids

DELTA, CUMULATIVE = RequestOutputKind.DELTA, RequestOutputKind.CUMULATIVE
CASES = {
    "greedy-logprobs-prompt-logprobs": SamplingParams(
        temperature=0, max_tokens=10, ignore_eos=True, logprobs=3, prompt_logprobs=2
    ),
    "seeded-n3-logprobs": SamplingParams(
        n=3, temperature=1.0, seed=7, max_tokens=10, ignore_eos=True, logprobs=2
    ),
    "best-of-4-n2": SamplingParams(
        n=2, best_of=4, temperature=1.0, seed=5, max_tokens=6, ignore_eos=True, logprobs=1
    ),
}


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


def _run(model, path, requests: dict[str, tuple[list[int], SamplingParams]], kind):
    """Every output of each request, in order, from a fresh engine."""
    engine = make_engine(model, path)
    for rid, (ids, params) in requests.items():
        engine.add_request(rid, ids, dataclasses.replace(params, output_kind=kind))
    outputs: dict[str, list[RequestOutput]] = {rid: [] for rid in requests}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.request_id].append(out)
    return outputs


def _assert_joined_equals(deltas: list[RequestOutput], final: RequestOutput) -> None:
    assert [d.finished for d in deltas] == [False] * (len(deltas) - 1) + [True]
    assert deltas[0].prompt_logprobs == final.prompt_logprobs
    assert all(d.prompt_logprobs is None for d in deltas[1:])
    for want in final.outputs:
        pieces = [c for d in deltas for c in d.outputs if c.index == want.index]
        assert all(c.text or c.token_ids or c.finish_reason for c in pieces)  # nothing empty
        assert "".join(c.text for c in pieces) == want.text
        assert [t for c in pieces for t in c.token_ids] == want.token_ids
        if want.logprobs is not None:
            assert [lp for c in pieces for lp in c.logprobs] == want.logprobs
        assert [c.finish_reason for c in pieces][-1] == want.finish_reason
        assert all(c.finish_reason is None for c in pieces[:-1])  # the finish comes once
        assert pieces[-1].stop_reason == want.stop_reason
        assert pieces[-1].cumulative_logprob == want.cumulative_logprob


def _requests(vocab: int, params: SamplingParams) -> dict[str, tuple[list[int], SamplingParams]]:
    return {f"r{k}": (prompt_ids(5 + 3 * k, k, vocab), params) for k in range(3)}


@pytest.mark.parametrize("case", list(CASES))
def test_deltas_join_to_the_cumulative_output(kimi, case):
    model, path = kimi
    requests = _requests(model.config.vocab_size, CASES[case])
    cumulative = _run(model, path, requests, CUMULATIVE)
    deltas = _run(model, path, requests, DELTA)
    for rid in requests:
        final = cumulative[rid][-1]
        _assert_joined_equals(deltas[rid], final)
        if case.startswith("best-of"):  # the one case that buffers: one output, at the end
            assert len(deltas[rid]) == len(cumulative[rid]) == 1
        else:
            assert len(deltas[rid]) > 1


@pytest.mark.parametrize("include", [False, True], ids=["stop-cut", "stop-included"])
def test_deltas_with_stop_strings_never_show_the_cut_text(kimi, include):
    """A stop string found in the text of a later run cuts it: the deltas joined give the cut
    text, and no delta ever carried text past the cut (the hold-back)."""
    model, path = kimi
    base = SamplingParams(n=2, temperature=1.0, seed=11, max_tokens=24, ignore_eos=True)
    requests = _requests(model.config.vocab_size, base)
    free = _run(model, path, requests, CUMULATIVE)
    text = free["r1"][-1].outputs[0].text
    assert len(text) > 12, text  # the tokenizer decodes the random model's tokens to text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    params = dataclasses.replace(base, stop=(stop,), include_stop_str_in_output=include)
    requests = {rid: (ids, params) for rid, (ids, _) in requests.items()}
    cumulative = _run(model, path, requests, CUMULATIVE)
    deltas = _run(model, path, requests, DELTA)
    stopped = 0
    for rid in requests:
        final = cumulative[rid][-1]
        _assert_joined_equals(deltas[rid], final)
        for c in final.outputs:
            stopped += c.stop_reason == stop
            if c.stop_reason == stop:
                assert c.text.endswith(stop) if include else stop not in c.text
    assert stopped >= 1


def test_llm_generate_returns_the_cumulative_final_output(kimi):
    """`LLM.generate` asks the engine for final outputs only; its results equal the final
    cumulative outputs of the same requests stepped by hand."""
    model, path = kimi
    params = CASES["seeded-n3-logprobs"]
    requests = _requests(model.config.vocab_size, params)
    cumulative = _run(model, path, requests, CUMULATIVE)
    llm = LLM(
        str(path), max_model_len=512, block_size=16, max_num_seqs=32, max_num_batched_tokens=128
    )  # make_engine's options, through from_path
    results = llm.generate([ids for ids, _ in requests.values()], params)
    for got, rid in zip(results, requests, strict=True):
        want = cumulative[rid][-1]
        assert [c.token_ids for c in got.outputs] == [c.token_ids for c in want.outputs]
        assert [c.text for c in got.outputs] == [c.text for c in want.outputs]
        assert [c.logprobs for c in got.outputs] == [c.logprobs for c in want.outputs]


def test_best_of_timeout_keeps_the_sequences_with_tokens(kimi):
    """best_of 3 with room for one running sequence: a timeout ends the request while two of
    its sequences still wait. The reported winner is the one with tokens (an empty one has
    cumulative logprob 0 and used to win: the server then answered a 503 queue_timeout)."""
    import time

    model, path = kimi
    engine = make_engine(model, path, max_num_seqs=1, request_timeout=1.0, max_model_len=4096)
    params = SamplingParams(
        n=1, best_of=3, temperature=1.0, seed=1, max_tokens=3000, ignore_eos=True, output_kind=DELTA
    )
    engine.add_request("b", prompt_ids(6, 1, model.config.vocab_size), params)
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
        time.sleep(0.01)  # >= 10 ms a step: the first sequence cannot end before the timeout
    (final,) = outputs
    assert final.finished and final.outputs[0].finish_reason == "timeout"
    assert final.outputs[0].token_ids
