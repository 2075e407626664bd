"""`hyla inspect --gaps` (hyla.models.module_gaps, the one gap list) on transformers 5.24's
configs. Oracles: the classes transformers' modeling code builds (named per architecture below),
and what hyla contains: every "ok" row must name a hyla module/function that exists (and say
"PyTorch only" when its ops folder has no GPU kernels.py), the vision rows follow
hyla.models.vision_loader.TOWERS, and the "images through the engine" row stays missing while
`LLM.generate` takes no images."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import hyla
from hyla.cli import app
from hyla.models.module_gaps import IMAGES_IN_ENGINE, MISSING, OK, gap_report
from tests.hf_tiny import FAMILIES, tiny_hf_config

SMALL = dict(num_hidden_layers=4, vocab_size=512, pad_token_id=0)
OPS = Path(hyla.__file__).parent / "ops"


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
    return {(g.name, g.status): g.target for g in report.fields}


def _hyla_object(target: str):
    """The object a row's leading `layers/x.Name` / `ops/x/y.fn` names (None if none)."""
    head = target.split(" ")[0].rstrip(",")
    if "/" not in head:
        return None
    module, _, attr = head.partition(".")
    mod = importlib.import_module("hyla." + module.replace("/", "."))
    return getattr(mod, attr) if attr else mod


def _assert_rows_true(report) -> None:
    for g in report.modules + report.fields:
        if g.status != OK:
            continue
        assert _hyla_object(g.target) is not None, g
        for op in re.findall(r"\bops/(\w+)", g.target):
            if op != "rotary" and not _has_gpu_path(op):  # rope: cos/sin tables, torch by design
                assert "PyTorch only" in g.target, (g, op)


def _has_gpu_path(op: str) -> bool:
    """Whether hyla/ops/<op> has a Triton or fla path (a GPU kernel of its own)."""
    return any(re.search(r"\b(triton|fla)\b", f.read_text()) for f in (OPS / op).glob("*.py"))


GLM = ["linear_attention"] * 2 + ["indexed_attention"] * 2
GLM_TEXT = dict(SMALL, layer_types=GLM, mlp_layer_types=["dense"] + ["sparse"] * 3,
                indexer_types=["full", "full", "full", "shared"], n_routed_experts=8)  # fmt: skip


def test_glm5_next_maps_every_module_to_hyla(tmp_path):
    report = gap_report(_from_transformers(tmp_path, "glm5_next", GLM_TEXT))
    _assert_rows_true(report)
    targets = _targets(report)
    # classes of transformers' modeling_glm5_next.py and the hyla module each needs
    for cls, hyla_name in (
        ("Glm5NextTextLinearAttention", "KimiDeltaAttention"),
        ("Glm5NextTextForgetGate", "kda_gates_bounded"),
        ("Glm5NextTextAttention", "PooledDSAttention"),
        ("Glm5NextTextIndexer", "KPoolIndexer"),
        ("Glm5NextTextHyperConnection", "HyperConnection"),
        ("Glm5NextTextHyperHead", "HyperConnection"),
        ("Glm5NextTextUnweightedRMSNorm", "hc_weights"),
        ("Glm5NextTextExperts", "moe_experts_clamped"),
        ("Glm5NextTextMLP", "silu_and_mul_clamped"),
    ):
        assert hyla_name in targets[cls], (cls, targets[cls])
    from hyla.models.vision_loader import TOWERS

    assert TOWERS["glm5_next"][0].__name__ in targets["vision tower"]
    assert {g.name for g in report.modules if g.status != OK} == set()
    fields = _fields(report)
    for name in ("swiglu_limit", "hc_mult", "index_kpool", "linear_lower_bound", "indexer_types"):
        assert (name, OK) in fields, name
    assert ("vision_config", MISSING) not in fields
    rows = [g for g in report.fields if g.name == "vision_config"]
    assert IMAGES_IN_ENGINE in [g.target for g in rows if g.status == OK]


def test_qwen3_5_maps_every_module_and_mrope(tmp_path):
    layers = ["linear_attention"] * 3 + ["full_attention"]
    rope = {"rope_type": "default", "mrope_section": [11, 11, 10], "partial_rotary_factor": 0.25}
    text = dict(SMALL, layer_types=layers, rope_parameters=rope)
    report = gap_report(_from_transformers(tmp_path, "qwen3_5", text))
    _assert_rows_true(report)
    targets = _targets(report)
    assert "GatedDeltaNet" in targets["Qwen3_5GatedDeltaNet"]
    assert "GQAttention" in targets["Qwen3_5Attention"]
    fields = _fields(report)
    assert "mrope_cos_sin" in fields[("mrope_section", OK)]
    from hyla.models.vision_loader import TOWERS

    vision = [g.target for g in report.fields if g.name == "vision_config" and g.status == OK]
    assert any(TOWERS["qwen3_5"][0].__name__ in t for t in vision) and IMAGES_IN_ENGINE in vision
    # transformers builds Qwen3_5ForCausalLM (text only): the tower shows as the config field
    assert [g for g in report.modules + report.fields if g.status == MISSING] == []


def test_qwen3_5_moe_maps_every_module_and_the_vision_tower(tmp_path):
    from hyla.models.vision_loader import TOWERS

    layers = ["linear_attention"] * 3 + ["full_attention"]
    text = dict(SMALL, layer_types=layers, num_experts=8)
    report = gap_report(_from_transformers(tmp_path, "qwen3_5_moe", text))
    _assert_rows_true(report)
    targets = _targets(report)
    # classes of transformers' modeling_qwen3_5_moe.py and the hyla module each needs
    for cls, hyla_name in (("Qwen3_5MoeGatedDeltaNet", "GatedDeltaNet"),
                           ("Qwen3_5MoeAttention", "GQAttention"),
                           ("Qwen3_5MoeSparseMoeBlock", "MoE"),
                           ("Qwen3_5MoeTopKRouter", "Router")):  # fmt: skip
        assert hyla_name in targets[cls], (cls, targets[cls])
    vision = [g.target for g in report.fields if g.name == "vision_config" and g.status == OK]
    assert any(TOWERS["qwen3_5_moe"][0].__name__ in t for t in vision)
    assert [g for g in report.modules + report.fields if g.status == MISSING] == []


