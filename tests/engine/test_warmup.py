"""Ready means warm: `LLMEngine.from_path` runs the warm-up before returning, and the warm-up
builds the decode step of every captured batch size (here DecodeGraphs without capture, as on
the CPU in test_cuda_graphs_adversarial) and a prefill of the token bucket, then leaves the
engine idle: every block and slot free, no prefix-cache counts."""

from __future__ import annotations

from hyla.engine.cuda_graphs import DecodeGraphs
from hyla.engine.llm_engine import LLMEngine
from hyla.engine.warmup import warm_up
from hyla.request import SamplingParams
from tests.engine.engine_util import assert_all_free, make_engine, run_all


def test_warm_up_builds_every_decode_batch_size(kimi):
    model, path = kimi
    engine = make_engine(model, path, enable_prefix_caching=True)
    runner = engine.runner
    runner.graphs = DecodeGraphs(model, runner.caches, runner.block_size, (1, 2, 4),
                                 capture=False, max_model_len=engine.max_model_len)  # fmt: skip
    assert warm_up(engine) >= 0
    assert {size for size, _ in runner.graphs.steps} == {1, 2, 4}
    assert_all_free(engine)
    stats = engine.get_stats()
    assert stats.prefix_cache_queries == 0 and stats.num_preemptions == 0
    engine.add_request("x", [3, 4, 5], SamplingParams(temperature=0, max_tokens=3))
    assert len(run_all(engine)["x"].outputs[0].token_ids) == 3


def test_from_path_returns_a_warm_idle_engine(kimi, monkeypatch):
    _, path = kimi
    calls = []
    import hyla.engine.llm_engine as llm_engine

    monkeypatch.setattr(llm_engine, "warm_up", lambda e: calls.append(e) or warm_up(e))
    engine = LLMEngine.from_path(str(path), device="cpu", max_model_len=128)
    assert calls == [engine]
    assert_all_free(engine)
