"""The engine core in its own process (`AsyncEngine.from_process`, what `hyla serve` runs).

Oracles: the same requests through the in-thread engine (the loop of one process) on the same
checkpoint; the typed errors of `LLMEngine.add_request`; the core's own cache counters (all
blocks and slots free once every request ended); a killed process (SIGKILL from outside).
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from hyla.engine.async_engine import AsyncEngine
from hyla.engine.async_stream import EngineDeadError
from hyla.engine.documents import document_ids
from hyla.engine.llm_engine import LLMEngine
from hyla.request import InvalidRequestError, SamplingParams
from hyla.structured import StructuredOutputsError, StructuredOutputsParams

OPTIONS = {"max_model_len": 512, "kv_cache_memory": 16 << 20, "max_num_seqs": 8}
PROMPTS = ["def fibonacci(n):", "import os\n", "# a user record as JSON", "class Point:"]


def greedy(n: int = 12) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


async def _collect(aengine: AsyncEngine, prompts: list[str], params: SamplingParams) -> list:
    async def one(i: int, prompt: str) -> list[int]:
        final = None
        async for out in aengine.generate(prompt, params, f"r{i}"):
            final = out
        return final.outputs[0].token_ids

    return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))


def _in_thread(prompts: list[str], params: SamplingParams) -> list:
    engine = LLMEngine.from_path(None, **OPTIONS)

    async def run():
        aengine = AsyncEngine(engine)
        aengine.start()
        try:
            return await _collect(aengine, prompts, params)
        finally:
            await aengine.shutdown()

    return asyncio.run(run())


def test_core_process_streams_what_the_in_thread_engine_streams():
    want = _in_thread(PROMPTS, greedy())

    async def run():
        aengine = AsyncEngine.from_process(None, OPTIONS)
        aengine.start()
        try:
            got = await _collect(aengine, PROMPTS, greedy())
            with pytest.raises(StructuredOutputsError) as refused:  # raised in the core
                bad = SamplingParams(structured_outputs=StructuredOutputsParams(regex="("))
                await aengine.add_request("x", bad, "bad")
            ids = await aengine.call(document_ids, "hello world")  # run in the core
            assert ids == aengine.tokenizer.encode("hello world")
            with pytest.raises(InvalidRequestError) as bad_ids:
                await aengine.call(document_ids, [10**9])
            assert bad_ids.value.field == "prompt"
            stream = await aengine.add_request(PROMPTS[0], greedy(400), "cancelled")
            await stream.__anext__()
            stream.abort()
            for _ in range(200):  # the abort's release shows in the next stats
                stats = aengine.get_stats()
                if stats.num_running == 0 and stats.num_free_blocks == stats.num_total_blocks:
                    break
                await asyncio.sleep(0.02)
            return got, refused.value, stats, aengine.num_in_flight()
        finally:
            await aengine.shutdown()

    got, refused, stats, in_flight = asyncio.run(run())
    assert got == want
    assert refused.field == "structured_outputs"
    assert in_flight == 0
    assert stats.num_free_blocks == stats.num_total_blocks
    assert stats.num_free_slots == stats.num_total_slots


def test_a_killed_core_process_fails_every_open_stream():
    async def run():
        aengine = AsyncEngine.from_process(None, OPTIONS)
        aengine.start()
        streams = [await aengine.add_request(p, greedy(400), f"k{i}")
                   for i, p in enumerate(PROMPTS[:2])]
        for s in streams:
            await s.__anext__()
        os.kill(aengine.core.process.pid, signal.SIGKILL)
        errors = []
        for s in streams:
            with pytest.raises(EngineDeadError) as e:
                async for _ in s:
                    pass
            errors.append(str(e.value))
        with pytest.raises(EngineDeadError):
            aengine.check_health()
        with pytest.raises(EngineDeadError):
            await aengine.add_request("hello", greedy(), "after")
        await aengine.shutdown(drain=False)
        return errors

    errors = asyncio.run(asyncio.wait_for(run(), 120))
    assert all("exited with code -9" in e for e in errors), errors


def test_a_loading_error_is_raised_in_the_front_end(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        AsyncEngine.from_process(str(tmp_path / "missing"), OPTIONS)
