"""Tiny random-weight `transformers` models of each supported family, saved as HF checkpoints.

Shared by the alignment, engine and prefix-cache tests. Each has 4 layers = 3 linear + 1
attention-like layer (DSA for deepseek_v32, where every layer is DSA), MoE FFNs and small dims.
"""

from __future__ import annotations

from pathlib import Path

import torch

FAMILIES = ("kimi_linear", "deepseek_v32", "qwen3_next")
LINEAR, FULL = "linear_attention", "full_attention"


def tiny_hf_config(family: str, **overrides):
    """A `transformers` config object for a tiny model of `family`."""
    from transformers import DeepseekV32Config, KimiLinearConfig, Qwen3NextConfig

    common = dict(
        vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=4, num_attention_heads=4, rms_norm_eps=1e-6,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
        max_position_embeddings=4096,
    )
    if family == "kimi_linear":
        cfg = dict(
            common, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=None,
            qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
            num_local_experts=8, num_experts_per_tok=2, n_shared_experts=1,
            n_group=2, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True,
            linear_attn_config={"head_dim": 16, "num_heads": 4, "short_conv_kernel_size": 4},
            layer_types=[LINEAR, LINEAR, FULL, LINEAR],
            mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
        )
        cls = KimiLinearConfig
    elif family == "deepseek_v32":
        cfg = dict(
            common, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=24,
            qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
            n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
            n_group=2, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True,
            # 16 indexer heads: with few heads, ReLU zeroes every head for many tokens and the
            # resulting exact score ties make transformers' (arbitrary) top-k an unusable oracle.
            first_k_dense_replace=1, index_topk=16, index_head_dim=16, index_n_heads=16,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        )
        cls = DeepseekV32Config
    elif family == "qwen3_next":
        cfg = dict(
            common, num_key_value_heads=2, head_dim=16,
            linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
            linear_num_key_heads=2, linear_num_value_heads=4,
            num_experts=8, num_experts_per_tok=2, shared_expert_intermediate_size=48,
            norm_topk_prob=True, layer_types=[LINEAR, LINEAR, LINEAR, FULL],
            partial_rotary_factor=0.25,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                             "partial_rotary_factor": 0.25},
        )
        cls = Qwen3NextConfig
    else:
        raise ValueError(f"unknown family {family!r}")
    cfg.update(overrides)
    return cls(**cfg)


def build_tiny_hf_model(family: str, seed: int = 0, **overrides):
    """A tiny fp32 eager `transformers` causal LM of `family` with random weights (eval mode)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = tiny_hf_config(family, **overrides)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    _randomize(model, seed)
    return model.float().eval()


def _randomize(model, seed: int) -> None:
    # HF initialises some tensors to constants (norm weights 1, biases 0, router bias 0); random
    # values there catch mapping mistakes that constants would hide.
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and ("norm" in name or "bias" in name):
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
        for name, b in model.named_buffers():
            if "e_score_correction_bias" in name:
                b.copy_(0.05 * torch.randn(b.shape, generator=gen))


def save_tiny_hf_model(family: str, path: Path, seed: int = 0, **overrides):
    """Build, save_pretrained (safetensors) into `path`, and return the HF model."""
    model = build_tiny_hf_model(family, seed, **overrides)
    model.save_pretrained(path, safe_serialization=True)
    return model
