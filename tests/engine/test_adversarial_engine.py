"""Adversarial inputs to the offline API and the async engine (bugs found by a tester).

Oracles: the typed errors `SamplingParamsError`/`InvalidRequestError` naming the field; vLLM's
documented semantics (None for `stop`/`stop_token_ids`, `min_tokens` also holds back stop
strings); the engine's own greedy output; the stream's pending-output count.
"""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest
import torch

from hyla.engine.llm import LLM
from hyla.request import InvalidRequestError, SamplingParams, SamplingParamsError
from tests.server.conftest import load_tokenizer, tiny_engine


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="module")
def llm(tokenizer):
    torch.set_num_threads(1)
    out = LLM.__new__(LLM)
    out.engine = tiny_engine(tokenizer, max_num_seqs=4, max_num_batched_tokens=32)
    out._ids = itertools.count()
    out._inbox = {}
    return out


def _assert_free(engine) -> None:
    stats = engine.get_stats()
    assert stats.num_free_blocks == stats.num_total_blocks, stats
    assert stats.num_free_slots == stats.num_total_slots, stats


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1, 2**63], ids=["2^64", "below-int64", "2^63"])
def test_seed_outside_int64_is_a_typed_error(seed):
    with pytest.raises(SamplingParamsError) as e:
        SamplingParams(seed=seed)
    assert e.value.field == "seed"


def test_seed_int64_extremes_work_with_n(llm):
    for seed in (2**63 - 1, -(2**63)):
        out = llm.generate([1, 2, 3], SamplingParams(seed=seed, n=3, max_tokens=2))[0]
        assert len(out.outputs) == 3
    _assert_free(llm.engine)


def test_stop_and_stop_token_ids_accept_none_as_vllm():
    p = SamplingParams(stop=None, stop_token_ids=None)
    assert p.stop == () and p.stop_token_ids == ()


@pytest.mark.parametrize(
    "prompts", [[True, False], [[1, 2], 3], [None], ["a", 5]], ids=["bools", "ids-and-int",
                                                                     "none", "str-and-int"],
)
def test_generate_bad_prompt_shapes_are_typed_errors(llm, prompts):
    with pytest.raises(InvalidRequestError) as e:
        llm.generate(prompts, SamplingParams(max_tokens=1))
    assert e.value.field == "prompt"
    assert not llm.engine.has_unfinished_requests()
    _assert_free(llm.engine)


def test_min_tokens_holds_back_stop_strings(llm):
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    base = llm.generate("The quick", greedy)[0].outputs[0]
    first = llm.tokenizer.decode(base.token_ids[:1])
    assert first.strip(), "need a visible first token"
    stop = first.strip()[:1]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, stop=[stop],
                            min_tokens=3)
    out = llm.generate("The quick", params)[0].outputs[0]
    assert len(out.token_ids) >= 3, out
    assert out.token_ids == base.token_ids[: len(out.token_ids)]


def test_stalled_stream_consumer_holds_one_pending_output(tokenizer):
    """Outputs are cumulative: a consumer that stops reading must not make the stream buffer
    one full copy per step (O(L^2) memory for a long generation)."""
    from hyla.engine.async_engine import AsyncEngine

    engine = tiny_engine(tokenizer, max_num_seqs=2)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)

    async def run():
        aengine = AsyncEngine(engine)
        aengine.start()
        try:
            stream = await aengine.add_request([5, 6, 7], params, "stalled")
            deadline = time.monotonic() + 30
            while aengine.num_in_flight() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.05)
            pending = stream.num_pending
            outputs = [o async for o in stream]
            return pending, outputs
        finally:
            await aengine.shutdown(drain=False)

    pending, outputs = asyncio.run(run())
    assert pending <= 1, pending
    assert outputs[-1].finished and len(outputs[-1].outputs[0].token_ids) == 24
    _assert_free(engine)


def test_tokenizer_dir_without_tokenizer_files_is_a_config_error(tmp_path):
    from hyla.config import ConfigError
    from hyla.engine.llm_engine import LLMEngine

    with pytest.raises(ConfigError, match="tokenizer"):
        LLMEngine.from_path(None, tokenizer=str(tmp_path))
