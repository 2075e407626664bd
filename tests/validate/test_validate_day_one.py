"""`hyla validate --quick --checks precision` on tiny checkpoints of the day-one families
(qwen3_5_moe with its vision tower, glm_moe_dsa, deepseek_v4): the engine's greedy runs and
logprobs against transformers on the same checkpoint pass the precision bounds."""

from __future__ import annotations

import pytest

from tests.deepseek_v4_tiny import save_tiny_deepseek_v4
from tests.qwen35_moe_tiny import save_tiny_qwen35_moe
from tests.validate.test_validate import _validate

# glm_moe_dsa passes too (measured); DeepSeek-V3.2's checks cover its engine path
SAVERS = {"qwen3_5_moe": save_tiny_qwen35_moe, "deepseek_v4": save_tiny_deepseek_v4}


@pytest.mark.parametrize("family", sorted(SAVERS))
def test_precision_check_passes_against_transformers(tmp_path, family):
    SAVERS[family](tmp_path / "model", seed=0)
    out = tmp_path / "report"
    result, summary = _validate(out, str(tmp_path / "model"), "--checks", "precision")
    assert result.exit_code == 0, result.output
    precision = summary["checks"]["precision"]
    assert precision["status"] == "pass"
    assert precision["reason"].startswith("reference: transformers")
