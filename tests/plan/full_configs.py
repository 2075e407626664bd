"""The public config.json fields of three full-size models, written out by hand (from the
released Hugging Face repositories), and their parameter counts by hand arithmetic from the
published architectures, independent of hyla's model code.
"""

from __future__ import annotations

KIMI_LINEAR_48B = {
    "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear",
    "vocab_size": 163840, "hidden_size": 2304, "intermediate_size": 9216,
    "num_hidden_layers": 27, "num_attention_heads": 32, "num_key_value_heads": 32,
    "head_dim": 72, "hidden_act": "silu", "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    "kv_lora_rank": 512, "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "mla_use_nope": True, "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "num_experts": 256, "num_experts_per_token": 8, "num_shared_experts": 1,
    "moe_intermediate_size": 1024, "moe_router_activation_func": "sigmoid",
    "moe_renormalize": True, "routed_scaling_factor": 2.446, "use_grouped_topk": True,
    "num_expert_group": 1, "topk_group": 1, "num_nextn_predict_layers": 0,
    "model_max_length": 1048576, "torch_dtype": "bfloat16", "bos_token_id": 163584,
    "eos_token_id": 163586,
    "linear_attn_config": {
        "full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
        "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26],
        "num_heads": 32, "head_dim": 128, "short_conv_kernel_size": 4,
    },
}  # fmt: skip

DEEPSEEK_V32 = {
    "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
    "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_nextn_predict_layers": 1,
    "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1,
    "n_routed_experts": 256, "routed_scaling_factor": 2.5, "kv_lora_rank": 512,
    "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
    "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
    "first_k_dense_replace": 3, "norm_topk_prob": True, "hidden_act": "silu",
    "max_position_embeddings": 163840, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "rope_theta": 10000, "index_n_heads": 64, "index_head_dim": 128, "index_topk": 2048,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "torch_dtype": "bfloat16", "bos_token_id": 0, "eos_token_id": 1,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                            "quant_method": "fp8", "weight_block_size": [128, 128]},
}  # fmt: skip

QWEN3_NEXT_80B = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
    "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5120,
    "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2,
    "head_dim": 256, "hidden_act": "silu", "full_attention_interval": 4,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "linear_value_head_dim": 128,
    "max_position_embeddings": 262144, "mlp_only_layers": [], "decoder_sparse_step": 1,
    "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "num_experts": 512,
    "num_experts_per_tok": 10, "norm_topk_prob": True, "partial_rotary_factor": 0.25,
    "rope_theta": 10000000, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "bos_token_id": 151643, "eos_token_id": 151645,
}  # fmt: skip


# fmt: off
def kimi_params() -> dict[str, int]:
    """Kimi-Linear-48B-A3B: 20 KDA + 7 NoPE MLA layers, layer 0 dense, 26 MoE layers."""
    h, heads, d = 2304, 32, 128
    kda = (3 * h * heads * d          # q, k, v projections
           + 3 * heads * d * 4        # q, k, v short convs (kernel 4, depthwise)
           + d * h + heads * d * d    # f_a (h -> head_dim), f_b (head_dim -> heads*head_dim)
           + heads * h                # b_proj (beta per head)
           + d * h + heads * d * d    # g_a, g_b (output gate, low rank head_dim)
           + heads + heads * d        # A_log, dt_bias
           + d                        # o_norm (per head_dim)
           + h * heads * d)           # o_proj
    mla = (heads * (128 + 64) * h     # q_proj (no q lora)
           + (512 + 64) * h + 512     # kv_a_proj_with_mqa, kv_a_layernorm
           + heads * (128 + 128) * 512  # kv_b_proj
           + h * heads * 128)         # o_proj
    dense_mlp = 3 * h * 9216
    router = 256 * h + 256            # gate weight + e_score_correction_bias
    shared = 3 * h * 1024
    experts = 26 * 256 * 3 * h * 1024
    norms = 27 * 2 * h + h
    dense = 20 * kda + 7 * mla + dense_mlp + 26 * (router + shared) + norms
    return {"embedding": 2 * 163840 * h, "experts": experts, "dense": dense}


