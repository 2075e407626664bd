"""`inspect_model` on full-size published configs (no weights allocated) and tiny checkpoints;
parameter counts checked against the transformers models built on the meta device."""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from hyla.models.inspect import compact_pattern, format_report, inspect_model
from hyla.models.loader import load_config
from tests.hf_tiny import FAMILIES, save_tiny_hf_model, tiny_hf_config

_FULL = [4, 8, 12, 16, 20, 24, 27]
# moonshotai/Kimi-Linear-48B-A3B-Instruct config.json (release field names)
KIMI_48B = {
    "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear",
    "vocab_size": 163840, "hidden_size": 2304, "intermediate_size": 9216,
    "moe_intermediate_size": 1024, "num_hidden_layers": 27, "num_attention_heads": 32,
    "num_key_value_heads": 32, "kv_lora_rank": 512, "q_lora_rank": None,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "mla_use_nope": True,
    "hidden_act": "silu", "rms_norm_eps": 1e-5, "model_max_length": 1048576,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 163584,
    "eos_token_id": 163586, "pad_token_id": 163839, "num_experts": 256,
    "num_experts_per_token": 8, "num_shared_experts": 1, "moe_renormalize": True,
    "moe_router_activation_func": "sigmoid", "routed_scaling_factor": 2.446,
    "num_expert_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "linear_attn_config": {
        "full_attn_layers": _FULL, "kda_layers": [i for i in range(1, 28) if i not in _FULL],
        "head_dim": 128, "num_heads": 32, "short_conv_kernel_size": 4,
    },
}  # fmt: skip
# deepseek-ai/DeepSeek-V3.2-Exp config.json
DEEPSEEK_V32 = {
    "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
    "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_nextn_predict_layers": 1,
    "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1,
    "n_routed_experts": 256, "routed_scaling_factor": 2.5, "kv_lora_rank": 512,
    "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
    "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
    "moe_layer_freq": 1, "first_k_dense_replace": 3, "norm_topk_prob": True,
    "scoring_func": "sigmoid", "hidden_act": "silu", "max_position_embeddings": 163840,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "rope_theta": 10000,
    "rope_scaling": {
        "beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096, "type": "yarn",
    },
    "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 64,
    "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16",
    "quantization_config": {
        "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
        "weight_block_size": [128, 128],
    },
}  # fmt: skip
# Qwen/Qwen3-Next-80B-A3B-Instruct config.json
QWEN3_NEXT_80B = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
    "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5120,
    "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2,
    "head_dim": 256, "hidden_act": "silu", "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-6, "rope_theta": 10000000, "partial_rotary_factor": 0.25,
    "rope_scaling": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "bos_token_id": 151643, "eos_token_id": 151645, "full_attention_interval": 4,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
    "num_experts": 512, "num_experts_per_tok": 10, "norm_topk_prob": True,
}  # fmt: skip


def _hf_meta_params(config: dict) -> tuple[int, int]:
    """(total, routed-expert) parameter counts of the transformers model, on the meta device."""
    hf_config = AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    return total, experts


def _write(tmp_path: Path, config: dict) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize(
    ("config", "total_b", "active_b"),
    [(KIMI_48B, (48, 50), (2.5, 4)), (DEEPSEEK_V32, (670, 673), (36, 40)),
     (QWEN3_NEXT_80B, (79, 81), (3, 4.5))],
    ids=["kimi_linear_48b", "deepseek_v32", "qwen3_next_80b"],
)  # fmt: skip
def test_full_size_config_inspects_fast_without_weights(tmp_path, config, total_b, active_b):
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    report = inspect_model(_write(tmp_path, config))
    elapsed = time.perf_counter() - start
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    assert elapsed < 20 and grown_mib < 512  # bf16 weights would be 90 GiB .. 1.3 TiB
    assert total_b[0] <= report.num_params / 1e9 <= total_b[1]
    assert active_b[0] <= report.num_active_params / 1e9 <= active_b[1]
    total, experts = _hf_meta_params(config)
    moe = report.config.moe
    assert report.num_params == total
    expected_active = total - experts + experts * moe.num_experts_per_tok // moe.num_experts
    assert abs(report.num_active_params - expected_active) <= report.config.num_layers
    assert report.weight_bytes == 2 * total and report.cache_dtype == "bfloat16"
    text = format_report(report)
    assert report.layer_pattern in text and "active per token" in text


def test_full_size_cache_costs_by_hand(tmp_path) -> None:
    kimi = inspect_model(_write(tmp_path, KIMI_48B))
    assert kimi.layer_pattern == "[kda, kda, kda, mla] x 6, kda, kda, mla"
    assert kimi.ffn_pattern == "dense, [moe] x 26"
    assert dict(kimi.layer_counts) == {"kda": 20, "mla": 7}
    assert kimi.cache_bytes_per_token == 7 * (512 + 64) * 2  # NoPE MLA latent still 576 wide
    recurrent = 32 * 128 * 128 * 4  # [HV, K, V] float32
    conv = 3 * 32 * 128 * 3 * 2  # [q|k|v channels, W - 1] bfloat16
    assert kimi.state_bytes_per_seq == 20 * (recurrent + conv)
    assert kimi.config.max_context_len == 1048576

    ds = inspect_model(_write(tmp_path, DEEPSEEK_V32))
    assert ds.layer_pattern == "[dsa] x 61" and ds.ffn_pattern == "[dense] x 3, [moe] x 58"
    assert ds.cache_bytes_per_token == 61 * (512 + 64 + 128) * 2  # latent + indexer key
    assert ds.state_bytes_per_seq == 0

    qwen = inspect_model(_write(tmp_path, QWEN3_NEXT_80B))
    assert qwen.layer_pattern == "[gdn, gdn, gdn, gqa] x 12"
    assert qwen.cache_bytes_per_token == 12 * 2 * 2 * 256 * 2  # k and v, 2 kv heads
    gdn_conv = (2 * 16 * 128 + 32 * 128) * 3 * 2
    assert qwen.state_bytes_per_seq == 36 * (32 * 128 * 128 * 4 + gdn_conv)


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_checkpoint_and_hyla_config(tmp_path, family: str) -> None:
    hf = save_tiny_hf_model(family, tmp_path / "ckpt")
    report = inspect_model(tmp_path / "ckpt")
    assert report.num_params == sum(p.numel() for p in hf.parameters())
    assert report.checkpoint_files == 1 and report.checkpoint_bytes > 4 * report.num_params
    assert report.config.architecture == family

    total, experts = _hf_meta_params(tiny_hf_config(family).to_dict())
    assert report.num_params == total

    native = tmp_path / "hyla.json"  # hyla's layout; `architecture` still names the adapter
    native.write_text(json.dumps(load_config(tmp_path / "ckpt").to_dict()))
    again = inspect_model(native)
    assert again.config == report.config
    assert (again.num_params, again.num_active_params) == (total, report.num_active_params)
    assert again.checkpoint_files == 0 and "checkpoint: none" in format_report(again)


def test_compact_pattern() -> None:
    assert compact_pattern(["kda", "kda", "kda", "mla"] * 8) == "[kda, kda, kda, mla] x 8"
    assert compact_pattern(["mla" if i and i % 4 == 0 else "kda" for i in range(27)]) == (
        "kda, [kda, kda, kda, mla] x 6, kda, kda"
    )
    assert compact_pattern(["dense", "moe"]) == "dense, moe"
    assert compact_pattern(["a", "a", "b", "a", "a", "b", "c"]) == "[a, a, b] x 2, c"
