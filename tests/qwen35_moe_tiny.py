"""A tiny random-weight Qwen3.5-MoE (`qwen3_5_moe`) checkpoint built with transformers'
`Qwen3_5MoeConfig`: Qwen3.5's tiny text model (tests.qwen35_tiny: 3 Gated DeltaNet layers with
GVA, 1 gated GQA with partial M-RoPE) with every FFN a softmax top-2 of 8 experts plus a
sigmoid-gated shared expert, and the same two-block vision tower."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.qwen35_tiny import FULL, LIN, MM_IDS

VISION = dict(depth=2, hidden_size=32, num_heads=2, out_hidden_size=64, intermediate_size=32,
              patch_size=4, spatial_merge_size=2, num_position_embeddings=36)  # fmt: skip


def tiny_text_config(**overrides) -> dict:
    text = dict(
        vocab_size=256, hidden_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=24, rms_norm_eps=1e-6,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=4096,
        linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4, layer_types=[LIN, LIN, LIN, FULL],
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.5, "mrope_section": [2, 2, 2],
                         "mrope_interleaved": True},
    )  # fmt: skip
    text.update(overrides)
    return text


def build_tiny_qwen35_moe(seed: int = 0):
    """A tiny fp32 eager `Qwen3_5MoeForConditionalGeneration` with random weights (eval mode)."""
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

    config = Qwen3_5MoeConfig(text_config=tiny_text_config(), vision_config=VISION, **MM_IDS)
    torch.manual_seed(seed)
    model = Qwen3_5MoeForConditionalGeneration._from_config(config, attn_implementation="eager")
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # zero-centred norms start at 0: random values catch mapping mistakes
        for name, p in model.named_parameters():
            if p.dim() == 1 and ("norm" in name or "bias" in name):
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("mlp.gate.weight"):  # zeros: every expert would tie
                p.copy_(torch.randn(p.shape, generator=gen))
    return model.float().eval()


def save_tiny_qwen35_moe(path: Path, seed: int = 0, max_shard_size: str | None = None):
    """Build, save_pretrained (safetensors; sharded with `max_shard_size`) into `path`; return
    the model."""
    model = build_tiny_qwen35_moe(seed)
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(path, safe_serialization=True, **kwargs)
    return model
