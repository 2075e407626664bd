"""A tiny random-weight GLM-5 (`glm_moe_dsa`) checkpoint built with transformers'
`GlmMoeDsaConfig`: 5 DSA layers (full, shared, full, shared, shared indexers: the shared ones
reuse the last full layer's top-k), interleaved rope in MLA and in the indexer, top-16
selection (prompts past 16 tokens take the sparse path), layer 0 dense, then sigmoid-routed
grouped MoE with a shared expert."""

from __future__ import annotations

from pathlib import Path

import torch

INDEXER_TYPES = ["full", "shared", "full", "shared", "shared"]


def tiny_config(**overrides):
    from transformers import GlmMoeDsaConfig

    cfg = dict(
        vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=4, rms_norm_eps=1e-6,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
        max_position_embeddings=4096, kv_lora_rank=32, q_lora_rank=24, qk_rope_head_dim=8,
        qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2,
        n_shared_experts=1, n_group=2, topk_group=1, routed_scaling_factor=2.5,
        norm_topk_prob=True, first_k_dense_replace=1,
        # 16 indexer heads: with few heads ReLU zeroes every head of many tokens and the exact
        # score ties make transformers' (arbitrary) top-k an unusable oracle
        index_topk=16, index_head_dim=16, index_n_heads=16, indexer_types=INDEXER_TYPES,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )  # fmt: skip
    cfg.update(overrides)
    return GlmMoeDsaConfig(**cfg)


def build_tiny_glm_moe_dsa(seed: int = 0, **overrides):
    """A tiny fp32 eager `GlmMoeDsaForCausalLM` with random weights (eval mode)."""
    from transformers import GlmMoeDsaForCausalLM

    torch.manual_seed(seed)
    model = GlmMoeDsaForCausalLM._from_config(tiny_config(**overrides),
                                              attn_implementation="eager")  # fmt: skip
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # constants (norms 1, biases 0) would hide mapping mistakes
        for name, p in model.named_parameters():
            if p.dim() == 1 and ("norm" in name or "bias" in name):
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
        for name, b in model.named_buffers():
            if "e_score_correction_bias" in name:
                b.copy_(0.05 * torch.randn(b.shape, generator=gen))
    return model.float().eval()


def save_tiny_glm_moe_dsa(path: Path, seed: int = 0, max_shard_size: str | None = None,
                          **overrides):  # fmt: skip
    """Build, save_pretrained (safetensors; sharded with `max_shard_size`) into `path`; return
    the model."""
    model = build_tiny_glm_moe_dsa(seed, **overrides)
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(path, safe_serialization=True, **kwargs)
    return model
