"""HF config.json -> ModelConfig for each family, checked against the transformers config classes
(which parse the same dict), plus tensor-name mapping and every ConfigError path."""

from __future__ import annotations

import pytest
from transformers import DeepseekV32Config, KimiLinearConfig, Qwen3NextConfig

from hyla.config import ConfigError, ModelConfig
from hyla.models import deepseek_v32, kimi_linear, qwen3_next
from hyla.models.registry import config_from_hf
from tests.hf_tiny import tiny_hf_config

LINEAR, FULL = "linear_attention", "full_attention"
YARN = {
    "beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 4096, "type": "yarn",
}  # fmt: skip


def _kinds(types: list[str], mapping: dict[str, str]) -> tuple[str, ...]:
    return tuple(mapping[t] for t in types)


def _check_moe(config: ModelConfig, hf, shared: int, scoring: str) -> None:
    moe = config.moe
    assert moe.num_experts == hf.num_local_experts if scoring == "sigmoid" else hf.num_experts
    assert moe.num_experts_per_tok == hf.num_experts_per_tok
    assert moe.moe_intermediate_size == hf.moe_intermediate_size
    assert moe.shared_intermediate_size == shared
    assert moe.norm_topk_prob == hf.norm_topk_prob
    assert moe.scoring == scoring


def test_kimi_linear_from_transformers_to_dict() -> None:
    hf = tiny_hf_config("kimi_linear")
    config = config_from_hf(hf.to_dict())
    assert config.architecture == "kimi_linear"
    assert config.layer_pattern == _kinds(hf.layer_types, {LINEAR: "kda", FULL: "mla"})
    assert config.ffn_pattern == _kinds(hf.mlp_layer_types, {"dense": "dense", "sparse": "moe"})
    assert (config.vocab_size, config.hidden_size) == (hf.vocab_size, hf.hidden_size)
    assert config.intermediate_size == hf.intermediate_size
    lin = config.linear
    assert (lin.num_k_heads, lin.num_v_heads) == (hf.linear_num_heads, hf.linear_num_heads)
    assert (lin.head_k_dim, lin.head_v_dim) == (hf.linear_head_dim, hf.linear_head_dim)
    assert lin.conv_kernel_size == hf.linear_conv_kernel_dim
    mla = config.mla
    assert (mla.num_heads, mla.kv_lora_rank, mla.q_lora_rank) == (4, 32, None)
    assert (mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim) == (16, 8, 16)
    assert mla.use_rope is False and config.rope is None  # Kimi's MLA is NoPE
    _check_moe(config, hf, hf.moe_intermediate_size * hf.n_shared_experts, "sigmoid")
    assert (config.moe.n_group, config.moe.topk_group) == (hf.n_group, hf.topk_group)
    assert config.moe.routed_scaling_factor == hf.routed_scaling_factor
    assert config.moe.has_correction_bias and not config.moe.shared_expert_gate
    assert config.rms_norm_eps == hf.rms_norm_eps and config.norm_offset == 0.0
    assert config.eos_token_ids == (2,) and config.max_context_len == 4096


def test_kimi_linear_release_field_names_match_transformers() -> None:
    full = [4, 8, 12, 16, 20, 24, 27]
    release = {
        "model_type": "kimi_linear", "vocab_size": 1000, "hidden_size": 64,
        "intermediate_size": 96, "num_hidden_layers": 27, "num_attention_heads": 4,
        "num_experts": 16, "num_experts_per_token": 4, "num_expert_group": 4, "topk_group": 2,
        "moe_renormalize": False, "num_shared_experts": 2, "moe_intermediate_size": 8,
        "model_max_length": 65536, "first_k_dense_replace": 2, "mla_use_nope": True,
        "linear_attn_config": {
            "full_attn_layers": full, "kda_layers": [i for i in range(1, 28) if i not in full],
            "head_dim": 16, "num_heads": 2, "short_conv_kernel_size": 3,
        },
        "torch_dtype": "bfloat16", "eos_token_id": [5, 6],
    }  # fmt: skip
    ours = config_from_hf(release)
    hf = KimiLinearConfig(**release)
    assert ours == config_from_hf(hf.to_dict())
    assert ours.layer_pattern == _kinds(hf.layer_types, {LINEAR: "kda", FULL: "mla"})
    assert ours.layer_pattern[3] == "mla" and ours.layer_pattern[26] == "mla"
    assert ours.ffn_pattern == ("dense", "dense") + ("moe",) * 25
    assert (ours.moe.num_experts, ours.moe.num_experts_per_tok) == (16, 4)
    assert (ours.moe.n_group, ours.moe.norm_topk_prob) == (4, False)
    assert ours.moe.shared_intermediate_size == 16
    assert (ours.linear.num_v_heads, ours.linear.head_k_dim, ours.linear.conv_kernel_size) == (
        2, 16, 3,
    )  # fmt: skip
    assert ours.max_context_len == 65536 and ours.dtype == "bfloat16"
    assert ours.eos_token_ids == (5, 6)


