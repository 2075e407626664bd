"""Cache tensor shapes per layer and their byte cost: the one source for allocator and planner."""

from __future__ import annotations

from dataclasses import dataclass

from hyla.config import ModelConfig

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}


@dataclass(frozen=True)
class CacheTensorSpec:
    """One cache tensor of one layer: `per` "token" ([num_blocks, block_size, *shape]) or "slot"
    ([num_slots, *shape]); `dtype` a DTYPE_BYTES key."""

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
    return config.dtype if config.kv_cache_dtype == "auto" else config.kv_cache_dtype


def with_scales(specs: list[CacheTensorSpec]) -> tuple[CacheTensorSpec, ...]:
    """`specs` plus a float32 `<name>_scale` per fp8 entry, one per last-dim vector (`ops.fp8`):
    per-block scales would need the block's amax before its last token arrives."""
    out = list(specs)
    for s in specs:
        if s.dtype == "fp8":
            out.append(CacheTensorSpec(f"{s.name}_scale", s.per, s.shape[:-1], "float32"))
    return tuple(out)


def conv_dim(config: ModelConfig) -> int:
    """Channels of the short convolution of a linear layer: q, k and v concatenated."""
    lin = config.linear
    return 2 * lin.num_k_heads * lin.head_k_dim + lin.num_v_heads * lin.head_v_dim


_KPOOL_CACHES = ("index_keys", "index_gates", "index_pool_keys")


def layer_cache_specs(config: ModelConfig, layer_idx: int) -> tuple[CacheTensorSpec, ...]:
    """Cache tensors of layer `layer_idx`, per token unless noted (fp8 ones get `X_scale`):
    mla/dsa latent [kv_lora_rank + qk_rope_head_dim] (normed c_kv, then k_rope); dsa index_keys
    [index_head_dim] (roped, normed; none on a "shared" layer) or index_kpool's three; gqa k, v
    [num_kv_heads, head_dim]; swa/csa/hca kv [head_dim] (keys = values) plus `compressed_specs`;
    kda/gdn per slot recurrent_state [num_v_heads, head_k_dim, head_v_dim] and conv_state
    [conv_dim, conv_kernel_size - 1]."""
    kind = config.layer_pattern[layer_idx]
    kvd = kv_dtype(config)
    if kind in ("mla", "dsa"):
        specs = [CacheTensorSpec("latent", "token", (config.mla.latent_dim,), kvd)]
        if kind == "dsa" and config.dsa.index_kpool:
            names = () if config.dsa.is_shared(layer_idx) else _KPOOL_CACHES
            idx_dtype = config.dtype if kvd == "fp8" else kvd  # no fp8 scales for pooling yet
            dim = (config.dsa.index_head_dim,)
            specs += [CacheTensorSpec(n, "token", dim, idx_dtype) for n in names]
        elif kind == "dsa" and not config.dsa.is_shared(layer_idx):  # GLM-5 shares top-k
            specs.append(CacheTensorSpec("index_keys", "token", (config.dsa.index_head_dim,), kvd))
        return with_scales(specs)
    if kind in ("swa", "csa", "hca"):
        return with_scales(compressed_specs(config, kind, kvd))
    if kind == "gqa":
        shape = (config.gqa.num_kv_heads, config.gqa.head_dim)
        return with_scales(
            [CacheTensorSpec("k", "token", shape, kvd), CacheTensorSpec("v", "token", shape, kvd)]
        )
    lin = config.linear
    return (
        CacheTensorSpec(
            "recurrent_state",
            "slot",
            (lin.num_v_heads, lin.head_k_dim, lin.head_v_dim),
            config.mamba_ssm_cache_dtype,
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


def compressed_specs(config: ModelConfig, kind: str, kvd: str) -> list[CacheTensorSpec]:
    """DeepSeek-V4: kv, compress_kv/gate ([2 head_dim]: csa's two series; [head_dim] hca), csa's
    index_kv/gate [2 index_head_dim], pooled when read; inputs stay in the model dtype."""
    c = config.compressed
    specs = [CacheTensorSpec("kv", "token", (c.head_dim,), kvd)]
    inputs = config.dtype if kvd == "fp8" else kvd
    width = {"swa": 0, "csa": 2 * c.head_dim, "hca": c.head_dim}[kind]
    if width:
        specs += [
            CacheTensorSpec(n, "token", (width,), inputs) for n in ("compress_kv", "compress_gate")
        ]
    if kind == "csa":
        specs += [CacheTensorSpec(n, "token", (2 * c.index_head_dim,), inputs)
                  for n in ("index_kv", "index_gate")]  # fmt: skip
    return specs