def deepseek_v32_params() -> dict[str, int]:
    """DeepSeek-V3.2: 61 DSA layers (MLA with q lora + lightning indexer), 3 dense, 58 MoE
    (the MTP layer is not part of the served model)."""
    h, heads = 7168, 128
    mla = (1536 * h + 1536            # q_a_proj, q_a_layernorm
           + heads * (128 + 64) * 1536  # q_b_proj
           + (512 + 64) * h + 512     # kv_a_proj_with_mqa, kv_a_layernorm
           + heads * (128 + 128) * 512  # kv_b_proj
           + h * heads * 128)         # o_proj
    indexer = (64 * 128 * 1536        # wq_b (from the q lora)
               + 128 * h + 2 * 128    # wk, k_norm (LayerNorm weight + bias)
               + 64 * h)              # weights_proj (one weight per indexer head)
    dense_mlp = 3 * h * 18432
    router = 256 * h + 256
    shared = 3 * h * 2048
    experts = 58 * 256 * 3 * h * 2048
    norms = 61 * 2 * h + h
    dense = 61 * (mla + indexer) + 3 * dense_mlp + 58 * (router + shared) + norms
    return {"embedding": 2 * 129280 * h, "experts": experts, "dense": dense}


def qwen3_next_params() -> dict[str, int]:
    """Qwen3-Next-80B-A3B: 36 Gated DeltaNet + 12 gated GQA layers, all 48 MoE."""
    h = 2048
    conv_dim = 2 * 16 * 128 + 32 * 128
    gdn = ((2 * 16 * 128 + 2 * 32 * 128) * h  # in_proj_qkvz
           + 2 * 32 * h                        # in_proj_ba
           + conv_dim * 4                      # depthwise conv (kernel 4)
           + 32 + 32                           # dt_bias, A_log
           + 128                               # gated RMSNorm over head_v_dim
           + h * 32 * 128)                     # out_proj
    gqa = (16 * 256 * 2 * h                    # q_proj with output gate
           + 2 * 2 * 256 * h                   # k_proj, v_proj
           + h * 16 * 256                      # o_proj
           + 2 * 256)                          # q_norm, k_norm
    router = 512 * h + h                       # gate, shared_expert_gate
    shared = 3 * h * 512
    experts = 48 * 512 * 3 * h * 512
    norms = 48 * 2 * h + h
    dense = 36 * gdn + 12 * gqa + 48 * (router + shared) + norms
    return {"embedding": 2 * 151936 * h, "experts": experts, "dense": dense}
# fmt: on


# fmt: off
def _fp8(rows: int, cols: int) -> int:
    """Bytes of one fp8 matrix with 128x128 block scales (float32), DeepSeek's released layout."""
    return rows * cols + (-(-rows // 128)) * (-(-cols // 128)) * 4


def deepseek_v32_fp8_bytes() -> dict[str, int]:
    """DeepSeek-V3.2 as released (fp8 e4m3, 128x128 blocks): every projection fp8 but the
    embedding, lm_head, kv_b_proj (its weight is absorbed into the queries) and the indexer's
    weights_proj, which stay bf16 with the norms and routers (fp32 correction bias).
    `replicated`: what every tensor-parallel rank holds whole (the latent's and indexer's
    projections, norms, routers)."""
    h = 7168
    split_attn = _fp8(128 * 192, 1536) + 32768 * 512 * 2 + _fp8(h, 128 * 128)  # q_b, kv_b, o
    whole_attn = (_fp8(1536, h) + _fp8(576, h) + (1536 + 512) * 2     # q_a, kv_a, their norms
                  + _fp8(64 * 128, 1536) + _fp8(128, h) + 2 * 128 * 2  # indexer wq_b, wk, k_norm
                  + 64 * h * 2 + 2 * h * 2)                            # weights_proj, 2 norms
    dense_mlp = 2 * _fp8(18432, h) + _fp8(h, 18432)
    shared = 2 * _fp8(2048, h) + _fp8(h, 2048)
    router = 256 * h * 2 + 256 * 4
    experts = 58 * 256 * (2 * _fp8(2048, h) + _fp8(h, 2048))
    replicated = 61 * whole_attn + 58 * router + h * 2
    split = 61 * split_attn + 3 * dense_mlp + 58 * shared
    return {"embedding": 2 * 129280 * h * 2, "experts": experts, "split": split,
            "replicated": replicated}
# fmt: on