def test_deepseek_v32_from_transformers_to_dict() -> None:
    hf = tiny_hf_config("deepseek_v32")
    config = config_from_hf(hf.to_dict())
    assert config.layer_pattern == ("dsa",) * hf.num_hidden_layers
    assert config.ffn_pattern == _kinds(hf.mlp_layer_types, {"dense": "dense", "sparse": "moe"})
    assert config.mla.q_lora_rank == hf.q_lora_rank and config.mla.use_rope
    assert config.dsa.index_topk == hf.index_topk
    assert (config.dsa.index_n_heads, config.dsa.index_head_dim) == (16, 16)  # tests/hf_tiny.py
    assert config.rope.rotary_dim == hf.qk_rope_head_dim and config.rope.style == "interleave"
    assert config.rope.theta == hf.rope_parameters["rope_theta"]
    _check_moe(config, hf, hf.moe_intermediate_size * hf.n_shared_experts, "sigmoid")
    assert config.moe.has_correction_bias


def test_deepseek_v32_release_config_yarn_and_fp8() -> None:
    release = {
        "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
        "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 5,
        "num_attention_heads": 4, "first_k_dense_replace": 3, "moe_layer_freq": 1,
        "rope_scaling": YARN, "rope_theta": 10000, "max_position_embeddings": 163840,
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
        "num_nextn_predict_layers": 1, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
    }  # fmt: skip
    ours = config_from_hf(release)
    hf = DeepseekV32Config(**release)
    assert ours.ffn_pattern == _kinds(hf.mlp_layer_types, {"dense": "dense", "sparse": "moe"})
    assert ours.rope.scaling_type == hf.rope_parameters["rope_type"] == "yarn"
    scaling = ours.rope.scaling_dict()
    for key in ("factor", "original_max_position_embeddings", "mscale", "mscale_all_dim"):
        assert scaling[key] == hf.rope_parameters[key]
    assert ours.rope.theta == 10000 and ours.max_context_len == 163840
    assert ours.extra_dict()["quantization"] == "fp8"
    assert ours == config_from_hf(hf.to_dict()).replace(extra=ours.extra)


@pytest.mark.parametrize("name", ["indexed_attention", "deepseek_sparse_attention"])
def test_deepseek_v32_layer_type_names_of_transformers_releases(name) -> None:
    d = tiny_hf_config("deepseek_v32").to_dict()
    d["layer_types"] = [name] * d["num_hidden_layers"]
    assert set(config_from_hf(d).layer_pattern) == {"dsa"}
    d["layer_types"][1] = "full_attention"
    with pytest.raises(ConfigError, match=r"layer_types\[1\]"):
        config_from_hf(d)


def test_qwen3_next_from_transformers_to_dict() -> None:
    hf = tiny_hf_config("qwen3_next", mlp_only_layers=[1])
    config = config_from_hf(hf.to_dict())
    assert config.layer_pattern == _kinds(hf.layer_types, {LINEAR: "gdn", FULL: "gqa"})
    assert config.ffn_pattern == ("moe", "dense", "moe", "moe")
    assert config.norm_offset == 1.0
    gqa = config.gqa
    assert (gqa.num_heads, gqa.num_kv_heads, gqa.head_dim) == (4, 2, 16)
    assert gqa.qk_norm and gqa.output_gate and not gqa.bias
    assert config.rope.rotary_dim == 4 and config.rope.style == "neox"  # 16 * 0.25
    lin = config.linear
    assert (lin.num_k_heads, lin.num_v_heads, lin.head_k_dim, lin.head_v_dim) == (2, 4, 16, 16)
    _check_moe(config, hf, hf.shared_expert_intermediate_size, "softmax")
    assert config.moe.shared_expert_gate and not config.moe.has_correction_bias


