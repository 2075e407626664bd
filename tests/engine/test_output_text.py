"""The front end makes the text of outputs when the core runs in its own process
(`hyla.engine.output_text`): the same text, piece by piece, as the engine makes itself.

Oracle: the same requests through the in-thread engine (which detokenizes in the engine), on
the same checkpoint: the streamed text and token ids of each completion equal, for DELTA and
cumulative outputs, n > 1, a stop token (its text excluded, or included with
include_stop_str_in_output), special tokens kept, and a stop string (left to the core)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from hyla.engine.async_engine import AsyncEngine
from hyla.engine.llm_engine import LLMEngine
from hyla.engine.output_text import front_detokenized
from hyla.request import RequestOutputKind, SamplingParams, SamplingParamsError

OPTIONS = {"max_model_len": 512, "kv_cache_memory": 16 << 20, "max_num_seqs": 8}
PROMPT = "def fibonacci(n):"
DELTA = RequestOutputKind.DELTA


def _cases(stop_id: int, stop: str = "\n") -> dict[str, SamplingParams]:
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, output_kind=DELTA)
    return {
        "delta": greedy,
        "cumulative": dataclasses.replace(greedy, output_kind=RequestOutputKind.CUMULATIVE),
        "n2": SamplingParams(n=2, temperature=1.0, seed=7, max_tokens=12, output_kind=DELTA),
        "stop_id": dataclasses.replace(greedy, stop_token_ids=(stop_id,)),
        "stop_id_kept": dataclasses.replace(greedy, stop_token_ids=(stop_id,),
                                            include_stop_str_in_output=True),
        "specials": dataclasses.replace(greedy, skip_special_tokens=False),
        "stop_string": dataclasses.replace(greedy, stop=[stop]),
    }


async def _run(aengine: AsyncEngine, cases: dict[str, SamplingParams]) -> dict:
    async def one(name: str, params: SamplingParams):
        texts, ids, finish = {}, {}, {}  # per completion (pieces arrive merged or not: timing)
        async for out in aengine.generate(PROMPT, params, name):
            for c in out.outputs:
                if params.output_kind is DELTA:
                    texts[c.index] = texts.get(c.index, "") + c.text
                    ids[c.index] = ids.get(c.index, []) + list(c.token_ids)
                else:
                    texts[c.index], ids[c.index] = c.text, list(c.token_ids)
                finish[c.index] = c.finish_reason
        return texts, ids, finish

    results = await asyncio.gather(*(one(k, p) for k, p in cases.items()))
    return dict(zip(cases, results, strict=True))


def _serve(aengine: AsyncEngine, cases: dict[str, SamplingParams]) -> dict:
    async def run():
        aengine.start()
        try:
            return await _run(aengine, cases)
        finally:
            await aengine.shutdown()

    return asyncio.run(asyncio.wait_for(run(), 180))


def test_front_end_text_equals_the_engines_own():
    engine = LLMEngine.from_path(None, **OPTIONS)
    texts, ids, _ = _serve(AsyncEngine(engine), _cases(stop_id=0))["cumulative"]
    ids, text = ids[0], texts[0]
    at = next(i for i, t in enumerate(ids) if i >= 2 and t not in ids[:i])  # reached, not first
    k = next(k for k in range(3, len(text) - 2) if text[k:k + 2].strip()
             and text.find(text[k:k + 2]) == k)  # fmt: skip
    cases = _cases(ids[at], stop=text[k:k + 2])
    want = _serve(AsyncEngine(LLMEngine.from_path(None, **OPTIONS)), cases)
    got = _serve(AsyncEngine.from_process(None, OPTIONS), cases)
    assert want["stop_id"][2][0] == "stop" and len(want["stop_id"][1][0]) == at + 1
    assert want["stop_string"][0][0] == text[:k]
    for name in cases:
        assert got[name] == want[name], name
    empty = [k for k, (texts, _, _) in want.items() if not all(texts.values())]
    assert not empty, empty  # text was made


def test_front_detokenized_leaves_stop_strings_and_best_of_to_the_core():
    tok = object()
    plain = SamplingParams(max_tokens=4)
    assert front_detokenized(plain, tok).detokenize is False
    assert front_detokenized(plain, None) is None
    assert front_detokenized(SamplingParams(stop=["x"]), tok) is None
    assert front_detokenized(SamplingParams(n=1, best_of=3), tok) is None
    assert front_detokenized(SamplingParams(detokenize=False), tok) is None
    with pytest.raises(SamplingParamsError, match="stop"):
        SamplingParams(stop=["x"], detokenize=False)
