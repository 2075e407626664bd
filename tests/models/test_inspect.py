"""`inspect_model` on full-size published configs (no weights allocated) and tiny checkpoints;
parameter counts checked against the transformers models built on the meta device."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
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
    assert report.cache_dtype == "bfloat16"
    if "quantization_config" in config:  # fp8 weights + float32 block scales + bf16 rest
        assert total <= report.weight_bytes <= 1.02 * total
    else:
        assert report.weight_bytes == 2 * total
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


# -- `hyla inspect PATH` through the real CLI --------------------------------------------------

_ROOT = Path(__file__).resolve().parents[2]
_RSS_PROBE = """
import resource, runpy, sys
sys.argv = ["hyla", "inspect", sys.argv[1], "--dtype", "bfloat16"]  # the figures: bf16
try:
    runpy.run_module("hyla.cli", run_name="__main__")  # exactly `python -m hyla.cli inspect P`
except SystemExit as e:
    assert not e.code, e.code
print("MAXRSS_KIB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _cli(*args: str):
    from typer.testing import CliRunner

    from hyla.cli import app

    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


def _kib(n: int) -> str:
    return f"{n / 1024:.2f} KiB"


@pytest.mark.parametrize(
    ("config", "pattern", "kv_per_token", "state_per_seq"),
    [
        (KIMI_48B, "27: [kda, kda, kda, mla] x 6, kda, kda, mla", "7.88 KiB", "41.41 MiB"),
        (DEEPSEEK_V32, "61: [dsa] x 61", "83.88 KiB", "0 B"),
    ],
    ids=["kimi_linear_48b", "deepseek_v32"],
)
def test_cli_inspect_full_size_in_a_process_without_weights(
    tmp_path, config, pattern, kv_per_token, state_per_seq
) -> None:
    """`python -m hyla.cli inspect` on a full-size config.json: whole-process peak RSS stays
    under 2 GiB (the bf16 weights are 91 GiB / 1.25 TiB; the interpreter with torch and
    transformers imported measured 1.05-1.24 GiB on a 2-core CI machine). Expected cache sizes
    by hand for a bf16 cache: Kimi 7 MLA layers * 576 * 2 B; DeepSeek 61 * (576 + 128) * 2 B."""
    path = _write(tmp_path, config)
    proc = subprocess.run(
        [sys.executable, "-c", _RSS_PROBE, str(path)],
        cwd=_ROOT,
        env={**os.environ, "PYTHONPATH": str(_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    peak_mib = int(proc.stdout.rsplit("MAXRSS_KIB", 1)[1]) / 1024
    assert peak_mib < 2048, f"peak RSS {peak_mib:.0f} MiB"
    assert f"layers        {pattern}" in proc.stdout
    assert f"kv cache      {kv_per_token} per token" in proc.stdout
    assert f"linear state  {state_per_seq} per sequence" in proc.stdout
    assert "checkpoint: none" in proc.stdout


# Tiny checkpoints (tests/hf_tiny.py, fp32): expected lines worked out by hand.
#   kimi: 1 MLA layer, latent 32 + 8 -> 160 B/token; 3 KDA layers of recurrent [4, 16, 16] f32
#         (4096 B) + conv [3 * 64, 3] f32 (2304 B)
#   deepseek: 4 DSA layers, latent 40 + index key 16 -> 4 * 56 * 4 B/token
#   qwen: 1 GQA layer, k + v of [2, 16] -> 256 B/token; 3 GDN layers of recurrent [4, 16, 16]
#         f32 (4096 B) + conv [2 * 32 + 64, 3] f32 (1536 B)
_TINY = {
    "kimi_linear": ("4: kda, kda, mla, kda", "160 B", _kib(3 * (4096 + 2304))),
    "deepseek_v32": ("4: [dsa] x 4", "896 B", "0 B"),
    "qwen3_next": ("4: [gdn] x 3, gqa", "256 B", _kib(3 * (4096 + 1536))),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_cli_inspect_tiny_checkpoint_and_hyla_config(tmp_path, family: str) -> None:
    hf = save_tiny_hf_model(family, tmp_path / "ckpt")
    pattern, kv_per_token, state_per_seq = _TINY[family]
    native = tmp_path / "hyla.json"
    native.write_text(json.dumps(load_config(tmp_path / "ckpt").to_dict()))
    for target in (tmp_path / "ckpt", tmp_path / "ckpt" / "config.json", native):
        result = _cli("inspect", str(target))
        assert result.exit_code == 0, result.output
        out = result.output
        assert out.startswith(f"model         {family}  (")
        assert f"layers        {pattern}" in out
        assert f"kv cache      {kv_per_token} per token (float32" in out
        assert f"linear state  {state_per_seq} per sequence" in out
        total = sum(p.numel() for p in hf.parameters())
        assert f"parameters    {total / 1e3:.2f} K total" in out
        has_weights = target == tmp_path / "ckpt"
        assert ("checkpoint: 1 safetensors file," in out) == has_weights


def test_cli_inspect_errors_name_the_problem(tmp_path) -> None:
    result = _cli("inspect", str(tmp_path / "absent"))
    assert result.exit_code != 0 and "no config.json" in result.output
    bad = {**tiny_hf_config("qwen3_next").to_dict(), "linear_num_value_heads": 3}
    result = _cli("inspect", str(_write(tmp_path, bad)))
    assert result.exit_code != 0 and "linear.num_v_heads" in result.output
    unknown = {"model_type": "mamba", "architectures": ["MambaForCausalLM"]}
    result = _cli("inspect", str(_write(tmp_path, unknown)))
    assert result.exit_code != 0 and "model_type: unsupported architecture 'mamba'" in result.output
