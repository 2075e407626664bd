"""A tiny random-weight Qwen3.5 (`qwen3_5`) checkpoint built with transformers'
`Qwen3_5Config`: 4 layers (3 Gated DeltaNet with GVA, 1 gated GQA with partial multimodal
RoPE), dense SwiGLU, a two-block vision tower."""

from __future__ import annotations

from pathlib import Path

import torch

LIN, FULL = "linear_attention", "full_attention"
# image / video special ids inside the tiny vocabulary
MM_IDS = dict(image_token_id=250, video_token_id=251, vision_start_token_id=248,
              vision_end_token_id=249)  # fmt: skip


def build_tiny_qwen35(seed: int = 0):
    """A tiny fp32 eager `Qwen3_5ForConditionalGeneration` with random weights (eval mode)."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    text = dict(
        vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=24, rms_norm_eps=1e-6,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=4096,
        linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4, layer_types=[LIN, LIN, LIN, FULL],
        # 6 rotated pairs: t, h, w, t, h, w (M-RoPE sections of 2 pairs per axis)
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.5, "mrope_section": [2, 2, 2],
                         "mrope_interleaved": True},
    )  # fmt: skip
    vision = dict(depth=2, hidden_size=32, num_heads=2, out_hidden_size=64, intermediate_size=32,
                  patch_size=4, spatial_merge_size=2, num_position_embeddings=36)  # fmt: skip
    config = Qwen3_5Config(text_config=text, vision_config=vision, **MM_IDS)
    torch.manual_seed(seed)
    model = Qwen3_5ForConditionalGeneration._from_config(config, attn_implementation="eager")
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # zero-centred norms start at 0: random values catch mapping mistakes
        for name, p in model.named_parameters():
            if p.dim() == 1 and ("norm" in name or "bias" in name):
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
    return model.float().eval()


def save_tiny_qwen35(path: Path, seed: int = 0):
    """Build, save_pretrained (safetensors) into `path`; return the model."""
    model = build_tiny_qwen35(seed)
    model.save_pretrained(path, safe_serialization=True)
    return model
