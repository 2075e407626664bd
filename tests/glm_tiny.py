"""A tiny random-weight GLM-5.3-Flash (`glm5_next`) checkpoint built with transformers'
`Glm5NextConfig`, small enough that every text path runs in a short prompt: 5 layers
(KDA, full DSA, shared DSA, KDA, full DSA), pools of 4 tokens with top-8 (2 pools + the tail),
3 hyper-connection streams, a SwiGLU clamp that bites, grouped sigmoid MoE with a shared expert.
"""

from __future__ import annotations

from pathlib import Path

import torch

LIN, IDX = "linear_attention", "indexed_attention"


def tiny_glm_text_config(**overrides) -> dict:
    """The text fields of the tiny model."""
    text = dict(
        vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=4, rms_norm_eps=1e-6,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=4096,
        kv_lora_rank=32, q_lora_rank=24, qk_rope_head_dim=0, qk_nope_head_dim=16, v_head_dim=16,
        n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1,
        routed_scaling_factor=2.5, norm_topk_prob=True,
        # 16 indexer heads: with few heads ReLU zeroes every head of some pools and the exact
        # score ties make transformers' (arbitrary) top-k an unusable oracle.
        index_topk=8, index_head_dim=16, index_n_heads=16, index_kpool=4,
        layer_types=[LIN, IDX, IDX, LIN, IDX],
        indexer_types=["full", "full", "shared", "full", "full"],
        mlp_layer_types=["dense", "sparse", "sparse", "sparse", "sparse"],
        linear_head_dim=16, linear_num_heads=4, hc_mult=3, swiglu_limit=0.5,
    )  # fmt: skip
    text.update(overrides)
    return text


# image / video special ids inside the tiny vocabulary (the image and video token are one id)
MM_IDS = dict(image_token_id=250, video_token_id=250, image_start_token_id=248,
              image_end_token_id=249, video_start_token_id=246, video_end_token_id=247)  # fmt: skip
VISION = dict(depth=2, hidden_size=32, num_heads=2, out_hidden_size=64, intermediate_size=32,
              projection_intermediate_size=32, patch_size=4, spatial_merge_size=2,
              temporal_patch_size=2, swiglu_limit=1.0)  # fmt: skip


def build_tiny_glm(seed: int = 0, **overrides):
    """A tiny fp32 eager `Glm5NextForConditionalGeneration` with random weights (eval mode)."""
    from transformers import Glm5NextConfig, Glm5NextForConditionalGeneration

    text = tiny_glm_text_config(**overrides)
    config = Glm5NextConfig(text_config=text, vision_config=VISION, **MM_IDS)
    torch.manual_seed(seed)
    model = Glm5NextForConditionalGeneration._from_config(config, attn_implementation="eager")
    _randomize(model, seed)
    return model.float().eval()


def _randomize(model, seed: int) -> None:
    # transformers initialises these to constants (norms 1, biases 0, hc base 0 / scale 1,
    # pool ape 0 / gate 1, A_log 0); random values catch mapping mistakes constants would hide.
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and ("norm" in name or "bias" in name or "A_log" in name):
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith(("_hc.base", "_hc.scale")):
                p.add_(0.5 * torch.randn(p.shape, generator=gen))
            elif "index_kpool_compress" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * (0.5 if "ape" in name else 0.2))
        for name, b in model.named_buffers():
            if "e_score_correction_bias" in name:
                b.copy_(0.05 * torch.randn(b.shape, generator=gen))


def save_tiny_glm(path: Path, seed: int = 0, **overrides):
    """Build, save_pretrained (safetensors, the released layout) into `path`; return the model."""
    model = build_tiny_glm(seed, **overrides)
    model.save_pretrained(path, safe_serialization=True)
    return model


def save_tiny_glm_text(path: Path, seed: int = 0, **overrides):
    """The tiny model saved as a text-only release: the text fields at the top level of
    config.json, tensors under `model.` (no `language_model.`, no vision tower)."""
    import json

    from safetensors.torch import save_file

    model = build_tiny_glm(seed, **overrides)
    path.mkdir(parents=True, exist_ok=True)
    full = model.config.to_dict()
    flat = dict(full["text_config"], model_type="glm5_next",
                architectures=["Glm5NextForConditionalGeneration"])  # fmt: skip
    (path / "config.json").write_text(json.dumps(flat))
    tensors = {}
    for name, t in model.state_dict().items():
        if not name.startswith("model.visual."):
            key = name.replace("model.language_model.", "model.")
            tensors[key] = t.detach().contiguous().clone()
    save_file(tensors, path / "model.safetensors")
    return model
