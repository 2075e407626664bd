"""A tiny DeepSeek-V4 (`deepseek_v4`) built with transformers' `DeepseekV4Config`: one layer of
each attention kind (sliding window 6; CSA with windows of 4 and a top-3 indexer; HCA with
windows of 8), a hash-routed MoE layer then sqrt-softplus routed ones, 3 mHC streams, a SwiGLU
clamp that bites, and random values in the tensors transformers initialises to constants.
16 indexer heads: with 4, ReLU zeroes every head of some entries and the exact score ties make
transformers' arbitrary top-k an unusable oracle."""

from __future__ import annotations

import torch

LAYER_TYPES = ["sliding_attention", "compressed_sparse_attention",
               "heavily_compressed_attention", "compressed_sparse_attention"]  # fmt: skip


def tiny_config(**overrides):
    from transformers import DeepseekV4Config

    cfg = dict(
        vocab_size=256, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=4,
        num_attention_heads=4, head_dim=32, q_lora_rank=24, partial_rotary_factor=0.25,
        num_experts_per_tok=2, n_routed_experts=8, o_groups=2, o_lora_rank=16,
        index_n_heads=16, index_head_dim=16, index_topk=3, sliding_window=6,
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        layer_types=LAYER_TYPES, mlp_layer_types=["hash_moe", "moe", "moe", "moe"], hc_mult=3,
        swiglu_limit=0.5, pad_token_id=0, bos_token_id=1, eos_token_id=2, rms_norm_eps=1e-6,
        max_position_embeddings=4096,
    )  # fmt: skip
    cfg.update(overrides)
    return DeepseekV4Config(**cfg)


def randomize(module: torch.nn.Module, seed: int) -> None:
    """Random values where transformers puts constants (norms 1, sinks / biases 0, hc base 0 and
    scale 1, routing tables 0): constants would hide mapping mistakes."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith(("sinks", "position_bias", ".base", "hc_base")):
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name.endswith(("scale", "hc_scale")) or (p.dim() == 1 and "norm" in name):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=gen))
            elif p.dim() >= 2:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
        for name, b in module.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=gen))
            elif name.endswith("tid2eid"):
                b.copy_(torch.stack([torch.randperm(8, generator=gen)[:2] for _ in b]))


def build_tiny_deepseek_v4(seed: int = 0, **overrides):
    """A tiny fp32 eager `DeepseekV4ForCausalLM` with random weights (eval mode)."""
    from transformers import DeepseekV4ForCausalLM

    torch.manual_seed(seed)
    model = DeepseekV4ForCausalLM._from_config(tiny_config(**overrides),
                                               attn_implementation="eager")  # fmt: skip
    randomize(model, seed + 1)
    return model.float().eval()


def save_tiny_deepseek_v4(path, seed: int = 0, max_shard_size: str | None = None):
    """Build, save_pretrained (the released checkpoint's tensor names; sharded with
    `max_shard_size`) into `path`; return the model."""
    model = build_tiny_deepseek_v4(seed)
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(path, safe_serialization=True, **kwargs)
    return model