def test_glm_moe_dsa_maps_shared_indexer_layers(tmp_path):
    from tests.glm_moe_dsa_tiny import tiny_config

    report = gap_report(_write(tmp_path, tiny_config().to_dict()))
    _assert_rows_true(report)
    targets = _targets(report)
    assert "DSAttention" in targets["GlmMoeDsaAttention"]
    assert "LightningIndexer" in targets["GlmMoeDsaIndexer"]
    assert "sparse_attention.DSAttention" in _fields(report)[("indexer_types", OK)]
    assert report.num_missing == 0


def test_deepseek_v4_maps_every_module_to_hyla(tmp_path):
    report = gap_report(_from_transformers(tmp_path, "deepseek_v4"))
    _assert_rows_true(report)
    targets = _targets(report)
    # classes of transformers' modeling_deepseek_v4.py and the hyla module/op each needs
    for cls, hyla_name in (
        ("DeepseekV4Attention", "DeepseekV4Attention"),
        ("DeepseekV4CSACompressor", "Compressor"), ("DeepseekV4HCACompressor", "Compressor"),
        ("DeepseekV4Indexer", "compressed_indexer_topk"), ("DeepseekV4HashRouter", "route_hash"),
        ("SqrtSoftplusActivation", "route_sqrt_softplus"),
        ("DeepseekV4GroupedLinear", "grouped_linear"), ("DeepseekV4HyperHead", "HyperHead"),
        ("DeepseekV4UnweightedRMSNorm", "rms_norm_unweighted"),
        ("DeepseekV4Experts", "moe_experts_clamped"),
    ):  # fmt: skip
        assert hyla_name in targets[cls], (cls, targets[cls])
    fields = {g.name: g.status for g in report.fields}
    for name in ("scoring_func", "sliding_window", "compress_rates", "o_lora_rank"):
        assert fields[name] == OK, name
    assert report.num_missing == 0


def test_a_sliding_window_elsewhere_stays_missing(tmp_path):
    """gpt-oss's sliding-window attention is not DeepSeek-V4's: its rows stay missing."""
    report = gap_report(_from_transformers(tmp_path, "gpt_oss"))
    assert _status(report, "Attention")["GptOssAttention"] == MISSING
    assert ("sliding_window", MISSING) in _fields(report)


def _supported_configs() -> dict[str, dict]:
    from tests.deepseek_v4_tiny import tiny_config as tiny_deepseek_v4_config
    from tests.glm_moe_dsa_tiny import tiny_config as tiny_glm_moe_dsa_config
    from tests.glm_tiny import tiny_glm_text_config
    from tests.qwen35_moe_tiny import tiny_text_config as tiny_qwen35_moe_text
    from tests.server.conftest import tiny_model_config

    configs = {f: tiny_hf_config(f).to_dict() for f in FAMILIES}
    configs["glm5_next"] = dict(tiny_glm_text_config(), model_type="glm5_next_text")
    configs["qwen3_5"] = {"model_type": "qwen3_5_text", "layer_types": ["linear_attention",
                          "full_attention"], **SMALL, "num_hidden_layers": 2}  # fmt: skip
    configs["qwen3_5_moe"] = dict(tiny_qwen35_moe_text(), model_type="qwen3_5_moe_text")
    configs["glm_moe_dsa"] = tiny_glm_moe_dsa_config().to_dict()
    configs["deepseek_v4"] = tiny_deepseek_v4_config().to_dict()
    configs["hyla"] = tiny_model_config(256).to_dict()
    return configs


@pytest.mark.parametrize(
    "family",
    [*FAMILIES, "glm5_next", "qwen3_5", "qwen3_5_moe", "glm_moe_dsa", "deepseek_v4", "hyla"],
)
def test_supported_families_have_no_gaps(tmp_path, family):
    from hyla.models.registry import family_of

    config = _supported_configs()[family]
    assert family_of(config) == family  # the oracle: hyla's registry serves this config
    report = gap_report(_write(tmp_path, config))
    _assert_rows_true(report)
    assert report.num_missing == 0, report
    assert bool(report.modules) == (family != "hyla"), report


def test_unknown_model_type_reports_fields_only(tmp_path):
    path = _write(tmp_path, {"model_type": "not_a_model", "hidden_act": "gelu",
                             "sliding_window": 64})  # fmt: skip
    report = gap_report(path)
    assert report.modules == () and "config fields only" in report.built_with
    assert set(_fields(report)) == {("hidden_act", MISSING), ("sliding_window", MISSING)}


def test_cli_inspect_gaps(tmp_path):
    path = _from_transformers(tmp_path, "gpt_oss")
    result = CliRunner().invoke(app, ["inspect", path, "--gaps"])
    assert result.exit_code == 0, result.output
    assert "missing  GptOssAttention" in result.output
    missing = CliRunner().invoke(app, ["inspect", str(tmp_path / "nope"), "--gaps"])
    assert missing.exit_code == 2 and "no config.json" in missing.output


def test_cli_inspect_of_an_unsupported_config_points_to_gaps(tmp_path):
    path = _from_transformers(tmp_path, "gpt_oss")
    result = CliRunner().invoke(app, ["inspect", path])
    assert result.exit_code == 2 and "hyla inspect --gaps" in result.output
