"""The default model's architecture, init and checkpoint format: KDA + DSA + MoE with no positional
encoding (position from KDA convs and decays), so it runs past its training length."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from hyla.config import DSAConfig, LinearAttentionConfig, MLAConfig, ModelConfig, MoEConfig
from hyla.models.hybrid import HybridModel

MAX_CHECKPOINT_BYTES = 24_000_000


def default_model_config(vocab_size: int, eos_id: int, max_context_len: int = 32768) -> ModelConfig:
    """The architecture of hyla's embedded default model (11.7M parameters, 23.4 MB in bf16)."""
    num_layers = 8
    return ModelConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=768,
        layer_pattern=("kda", "kda", "dsa", "kda") * 2,
        ffn_pattern=("dense",) + ("moe",) * (num_layers - 1),
        architecture="hyla",
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        max_context_len=max_context_len,
        dtype="bfloat16",
        bos_token_id=eos_id,
        eos_token_ids=(eos_id,),
        linear=LinearAttentionConfig(
            num_k_heads=4, num_v_heads=4, head_k_dim=64, head_v_dim=64, conv_kernel_size=4
        ),
        mla=MLAConfig(
            num_heads=4,
            kv_lora_rank=128,
            qk_nope_head_dim=64,
            qk_rope_head_dim=32,
            v_head_dim=64,
            q_lora_rank=128,
            use_rope=False,
        ),
        dsa=DSAConfig(index_n_heads=4, index_head_dim=64, index_topk=64),
        moe=MoEConfig(
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=80,
            num_shared_experts=1,
            shared_intermediate_size=160,
            scoring="softmax",
            norm_topk_prob=True,
        ),
    )


def init_weights(model: HybridModel, seed: int, std: float = 0.02) -> None:
    """GPT-2-style seeded init: N(0, std), `o_proj`/`down_proj` scaled by 1/sqrt(2 * num_layers);
    norms and KDA gate parameters (fla's `A_log` / `dt_bias` ranges) redrawn under `seed`."""
    gen = torch.Generator().manual_seed(seed)
    out_std = std / math.sqrt(2 * model.config.num_layers)
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if name.endswith("A_log"):
                p.copy_(torch.empty_like(p).uniform_(1, 16, generator=gen).log())
            elif name.endswith("dt_bias"):
                dt = torch.empty_like(p).uniform_(math.log(1e-3), math.log(0.1), generator=gen)
                p.copy_(dt.exp() + torch.log(-torch.expm1(-dt.exp())))
            elif "norm" in name or leaf == "bias" or p.dim() == 1:
                p.copy_(torch.ones_like(p) if leaf == "weight" else torch.zeros_like(p))
            elif "conv1d" in name:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
            else:
                scale = out_std if ("o_proj" in name or "down_proj" in name) else std
                p.copy_(torch.randn(p.shape, generator=gen) * scale)


def build_model(config: ModelConfig, seed: int) -> HybridModel:
    torch.manual_seed(seed)
    model = HybridModel(config)
    init_weights(model, seed)
    return model


def count_parameters(model: nn.Module) -> dict[str, int]:
    """Total, embedding + head, and parameters active per token (2 of 8 routed experts)."""
    total = sum(p.numel() for p in model.parameters())
    embed = model.embed_tokens.weight.numel() + model.lm_head.weight.numel()
    routed = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    moe = model.config.moe
    active = total - routed + routed * moe.num_experts_per_tok // moe.num_experts
    return {"total": total, "embedding_and_head": embed, "active_per_token": active}


def save_checkpoint(model: HybridModel, out_dir: Path, dtype: torch.dtype = torch.bfloat16) -> int:
    """Write `config.json` and `model.safetensors`; returns its bytes; ValueError past the limit."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {
        name: t.detach().to("cpu", dtype).contiguous()
        if t.is_floating_point() and "correction_bias" not in name
        else t.detach().cpu().contiguous()
        for name, t in model.state_dict().items()
    }
    path = out_dir / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    config = model.config.to_dict()
    config["dtype"] = {torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(dtype, "float32")
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    path.chmod(0o644)
    size = path.stat().st_size
    if size > MAX_CHECKPOINT_BYTES:
        raise ValueError(f"checkpoint: {size} bytes > {MAX_CHECKPOINT_BYTES}")
    return size
