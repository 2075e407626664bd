"""MoE and GatedMLP layers vs the transformers modules of each family, with identical weights."""

from __future__ import annotations

import pytest
import torch
from transformers import DeepseekV32Config, KimiLinearConfig, Qwen3NextConfig
from transformers.models.deepseek_v32.modeling_deepseek_v32 import DeepseekV32MLP, DeepseekV32MoE
from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearMLP, KimiLinearMoE
from transformers.models.qwen3_next.modeling_qwen3_next import (
    Qwen3NextMLP,
    Qwen3NextSparseMoeBlock,
)

from hyla.layers.mlp import GatedMLP
from hyla.layers.moe import MoE
from hyla.models.registry import config_from_hf

D = 32
COMMON = dict(vocab_size=64, hidden_size=D, intermediate_size=48, num_hidden_layers=2)
FAMILIES = {
    "kimi_linear": (
        KimiLinearConfig(
            **COMMON,
            moe_intermediate_size=16,
            num_local_experts=16,
            num_experts_per_tok=4,
            n_group=4,
            topk_group=2,
            num_attention_heads=4,
            linear_num_heads=2,
            linear_head_dim=16,
            routed_scaling_factor=2.446,
            n_shared_experts=2,
        ),
        KimiLinearMoE,
        KimiLinearMLP,
    ),
    "deepseek_v32": (
        DeepseekV32Config(
            **COMMON,
            moe_intermediate_size=16,
            n_routed_experts=16,
            num_experts_per_tok=4,
            n_group=4,
            topk_group=2,
            num_attention_heads=4,
            first_k_dense_replace=1,
            q_lora_rank=16,
            kv_lora_rank=16,
            index_n_heads=2,
            index_head_dim=16,
        ),
        DeepseekV32MoE,
        DeepseekV32MLP,
    ),
    "qwen3_next": (
        Qwen3NextConfig(
            **COMMON,
            moe_intermediate_size=16,
            num_experts=16,
            num_experts_per_tok=4,
            shared_expert_intermediate_size=24,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            mlp_only_layers=[0],
        ),
        Qwen3NextSparseMoeBlock,
        Qwen3NextMLP,
    ),
}


def _hyla_moe_state(hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # HF MoE module keys -> hyla MoE keys (only the shared-expert spelling differs)
    return {k.replace("shared_expert.", "shared_experts."): v for k, v in hf_state.items()}


def _randomize(module: torch.nn.Module, bias_scale: float = 0.1) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.2)
        for name, b in module.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(0.0, bias_scale)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_moe_matches_transformers(family: str) -> None:
    torch.manual_seed(0)
    hf_config, hf_moe_cls, _ = FAMILIES[family]
    config = config_from_hf(hf_config.to_dict())
    assert config.ffn_pattern == ("dense", "moe")
    hf_moe = hf_moe_cls(hf_config).float().eval()
    _randomize(hf_moe)
    moe = MoE(config, layer_idx=1).eval()
    moe.load_state_dict(_hyla_moe_state(hf_moe.state_dict()), strict=True)
    x = torch.randn(37, D)
    with torch.no_grad():
        expected = hf_moe(x.unsqueeze(0)).squeeze(0)
        got = moe(x)
    assert got.shape == (37, D)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_moe_bf16_matches_transformers(family: str) -> None:
    torch.manual_seed(1)
    hf_config, hf_moe_cls, _ = FAMILIES[family]
    config = config_from_hf(hf_config.to_dict())
    hf_moe = hf_moe_cls(hf_config).float().eval()
    _randomize(hf_moe)
    hf_moe = hf_moe.to(torch.bfloat16)
    moe = MoE(config, layer_idx=1).to(torch.bfloat16).eval()
    moe.load_state_dict(_hyla_moe_state(hf_moe.state_dict()), strict=True)
    if family != "qwen3_next":  # transformers keeps the correction bias in float32
        moe.gate.e_score_correction_bias.data = hf_moe.gate.e_score_correction_bias.float()
        hf_moe.gate.e_score_correction_bias.data = hf_moe.gate.e_score_correction_bias.float()
    x = torch.randn(19, D, dtype=torch.bfloat16)
    with torch.no_grad():
        expected = hf_moe(x.unsqueeze(0)).squeeze(0)
        got = moe(x)
        untied = ~_tied_at_boundary(moe, x)
    assert got.dtype == torch.bfloat16
    # bf16 logits tie often; there torch.topk's choice is unspecified and hyla takes the lowest
    # index, so only rows without a tie at the top-k boundary must match bit for bit.
    assert untied.sum() >= 15
    torch.testing.assert_close(got[untied], expected[untied], rtol=0, atol=0)


def _tied_at_boundary(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    k = moe.gate.moe.num_experts_per_tok
    if moe.gate.moe.scoring == "softmax":
        scores = torch.nn.functional.linear(x, moe.gate.weight).float()
    else:
        scores = torch.nn.functional.linear(x.float(), moe.gate.weight.float()).sigmoid()
        scores = scores + moe.gate.e_score_correction_bias
    ranked = scores.sort(dim=-1, descending=True).values
    return ranked[:, k - 1] == ranked[:, k]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_gated_mlp_matches_transformers(family: str) -> None:
    torch.manual_seed(2)
    hf_config, _, hf_mlp_cls = FAMILIES[family]
    config = config_from_hf(hf_config.to_dict())
    hf_mlp = hf_mlp_cls(hf_config).float().eval()
    _randomize(hf_mlp)
    mlp = GatedMLP(config, layer_idx=0)
    mlp.load_state_dict(hf_mlp.state_dict(), strict=True)
    x = torch.randn(11, D)
    with torch.no_grad():
        torch.testing.assert_close(mlp(x), hf_mlp(x), rtol=1e-6, atol=1e-6)


def test_moe_rows_independent_of_batch() -> None:
    """I3 at layer level: a token's output does not depend on the other tokens of the batch."""
    torch.manual_seed(3)
    hf_config = FAMILIES["deepseek_v32"][0]
    moe = MoE(config_from_hf(hf_config.to_dict()), layer_idx=1).eval()
    _randomize(moe, bias_scale=0.05)
    x = torch.randn(33, D)
    with torch.no_grad():
        full = moe(x)
        for t in (0, 5, 32):
            torch.testing.assert_close(moe(x[t : t + 1])[0], full[t], rtol=1e-6, atol=1e-6)


def test_router_fp32_weight_copy_follows_the_weight() -> None:
    """A bf16 router keeps one float32 copy of its weight for sigmoid routing: the same values
    as a cast, replaced when the weight is written (load_state_dict, in-place edits), and not
    used where autograd needs the cast itself."""
    config = config_from_hf(FAMILIES["kimi_linear"][0].to_dict())
    moe = MoE(config, layer_idx=1).to(torch.bfloat16).eval()
    _randomize(moe)
    gate = moe.gate
    with torch.no_grad():
        first = gate.weight_fp32()
        assert torch.equal(first, gate.weight.float()) and gate.weight_fp32() is first
        gate.weight.mul_(-1)  # an in-place write bumps the parameter's version
        assert torch.equal(gate.weight_fp32(), gate.weight.float())
        state = {k: torch.randn_like(v) for k, v in moe.state_dict().items()}
        moe.load_state_dict(state)
        assert torch.equal(gate.weight_fp32(), state["gate.weight"].float())
    x = torch.randn(5, D, dtype=torch.bfloat16)
    weights, _ = gate(x)  # grad enabled, weight requires grad: a differentiable cast
    weights.float().sum().backward()
    assert gate.weight.grad is not None and gate.weight.grad.abs().sum() > 0