def test_qwen3_next_release_config_top_level_rope_fields() -> None:
    release = {
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
        "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 8,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "rope_theta": 10000000, "partial_rotary_factor": 0.25, "rope_scaling": None,
        "full_attention_interval": 4, "decoder_sparse_step": 2, "num_experts": 8,
        "num_experts_per_tok": 2,
        "max_position_embeddings": 262144, "tie_word_embeddings": True,
    }  # fmt: skip
    ours = config_from_hf(release)
    hf = Qwen3NextConfig(**release)
    assert ours == config_from_hf(hf.to_dict())
    assert ours.layer_pattern == _kinds(hf.layer_types, {LINEAR: "gdn", FULL: "gqa"})
    assert ours.ffn_pattern == ("dense", "moe") * 4  # (i + 1) % decoder_sparse_step == 0
    assert ours.rope.theta == 1e7 and ours.rope.rotary_dim == 8
    assert ours.tie_word_embeddings and ours.max_context_len == 262144


def test_architectures_fallback_and_hyla_native_round_trip() -> None:
    d = tiny_hf_config("qwen3_next").to_dict()
    del d["model_type"]
    d["architectures"] = ["Qwen3NextForCausalLM"]
    config = config_from_hf(d)
    assert config.architecture == "qwen3_next"
    native = config.replace(architecture="hyla")
    assert config_from_hf(native.to_dict()) == native


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}, "model_type"),
        ({"hidden_size": None}, "hidden_size"),
        ({"hidden_size": "64"}, "hidden_size"),
        ({"num_hidden_layers": 0}, "num_hidden_layers"),
        ({"layer_types": [LINEAR] * 3}, "layer_types"),
        ({"layer_types": [LINEAR, "sliding", LINEAR, FULL]}, r"layer_types\[1\]"),
        ({"mlp_layer_types": ["dense", "moe", "sparse", "sparse"]}, r"mlp_layer_types\[1\]"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"num_experts_per_token": 9}, "moe.num_experts_per_tok"),
        ({"num_experts_per_tok": 3}, "num_experts_per_token"),  # alias with another value
        ({"eos_token_id": "x"}, "eos_token_id"),
        ({"dtype": "int8"}, "dtype"),
        ({"linear_attn_config": {"head_dim": -1}}, "head_dim"),
    ],
)
def test_bad_kimi_config_names_the_field(change: dict, field: str) -> None:
    d = {**tiny_hf_config("kimi_linear").to_dict(), **change}
    if change.get("hidden_size", 1) is None:
        del d["hidden_size"]
    with pytest.raises(ConfigError, match=rf"^{field}:"):
        config_from_hf(d)


def test_bad_kimi_layer_lists_name_the_field() -> None:
    d = tiny_hf_config("kimi_linear").to_dict()
    del d["layer_types"]
    d["linear_attn_config"] = {"full_attn_layers": [3], "kda_layers": [1, 2, 9]}
    with pytest.raises(ConfigError, match=r"^linear_attn_config\.kda_layers"):
        config_from_hf(d)
    d["linear_attn_config"] = {"full_attn_layers": [3], "kda_layers": [1, 2]}
    with pytest.raises(ConfigError, match=r"^linear_attn_config: layer 4"):
        config_from_hf(d)


def test_bad_configs_of_other_families_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"^scoring_func"):
        config_from_hf({**tiny_hf_config("deepseek_v32").to_dict(), "scoring_func": "softmax"})
    with pytest.raises(ConfigError, match=r"^rope_parameters"):
        config_from_hf({**tiny_hf_config("qwen3_next").to_dict(), "rope_parameters": [1]})
    with pytest.raises(ConfigError, match=r"^mlp_only_layers"):
        config_from_hf({**tiny_hf_config("qwen3_next").to_dict(), "mlp_only_layers": 3})
    with pytest.raises(ConfigError, match=r"^config"):
        config_from_hf(["not", "a", "dict"])
    with pytest.raises(ConfigError, match=r"^model_type"):
        config_from_hf({"hidden_size": 8})


