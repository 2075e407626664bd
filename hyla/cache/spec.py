"""What each layer stores in the cache, and how many bytes that costs (pure arithmetic, no torch).

Attention-like layers (mla, gqa, dsa) store entries per token in paged blocks; linear layers
(kda, gdn) store one recurrent state and one short-conv state per state slot. This module is the
single source of truth for those shapes: the tensor allocator (`hyla.forward_batch`) and the
memory planner both read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from hyla.config import ModelConfig

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}


@dataclass(frozen=True)
class CacheTensorSpec:
    """One cache tensor of one layer.

    `per` is "token" (allocated as `[num_blocks, block_size, *shape]`) or "slot" (allocated as
    `[num_slots, *shape]`). `dtype` is a name in DTYPE_BYTES.
    """

    name: str
    per: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]


def kv_dtype(config: ModelConfig) -> str:
    """Storage dtype of per-token cache entries (`auto` follows the model dtype)."""
    return config.dtype if config.kv_cache_dtype == "auto" else config.kv_cache_dtype


def conv_dim(config: ModelConfig) -> int:
    """Channels of the short convolution of a linear layer: q, k and v concatenated."""
    lin = config.linear
    return 2 * lin.num_k_heads * lin.head_k_dim + lin.num_v_heads * lin.head_v_dim


def layer_cache_specs(config: ModelConfig, layer_idx: int) -> tuple[CacheTensorSpec, ...]:
    """Cache tensors of layer `layer_idx`.

    Layouts:
      mla/dsa  latent      per token [kv_lora_rank + qk_rope_head_dim]  (normed c_kv, then k_rope)
      dsa      index_keys  per token [index_head_dim]                   (roped, normed indexer key)
      gqa      k, v        per token [num_kv_heads, head_dim]
      kda/gdn  recurrent_state per slot [num_v_heads, head_k_dim, head_v_dim] float32
               conv_state      per slot [conv_dim, conv_kernel_size - 1]
    """
    kind = config.layer_pattern[layer_idx]
    kvd = kv_dtype(config)
    if kind in ("mla", "dsa"):
        specs = [CacheTensorSpec("latent", "token", (config.mla.latent_dim,), kvd)]
        if kind == "dsa":
            specs.append(
                CacheTensorSpec("index_keys", "token", (config.dsa.index_head_dim,), kvd)
            )
        return tuple(specs)
    if kind == "gqa":
        shape = (config.gqa.num_kv_heads, config.gqa.head_dim)
        return (
            CacheTensorSpec("k", "token", shape, kvd),
            CacheTensorSpec("v", "token", shape, kvd),
        )
    lin = config.linear
    return (
        CacheTensorSpec(
            "recurrent_state",
            "slot",
            (lin.num_v_heads, lin.head_k_dim, lin.head_v_dim),
            "float32",
        ),
        CacheTensorSpec(
            "conv_state", "slot", (conv_dim(config), lin.conv_kernel_size - 1), config.dtype
        ),
    )


def bytes_per_token(config: ModelConfig) -> int:
    """Bytes of paged cache one token costs, summed over all attention-like layers."""
    return sum(
        s.nbytes
        for i in range(config.num_layers)
        for s in layer_cache_specs(config, i)
        if s.per == "token"
    )


def bytes_per_state_slot(config: ModelConfig) -> int:
    """Bytes of one sequence's linear-attention state (recurrent + conv), all linear layers."""
    return sum(
        s.nbytes
        for i in range(config.num_layers)
        for s in layer_cache_specs(config, i)
        if s.per == "slot"
    )
