"""`hyla plan` ranks only layouts `hyla serve` accepts, and measures them as the engine builds
them.

Oracles: the engine itself (`LLMEngine.from_path` with the layout's options refuses exactly the
layouts the plan lists as refused, with the same message, before loading any weight), and the
full-size models of every family built on the meta device and sharded by the engine's sharding
code (`hyla.plan.meta_check`: parameters, the allocator's cache tensors), against which the
plan's per-rank bytes must be within 2%.
"""

from __future__ import annotations

import json

import pytest

from hyla.config import ConfigError
from hyla.engine.llm_engine import LLMEngine
from hyla.plan.estimate import Workload
from hyla.plan.gpus import gpu_spec
from hyla.plan.meta_check import CASES, check_layout, default_config, write_config
from hyla.plan.planner import plan
from tests.glm_tiny import save_tiny_glm
from tests.plan.full_configs import DEEPSEEK_V32

WORK = Workload(num_gpus=8, context=256, concurrency=1, weight_dtype="float32")


def test_refused_layouts_are_the_ones_the_engine_refuses(tmp_path):
    """A tiny GLM-5.3-Flash with its vision tower (4 attention and linear heads) on 8 GPUs:
    every layout the plan refuses, the engine refuses with the same message before starting
    any rank, and the plan ranks TP1, TP2 and TP4 (which the gloo tests run at TP2)."""
    path = tmp_path / "glm"
    save_tiny_glm(path, seed=0)
    report = plan(path, gpu_spec("H200"), WORK)
    assert {e.tp for e in report.layouts} == {1, 2, 4}
    assert {name.split()[0] for name, _ in report.refused} == {"TP8"}
    for name, reason in report.refused:
        tp, ep = int(name.split()[0][2:]), int(name.split()[2][2:])
        with pytest.raises(ConfigError) as err:
            LLMEngine.from_path(
                str(path),
                device="cpu",
                dtype="float32",
                max_model_len=256,
                tensor_parallel_size=tp,
                enable_expert_parallel=ep > 1,
            )
        assert str(err.value) == reason


def test_no_layout_spreads_experts_beyond_the_tp_group(tmp_path):
    """hyla's expert parallelism runs inside the TP group: no TP1 x EP8 (the old top pick)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(DEEPSEEK_V32))
    work = Workload(num_gpus=8, context=131072, concurrency=64, weight_dtype="bfloat16")
    for e in plan(path, gpu_spec("H200"), work).layouts:
        assert e.ep in (1, e.tp)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_full_size_meta_build_matches_the_plan_within_2_percent(case, tmp_path):
    name, cls, extra, weights, cache, layouts = case
    path = write_config(default_config(cls, extra), tmp_path / "model")
    work = Workload(num_gpus=8, context=131072, concurrency=64, weight_dtype=weights)
    for tp, ep in layouts:
        row = check_layout(path, gpu_spec("H200"), work, tp, ep, kv_cache_dtype=cache)
        if row["engine_refuses"] is None:
            assert row["max_rel_err"] <= 0.02, row
        assert row["meta"]["weight_bytes"] > 0