def test_tensor_names() -> None:
    k = kimi_linear.hf_to_hyla_name
    assert k("model.layers.0.self_attn.q_proj.weight") == "layers.0.mixer.q_proj.weight"
    assert k("model.layers.0.self_attn.forget_gate.A_log") == "layers.0.mixer.A_log"
    assert k("model.layers.0.self_attn.A_log") == "layers.0.mixer.A_log"
    assert k("model.layers.1.block_sparse_moe.experts.7.w3.weight") == (
        "layers.1.mlp.experts.gate_up_proj"
    )
    assert k("model.layers.1.block_sparse_moe.gate.e_score_correction_bias") == (
        "layers.1.mlp.gate.e_score_correction_bias"
    )
    assert k("model.layers.1.mlp.experts.down_proj") == "layers.1.mlp.experts.down_proj"
    assert k("model.embed_tokens.weight") == "embed_tokens.weight"
    assert k("lm_head.weight") == "lm_head.weight"
    convs = kimi_linear.hf_placement("model.layers.2.self_attn.conv1d.weight")
    assert [p.target for p in convs] == [f"layers.2.mixer.{c}_conv1d.weight" for c in "qkv"]
    (up,) = kimi_linear.hf_placement("model.layers.1.block_sparse_moe.experts.7.w3.weight")
    assert (up.expert, up.part, up.num_parts) == (7, 1, 2)

    d = deepseek_v32.hf_to_hyla_name
    config = config_from_hf(tiny_hf_config("deepseek_v32").to_dict())
    assert d("model.layers.3.self_attn.indexer.wq_b.weight") == "layers.3.mixer.indexer.wq_b.weight"
    assert d("model.layers.4.self_attn.q_a_proj.weight", config) is None  # MTP layer
    assert d("model.layers.0.self_attn.rotary_emb.inv_freq") is None
    (gate,) = deepseek_v32.hf_placement("model.layers.2.mlp.experts.3.gate_proj.weight")
    assert (gate.target, gate.expert, gate.part) == ("layers.2.mlp.experts.gate_up_proj", 3, 0)

    q = qwen3_next.hf_to_hyla_name
    assert q("model.layers.0.linear_attn.in_proj_qkvz.weight") == (
        "layers.0.mixer.in_proj_qkvz.weight"
    )
    assert q("model.layers.3.self_attn.q_norm.weight") == "layers.3.mixer.q_norm.weight"
    assert q("model.layers.0.mlp.shared_expert.up_proj.weight") == (
        "layers.0.mlp.shared_experts.up_proj.weight"
    )
    assert q("model.layers.0.mlp.shared_expert_gate.weight") == (
        "layers.0.mlp.shared_expert_gate.weight"
    )
    assert q("mtp.layers.0.mlp.gate.weight") is None


def _native() -> dict:
    """A valid hyla-layout config dict (seed pattern, DSA, sigmoid grouped MoE)."""
    return {
        "model_type": "hyla", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
        "layer_pattern": ["kda", "kda", "dsa", "kda"] * 2, "ffn_pattern": ["dense"] + ["moe"] * 7,
        "rope": {"theta": 10000.0, "rotary_dim": 8, "style": "interleave"},
        "linear": {"num_k_heads": 2, "num_v_heads": 2, "head_k_dim": 8, "head_v_dim": 8},
        "mla": {"num_heads": 2, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8,
                "v_head_dim": 8, "q_lora_rank": 12},
        "dsa": {"index_n_heads": 4, "index_head_dim": 8, "index_topk": 8},
        "moe": {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
                "num_shared_experts": 1, "scoring": "sigmoid", "n_group": 4, "topk_group": 2,
                "has_correction_bias": True},
    }  # fmt: skip


