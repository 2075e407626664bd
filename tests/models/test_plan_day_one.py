"""`hyla plan` on the real default configs of the day-one families (transformers' config
classes, defaults unchanged: Qwen3.5-35B-A3B, GLM-5 744B, DeepSeek-V4-Flash): it sizes them
without weights, and its parameter count equals the transformers text model's, built on the
meta device (parameters plus the routers' correction-bias and hash-table buffers; no MTP
layers, no vision tower)."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from hyla.cli import app
from hyla.models.registry import config_from_hf
from hyla.plan.costs import param_split

CONFIGS = {"qwen3_5_moe": "Qwen3_5MoeConfig", "glm_moe_dsa": "GlmMoeDsaConfig",
           "deepseek_v4": "DeepseekV4Config"}  # fmt: skip


def _default(family: str):
    import transformers

    return getattr(transformers, CONFIGS[family])()


def _transformers_count(config) -> int:
    from transformers import AutoModelForCausalLM

    text = getattr(config, "text_config", None) or config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(text)
    buffers = sum(b.numel() for n, b in model.named_buffers()
                  if n.endswith(("correction_bias", "tid2eid")))  # fmt: skip
    return sum(p.numel() for p in model.parameters()) + buffers


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_plan_sizes_the_default_config(tmp_path, family):
    config = _default(family)
    assert param_split(config_from_hf(config.to_dict())).total == _transformers_count(config)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config.to_dict(), default=str))
    result = CliRunner().invoke(app, ["plan", str(path), "--dtype", "fp8"])
    assert result.exit_code == 0, result.output
    assert f"model     {family}" in result.output and "TP8" in result.output
