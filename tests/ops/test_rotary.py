"""Rotary embedding vs the transformers rotary classes and apply functions (bit-exact in fp32)."""

from __future__ import annotations

import pytest
import torch
from transformers import DeepseekV32Config, Qwen3NextConfig
from transformers.models.deepseek_v32 import modeling_deepseek_v32 as hf_ds
from transformers.models.qwen3_next import modeling_qwen3_next as hf_qn

from hyla.config import RopeConfig
from hyla.ops.rotary import apply_rope, rope_cos_sin, rope_inv_freq, rope_softmax_mscale

YARN = {
    "factor": 40.0,
    "mscale": 1.0,
    "mscale_all_dim": 0.8,
    "original_max_position_embeddings": 64,
    "beta_fast": 32,
    "beta_slow": 1,
}


def _ds_config(rope_parameters: dict) -> DeepseekV32Config:
    return DeepseekV32Config(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_rope_head_dim=16,
        qk_nope_head_dim=16,
        v_head_dim=16,
        num_hidden_layers=1,
        max_position_embeddings=2560,
        rope_parameters=rope_parameters,
    )


def _positions() -> torch.Tensor:
    return torch.tensor([0, 1, 2, 7, 63, 64, 65, 1000, 2559])


@pytest.mark.parametrize(
    "scaling_type,scaling",
    [("default", {}), ("yarn", YARN), ("yarn", {**YARN, "mscale_all_dim": 1.0})],
    ids=["default", "yarn-mscale-ratio", "yarn-deepseek"],
)
def test_cos_sin_match_deepseek_rotary(scaling_type: str, scaling: dict) -> None:
    hf_cfg = _ds_config({"rope_type": scaling_type, "rope_theta": 10000.0, **scaling})
    hf = hf_ds.DeepseekV32RotaryEmbedding(hf_cfg)
    rope = RopeConfig(10000.0, 16, "interleave", scaling_type, tuple(sorted(scaling.items())))
    inv_freq, factor = rope_inv_freq(rope)
    assert torch.equal(inv_freq, hf.inv_freq)
    assert factor == pytest.approx(hf.attention_scaling, rel=1e-15)
    pos = _positions()
    cos_hf, sin_hf = hf(torch.zeros(1, dtype=torch.float32), pos[None])
    cos, sin = rope_cos_sin(pos, inv_freq, factor)
    assert torch.equal(cos, cos_hf[0, :, :8]) and torch.equal(cos, cos_hf[0, :, 8:])
    assert torch.equal(sin, sin_hf[0, :, :8])
    hf_scale = hf_ds.yarn_apply_mscale(hf_cfg.rope_parameters, 1.0)
    assert rope_softmax_mscale(rope) == pytest.approx(hf_scale, rel=1e-15)
    if scaling_type == "yarn":
        assert rope_softmax_mscale(rope) > 1.0


def test_cos_sin_match_qwen3_next_partial_rotary() -> None:
    hf_cfg = Qwen3NextConfig(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_hidden_layers=1,
        rope_parameters={"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": 0.25},
    )
    hf = hf_qn.Qwen3NextRotaryEmbedding(hf_cfg)
    inv_freq, factor = rope_inv_freq(RopeConfig(theta=5e6, rotary_dim=8))
    assert torch.equal(inv_freq, hf.inv_freq) and factor == 1.0
    pos = _positions()
    cos_hf, sin_hf = hf(torch.zeros(1), pos[None])
    cos, sin = rope_cos_sin(pos, inv_freq, factor)
    assert torch.equal(torch.cat([cos, cos], -1), cos_hf[0])
    assert torch.equal(torch.cat([sin, sin], -1), sin_hf[0])


def test_neox_partial_matches_hf_apply() -> None:
    torch.manual_seed(0)
    pos = _positions()
    cos, sin = rope_cos_sin(pos, *rope_inv_freq(RopeConfig(theta=10000.0, rotary_dim=8)))
    q, k = torch.randn(len(pos), 4, 32), torch.randn(len(pos), 2, 32)
    cat = (torch.cat([cos, cos], -1)[None], torch.cat([sin, sin], -1)[None])
    q_hf, k_hf = hf_qn.apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], *cat)
    assert torch.equal(apply_rope(q, cos, sin, "neox"), q_hf[0].transpose(0, 1))
    assert torch.equal(apply_rope(k, cos, sin, "neox"), k_hf[0].transpose(0, 1))
    assert torch.equal(apply_rope(q, cos, sin, "neox")[..., 8:], q[..., 8:])


def test_interleave_matches_hf_apply_and_is_a_rotation() -> None:
    torch.manual_seed(0)
    pos = _positions()
    cos, sin = rope_cos_sin(pos, *rope_inv_freq(RopeConfig(theta=10000.0, rotary_dim=16)))
    q, k = torch.randn(len(pos), 4, 16), torch.randn(len(pos), 1, 16)
    cat = (torch.cat([cos, cos], -1)[None], torch.cat([sin, sin], -1)[None])
    q_hf, k_hf = hf_ds.apply_rotary_pos_emb_interleave(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], *cat
    )
    q_rot, k_rot = apply_rope(q, cos, sin, "interleave"), apply_rope(k, cos, sin, "interleave")
    assert torch.equal(q_rot, q_hf[0].transpose(0, 1))
    assert torch.equal(k_rot, k_hf[0].transpose(0, 1))
    # rotation of adjacent pairs: norms kept, and q.k depends only on the position difference
    torch.testing.assert_close(q_rot.norm(dim=-1), q.norm(dim=-1))
    a, b = torch.randn(16), torch.randn(16)
    two = torch.tensor([3, 5, 103, 105])
    c2, s2 = rope_cos_sin(two, *rope_inv_freq(RopeConfig(theta=10000.0, rotary_dim=16)))
    ra = apply_rope(a.expand(4, 1, 16), c2, s2, "interleave")
    rb = apply_rope(b.expand(4, 1, 16), c2, s2, "interleave")
    torch.testing.assert_close((ra[1] * rb[0]).sum(), (ra[3] * rb[2]).sum(), rtol=1e-5, atol=1e-5)


def test_errors() -> None:
    with pytest.raises(ValueError, match="scaling_type"):
        rope_inv_freq(RopeConfig(scaling_type="longrope"))
    with pytest.raises(ValueError, match="yarn needs"):
        rope_inv_freq(RopeConfig(scaling_type="yarn", scaling=(("factor", 4.0),)))
    cos, sin = torch.ones(2, 4), torch.zeros(2, 4)
    with pytest.raises(ValueError, match="style"):
        apply_rope(torch.ones(2, 1, 8), cos, sin, "gptj")
    with pytest.raises(ValueError, match="rotary dim"):
        apply_rope(torch.ones(2, 1, 6), cos, sin, "neox")
