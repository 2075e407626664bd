"""`hyla inspect --gaps` on configs of architectures hyla does not support (transformers 5.24's
config classes, defaults shrunk to a few layers) and on the supported families. The oracle is
what those architectures are known to contain (their transformers modeling code)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hyla.cli import app
from hyla.models.module_gaps import MISSING, OK, gap_report
from tests.hf_tiny import FAMILIES, tiny_hf_config

SMALL = dict(num_hidden_layers=4, vocab_size=512, pad_token_id=0)


def _write(tmp_path, config: dict) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config, default=str))
    return str(path)


def _from_transformers(tmp_path, model_type: str, text: dict | None = None) -> str:
    from transformers import AutoConfig

    if text is not None:
        hf = AutoConfig.for_model(model_type, text_config=text, vision_config={"depth": 1})
    else:
        hf = AutoConfig.for_model(model_type, **SMALL)
    return _write(tmp_path, hf.to_dict())


def _status(report, name_part: str) -> dict[str, str]:
    return {g.name: g.status for g in report.modules if name_part in g.name}


def _targets(report) -> dict[str, str]:
    return {g.name: g.target for g in report.modules}


def _fields(report) -> dict[str, str]:
    return {g.name: g.status for g in report.fields}


def test_glm5_next_kda_and_dsa_map_hyper_connections_missing(tmp_path):
    layers = ["linear_attention"] * 3 + ["indexed_attention"]
    text = dict(SMALL, layer_types=layers, mlp_layer_types=["dense"] + ["sparse"] * 3,
                indexer_types=["full"] * 4, n_routed_experts=8)  # fmt: skip
    report = gap_report(_from_transformers(tmp_path, "glm5_next", text))
    targets = _targets(report)
    assert "KimiDeltaAttention" in targets["Glm5NextTextLinearAttention"]
    assert "DSAttention" in targets["Glm5NextTextAttention"]
    assert _status(report, "HyperConnection") == {"Glm5NextTextHyperConnection": MISSING}
    assert _status(report, "vision") == {"vision tower": MISSING}
    fields = _fields(report)
    assert fields["swiglu_limit"] == fields["hc_mult"] == fields["vision_config"] == MISSING


def test_qwen3_5_is_qwen3_next_without_moe_plus_vision(tmp_path):
    layers = ["linear_attention"] * 3 + ["full_attention"]
    report = gap_report(_from_transformers(tmp_path, "qwen3_5", dict(SMALL, layer_types=layers)))
    targets = _targets(report)
    assert "GatedDeltaNet" in targets["Qwen3_5GatedDeltaNet"]
    assert "GQAttention" in targets["Qwen3_5Attention"]
    missing = {g.name for g in report.modules + report.fields if g.status == MISSING}
    # transformers builds Qwen3_5ForCausalLM (text only): the tower shows as the config field
    assert missing == {"vision_config"}


def test_deepseek_v4_compressed_attention_and_router_missing(tmp_path):
    report = gap_report(_from_transformers(tmp_path, "deepseek_v4"))
    status = {g.name: g.status for g in report.modules}
    assert status["DeepseekV4HashRouter"] == MISSING
    assert status["SqrtSoftplusActivation"] == MISSING
    assert MISSING in {status[n] for n in status if "Compressor" in n}
    assert status["DeepseekV4Experts"] == OK
    fields = _fields(report)
    assert fields["scoring_func"] == fields["sliding_window"] == MISSING


@pytest.mark.parametrize("family", FAMILIES)
def test_supported_families_have_no_gaps(tmp_path, family):
    report = gap_report(_write(tmp_path, tiny_hf_config(family).to_dict()))
    assert report.modules and report.num_missing == 0, report


def test_unknown_model_type_reports_fields_only(tmp_path):
    path = _write(tmp_path, {"model_type": "not_a_model", "hidden_act": "gelu",
                             "sliding_window": 64})  # fmt: skip
    report = gap_report(path)
    assert report.modules == () and "config fields only" in report.built_with
    assert _fields(report) == {"hidden_act": MISSING, "sliding_window": MISSING}


def test_cli_inspect_gaps(tmp_path):
    path = _from_transformers(tmp_path, "deepseek_v4")
    result = CliRunner().invoke(app, ["inspect", path, "--gaps"])
    assert result.exit_code == 0, result.output
    assert "missing  DeepseekV4HashRouter" in result.output
    missing = CliRunner().invoke(app, ["inspect", str(tmp_path / "nope"), "--gaps"])
    assert missing.exit_code == 2 and "no config.json" in missing.output


def test_cli_inspect_of_an_unsupported_config_points_to_gaps(tmp_path):
    path = _from_transformers(tmp_path, "deepseek_v4")
    result = CliRunner().invoke(app, ["inspect", path])
    assert result.exit_code == 2 and "hyla inspect --gaps" in result.output