def test_native_config_round_trip() -> None:
    config = config_from_hf(_native())
    assert config.layer_pattern == ("kda", "kda", "dsa", "kda") * 2
    assert config_from_hf(config.to_dict()) == config


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("layer_pattern",), ["kda", "kda", "lstm", "kda"] * 2, r"layer_pattern\[2\]"),
        (("layer_pattern",), "kda", "layer_pattern"),
        (("layer_pattern",), [], "layer_pattern"),
        (("ffn_pattern",), ["dense"] * 7, "ffn_pattern"),
        (("ffn_pattern",), ["dense", "sparse"] + ["moe"] * 6, r"ffn_pattern\[1\]"),
        (("linear", "num_v_heads"), 3, "linear.num_v_heads"),
        (("hidden_size",), None, "hidden_size"),
        (("hidden_size",), "32", "hidden_size"),
        (("hidden_size",), 32.0, "hidden_size"),
        (("vocab_size",), True, "vocab_size"),
        (("rms_norm_eps",), "1e-6", "rms_norm_eps"),
        (("rms_norm_eps",), 0.0, "rms_norm_eps"),
        (("tie_word_embeddings",), "yes", "tie_word_embeddings"),
        (("eos_token_ids",), [1, "2"], r"eos_token_ids\[1\]"),
        (("extra",), [1, 2], "extra"),
        (("architecture",), "llama", "architecture"),
        (("bogus",), 1, "bogus"),
        (("linear",), None, "linear"),
        (("dsa",), None, "dsa"),
        (("rope",), None, "rope"),
        (("rope", "theta"), "1e4", "rope.theta"),
        (("rope", "rotary_dim"), 6, "rope.rotary_dim"),
        (("rope", "scaling_type"), "dynamic", "rope.scaling_type"),
        (("rope", "scaling_type"), "yarn", r"rope.scaling.factor"),
        (("mla", "q_lora_rank"), None, "mla.q_lora_rank"),
        (("mla", "use_rope"), "no", "mla.use_rope"),
        (("mla", "extra_dim"), 4, "mla.extra_dim"),
        (("moe", "scoring"), "tanh", "moe.scoring"),
        (("moe", "n_group"), 3, "moe.n_group"),
        (("moe", "topk_group"), 5, "moe.topk_group"),
        (("moe", "num_experts_per_tok"), 9, "moe.num_experts_per_tok"),
        (("moe", "num_shared_experts"), -1, "moe.num_shared_experts"),
        (("moe", "routed_scaling_factor"), "2", "moe.routed_scaling_factor"),
        (("moe", "norm_topk_prob"), "yes", "moe.norm_topk_prob"),
        (("moe",), [1], "moe"),
    ],
)
def test_bad_native_config_names_the_field(path: tuple[str, ...], value, field: str) -> None:
    d = _native()
    parent = d
    for key in path[:-1]:
        parent = parent[key]
    if value is None and path[-1] == "hidden_size":
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    with pytest.raises(ConfigError, match=rf"^{field}"):
        config_from_hf(d)


@pytest.mark.parametrize(
    ("family", "change", "field"),
    [
        ("deepseek_v32", {"q_lora_rank": None}, "q_lora_rank"),  # DSA needs q_a (no default)
        ("deepseek_v32", {"rope_parameters": {"rope_type": "llama3", "factor": 8.0}},
         "rope.scaling_type"),
        ("deepseek_v32", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}},
         r"rope.scaling.factor"),
        ("qwen3_next", {"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 2.0}},
         r"rope.rotary_dim: 32 > gqa.head_dim=16"),
        ("qwen3_next", {"linear_num_value_heads": 3}, "linear.num_v_heads"),
        ("kimi_linear", {"linear_attn_config": {"head_dim": 16, "num_heads": "4"}}, "num_heads"),
        ("kimi_linear", {"mla_use_nope": False}, "mla_use_nope"),  # no reference rotates
    ],
)  # fmt: skip
def test_bad_hf_config_fails_at_parse_time_naming_the_field(family, change, field) -> None:
    """Errors that used to surface only when building or running the model (ValueError from
    the layers / rope ops) are ConfigErrors at parse time."""
    with pytest.raises(ConfigError, match=rf"^{field}"):
        config_from_hf({**tiny_hf_config(family).to_dict(), **change})
