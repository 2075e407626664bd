"""A Qwen3.5 multimodal config without `rope_parameters.mrope_section` (issue 41, item 4).

transformers' `Qwen3_5TextRotaryEmbedding` applies M-RoPE whatever the config says, with the
section (11, 11, 10) when none is given; hyla took such a config for 1-D RoPE, and image rows
lost their grid positions (image log-probs off by 0.005-0.009). Oracles: transformers' rotary
module's own section; end to end, `hyla validate --checks vision` (hyla's image prompts
scored against transformers' image-text model on the same checkpoint).
"""

from __future__ import annotations

import json

from typer.testing import CliRunner

from hyla.cli import app
from hyla.models.qwen3_5 import config_from_hf
from tests.mm_tiny import save_mm_checkpoint


def _drop_section(path) -> dict:
    config = json.loads((path / "config.json").read_text())
    del config["text_config"]["rope_parameters"]["mrope_section"]
    (path / "config.json").write_text(json.dumps(config))
    return config


def test_missing_section_takes_transformers_default(tmp_path):
    from transformers import Qwen3_5Config
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding

    save_mm_checkpoint("qwen3_5", tmp_path)
    config = _drop_section(tmp_path)
    hf = Qwen3_5TextRotaryEmbedding(Qwen3_5Config(**config).text_config)
    rope = config_from_hf(config).rope
    assert list(rope.scaling_dict()["mrope_section"]) == list(hf.mrope_section)


def test_image_logprobs_match_transformers_without_a_section(tmp_path):
    model = tmp_path / "model"
    save_mm_checkpoint("qwen3_5", model)
    _drop_section(model)
    out = tmp_path / "report"
    result = CliRunner().invoke(app, ["validate", str(model), "--checks", "vision", "--quick",
                                      "--device", "cpu", "--out", str(out)])  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    assert result.exit_code == 0, result.output
    assert summary["checks"]["vision"]["status"] == "pass", summary["checks"]["vision"]
