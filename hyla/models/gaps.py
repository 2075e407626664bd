"""The gap list of new model families (docs/model_gaps.md) as data: each checkpoint module of a
family mapped to the hyla op/layer that runs it, or "missing". `gap_rows(config_dict)` picks a
`config.json`'s family (for `hyla inspect`). No torch."""

from __future__ import annotations

from typing import Any

# family -> ((checkpoint module, hyla module or "-", status), ...); status: reused | extended |
# new | missing. Keep in step with docs/model_gaps.md.
GAPS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "glm5_next": (
        ("embed_tokens, lm_head, norm, layer norms", "HybridModel, layers/norm", "reused"),
        ("attn_hc / ffn_hc (hc_mult streams)", "layers/hyper_connection", "new"),
        ("hc_head (mean of streams)", "HybridModel._forward_streams", "new"),
        ("self_attn (KDA)", "layers/linear_attention.KimiDeltaAttention", "reused"),
        ("forget gate with linear_lower_bound", "ops/gates.kda_gates_bounded", "extended"),
        ("self_attn (NoPE MLA)", "layers/attention.MLAttention", "reused"),
        ("indexer wq_b, wk, k_norm, weights_proj", "layers/sparse_attention", "reused"),
        ("indexer index_kpool_compress_gate/ape", "ops/kpool_indexer", "new"),
        ("indexer_types shared", "layers/pooled_sparse_attention", "new"),
        ("sparse attention over pooled sets", "ops/sparse_attention (seq_lens)", "extended"),
        ("mlp / shared_experts (swiglu_limit)", "ops/activation.silu_and_mul_clamped", "extended"),
        ("mlp.gate (sigmoid grouped router)", "layers/moe.Router", "reused"),
        ("mlp.experts (clamped SwiGLU)", "ops/moe_clamped", "extended"),
        ("MTP layers, shared_head", "-", "missing"),
        ("model.visual (vision tower)", "layers/glm5_next_vision.Glm5NextVisionTower", "new"),
        ("image placeholders filled in", "models/hybrid.HybridModel", "extended"),
        ("images in the engine and server", "-", "missing"),
    ),
    "qwen3_5": (
        ("embed_tokens, lm_head, norms (1 + w)", "layers/norm.RMSNorm(offset=1)", "reused"),
        (
            "linear_attn in_proj_qkv/z/b/a (flat)",
            "layers/linear_attention.GatedDeltaNet",
            "extended",
        ),
        ("linear_attn conv1d, dt_bias, A_log, norm, out_proj", "GatedDeltaNet", "reused"),
        ("self_attn (gated GQA, q/k norm)", "layers/attention.GQAttention", "reused"),
        ("mrope_section rotary ([3, T] positions)", "ops/rotary/mrope.mrope_cos_sin", "extended"),
        ("mtp layers", "-", "missing"),
        ("mlp (dense SwiGLU)", "layers/mlp.GatedMLP", "reused"),
        ("model.visual (vision tower)", "layers/qwen3_5_vision.Qwen35VisionTower", "new"),
        ("image prompts (M-RoPE positions)", "ops/rotary/mrope.mrope_positions", "new"),
        ("images in the engine and server", "-", "missing"),
    ),
}
_MODEL_TYPES = {
    "glm5_next": "glm5_next",
    "glm5_next_text": "glm5_next",
    "qwen3_5": "qwen3_5",
    "qwen3_5_text": "qwen3_5",
}


def gap_rows(hf_config: dict[str, Any]) -> tuple[tuple[str, str, str], ...]:
    """The gap rows of a `config.json` dict's family; empty for a family without a list."""
    family = _MODEL_TYPES.get(str(hf_config.get("model_type")))
    return GAPS.get(family, ()) if family else ()
