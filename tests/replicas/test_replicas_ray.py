"""Two replicas of the embedded model on one local Ray (shared by this module's tests).

Oracles: a solo run of the same request on one in-process engine (greedy), the replicas' own
prefix-cache hit counters and block/slot counters.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

ray = pytest.importorskip("ray")

from hyla.engine.llm_engine import LLMEngine  # noqa: E402
from hyla.replicas.client import ReplicaClient  # noqa: E402
from hyla.replicas.launch import start_replicas  # noqa: E402
from hyla.request import RequestOutputKind, SamplingParams  # noqa: E402

# a hang (seen once in a full suite, not reproduced alone) fails here instead of stalling CI
pytestmark = pytest.mark.timeout(240)

OPTIONS = {"kv_cache_memory": 32 << 20, "max_model_len": 2048, "max_num_seqs": 8}


@pytest.fixture(scope="module")
def replicas():
    replica_set = start_replicas(None, OPTIONS, 2)
    yield replica_set
    replica_set.close()


@pytest.fixture(scope="module")
def solo():
    return LLMEngine.from_path(None, **OPTIONS)


def _params(max_tokens: int = 6) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                          output_kind=RequestOutputKind.FINAL_ONLY)  # fmt: skip


def _solo_ids(engine: LLMEngine, prompt: str, params: SamplingParams) -> list[int]:
    engine.add_request("solo", prompt, params)
    out = None
    while engine.has_unfinished_requests():
        out = next((o for o in engine.step() if o.finished), out)
    return list(out.outputs[0].token_ids)


async def _run(client: ReplicaClient, prompt: str, params: SamplingParams):
    outputs = [o async for o in client.generate(prompt, params)]
    return outputs[-1]


async def _stats(replicas, i: int):
    return await replicas.actors[i].get_stats.remote()


def _prompts(n: int) -> list[str]:
    return [f"Question {i}: what is {i} plus {2 * i}? " + "Think step by step. " * (i % 4)
            for i in range(n)]  # fmt: skip


def test_outputs_equal_solo_runs_and_spread_over_both_replicas(replicas, solo):
    prompts = _prompts(8)
    expected = [_solo_ids(solo, p, _params()) for p in prompts]

    async def main():
        client = ReplicaClient(replicas)
        try:
            outs = await asyncio.gather(*(_run(client, p, _params()) for p in prompts))
            return outs, dict(client.router.decisions)
        finally:
            await client.detach()

    outs, decisions = asyncio.run(main())
    assert [list(o.outputs[0].token_ids) for o in outs] == expected
    assert [o.prompt for o in outs] == prompts
    assert {replica for replica, _ in decisions} == {0, 1}, decisions


def test_a_repeated_prefix_goes_to_the_replica_that_cached_it(replicas):
    system = "You are a careful assistant. " * 60  # > one checkpoint stride of tokens
    questions = [f"{system}Question {i}: name a colour." for i in range(4)]

    async def main():
        client = ReplicaClient(replicas)
        try:
            before = [await _stats(replicas, i) for i in range(2)]
            await _run(client, questions[0], _params(2))
            first = next(r for (r, _), n in client.router.decisions.items() if n)
            deadline = time.monotonic() + 30  # until a cache report holds its checkpoints
            while not client.router.views[first].checkpoints and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            for q in questions[1:]:
                await _run(client, q, _params(2))
            after = [await _stats(replicas, i) for i in range(2)]
            return first, before, after, dict(client.router.decisions)
        finally:
            await client.detach()

    first, before, after, decisions = asyncio.run(main())
    assert decisions.get((first, "prefix")) == 3, decisions
    hits = [a.prefix_cache_hit_tokens - b.prefix_cache_hit_tokens
            for a, b in zip(after, before, strict=True)]  # fmt: skip
    assert hits[first] >= 3 * 256 and hits[1 - first] == 0, hits


def test_abort_frees_the_replicas_blocks_and_slots(replicas):
    async def main():
        client = ReplicaClient(replicas)
        try:
            params = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True,
                                    output_kind=RequestOutputKind.DELTA)  # fmt: skip
            gens = [client.generate(p, params) for p in _prompts(4)]
            for gen in gens:
                await gen.__anext__()  # a token each: running
            busy = [await _stats(replicas, i) for i in range(2)]
            for gen in gens:
                await gen.aclose()  # what a client disconnect does
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                idle = [await _stats(replicas, i) for i in range(2)]
                if all(s.num_running == s.num_waiting == 0 for s in idle):
                    break
                await asyncio.sleep(0.05)
            return busy, idle, client.num_in_flight()
        finally:
            await client.detach()

    busy, idle, in_flight = asyncio.run(main())
    assert sum(s.num_running for s in busy) == 4
    assert in_flight == 0
    for s in idle:
        assert s.num_running == s.num_waiting == 0, s
        assert s.num_free_blocks == s.num_total_blocks and s.num_free_slots == s.num_total_slots


def test_a_killed_replica_fails_only_its_requests_and_rejoins(replicas):
    from hyla.server.api import build_app

    async def main():
        client = ReplicaClient(replicas)
        app = build_app(client, "default")
        transport = httpx.ASGITransport(app=app)
        params = SamplingParams(max_tokens=300, temperature=0.0, ignore_eos=True,
                                output_kind=RequestOutputKind.DELTA)  # fmt: skip
        try:
            gens = [client.generate(p, params) for p in _prompts(4)]
            for gen in gens:
                await gen.__anext__()
            victim = client._open[next(iter(client._open))].replica
            on_victim = [client._open[r].replica == victim for r in list(client._open)]
            ray.kill(replicas.actors[victim], no_restart=False)
            hit = [g for g, v in zip(gens, on_victim, strict=True) if v]
            spared = [g for g, v in zip(gens, on_victim, strict=True) if not v]
            results = await asyncio.gather(*(_drain(g) for g in hit))  # before the restart
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                degraded = (await http.get("/health")).json()
                after = await _run(client, "One more question.", _params(2))
                assert client.router.decisions[(1 - victim, "least_loaded")] >= 1
                results += await asyncio.gather(*(_drain(g) for g in spared))
                deadline = time.monotonic() + 90
                while not client.router.views[victim].is_alive and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
                healthy = (await http.get("/health")).json()
                metrics = (await http.get("/metrics")).text
            return victim, on_victim, results, degraded, after, healthy, metrics
        finally:
            await client.detach()

    victim, on_victim, results, degraded, after, healthy, metrics = asyncio.run(main())
    num_hit = sum(on_victim)
    assert 0 < num_hit < 4
    assert results == ["error"] * num_hit + ["ok"] * (4 - num_hit)
    assert degraded["status"] == "degraded"
    assert degraded["replicas"][victim]["status"] == "down"
    assert after.finished and len(after.outputs[0].token_ids) == 2
    assert healthy["status"] == "ok", healthy
    assert f'hyla_replica_up{{replica="{victim}"}} 1.0' in metrics
    assert 'hyla_router_decisions_total{reason="' in metrics


async def _drain(gen) -> str:
    try:
        async for _ in gen:
            pass
    except Exception:  # noqa: BLE001 - EngineDeadError from the killed replica
        return "error"
    return "ok"
