"""Frozen, self-validating config dataclasses (a bad value raises `ConfigError` naming the field).
`ModelConfig` is all hyla's model code sees of a model (HF configs via `hyla.models` adapters)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hyla.byte_sizes import parse_bytes

LINEAR_KINDS = ("kda", "gdn")
ATTENTION_KINDS = ("mla", "gqa", "dsa")
COMPRESSED_KINDS = ("swa", "csa", "hca")  # DeepSeek-V4: sliding window, + CSA / HCA entries
LAYER_KINDS = LINEAR_KINDS + ATTENTION_KINDS + COMPRESSED_KINDS
FFN_KINDS = ("dense", "moe", "hash_moe")
ROPE_SCALING_TYPES = ("default", "linear", "yarn")
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16", "fp8")
MAMBA_SSM_CACHE_DTYPES = ("float32", "bfloat16")
QUANTIZATION_METHODS = ("fp8",)

# the `--tool-call-parser` and `--reasoning-parser` names (vLLM's)
TOOL_CALL_PARSERS = ("auto", "kimi_k2", "deepseek_v31", "deepseek_v32", "glm45", "glm47",
                     "hermes", "qwen3_coder")
REASONING_PARSERS = ("auto", "deepseek_r1", "deepseek_v3", "qwen3", "glm45", "kimi_k2", "kimi")



class ConfigError(ValueError):
    """A configuration field is missing, malformed or out of range. The message names the field."""


def _require(cond: bool, field_name: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{field_name}: {msg}")


DEFAULT_IMAGES_PER_PROMPT = 4


def images_per_prompt(value: Any, default: int = DEFAULT_IMAGES_PER_PROMPT) -> int:
    """`limit_mm_per_prompt` in vLLM's forms -> image count (other modalities must be 0)."""
    name = "limit_mm_per_prompt"
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ConfigError(f"{name}: expected an integer or a JSON object such as "
                              f'{{"image": 4}}, got {value!r}') from None  # fmt: skip
    if isinstance(value, dict):
        unknown = {k: v for k, v in value.items() if k != "image" and v != 0}
        _require(not unknown, name, f"only images are supported (a count for "
                 f"{sorted(unknown)} must be 0), got {value!r}")  # fmt: skip
        value = value.get("image", default)
    _require(isinstance(value, int) and not isinstance(value, bool) and value >= 0, name,
             f"must be an integer >= 0, got {value!r}")  # fmt: skip
    return value


def media_domains(value: Any) -> tuple[str, ...]:
    """`allowed_media_domains` (comma/space-separated string or list) -> lower-case host names."""
    items = value.replace(",", " ").split() if isinstance(value, str) else value
    _require(isinstance(items, (list, tuple)) and all(isinstance(d, str) and d for d in items),
             "allowed_media_domains", f"expected host names, got {value!r}")  # fmt: skip
    bad = [d for d in items if "/" in d or ":" in d or "*" in d]
    _require(not bad, "allowed_media_domains", f"exact host names only (no scheme, port, path "
             f"or wildcard), got {bad}")  # fmt: skip
    return tuple(d.lower() for d in items)


def _positive(obj: Any, prefix: str, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        _require(
            isinstance(value, int) and not isinstance(value, bool) and value > 0,
            f"{prefix}{name}",
            f"must be a positive integer, got {value!r}",
        )


def _non_negative(obj: Any, prefix: str, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        _require(
            isinstance(value, int) and not isinstance(value, bool) and value >= 0,
            f"{prefix}{name}",
            f"must be an integer >= 0, got {value!r}",
        )


def _number(obj: Any, prefix: str, *names: str, positive: bool = False) -> None:
    for name in names:
        value = getattr(obj, name)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        _require(
            ok and (value > 0 or not positive),
            f"{prefix}{name}",
            f"must be a {'positive ' if positive else ''}number, got {value!r}",
        )


def _flag(obj: Any, prefix: str, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        _require(isinstance(value, bool), f"{prefix}{name}", f"must be true/false, got {value!r}")


@dataclass(frozen=True)
class RopeConfig:
    """Rotary position embedding settings.

    `style` is "neox" (rotate halves, `rotate_half`) or "interleave" (rotate adjacent pairs, as
    DeepSeek MLA's `apply_rotary_pos_emb_interleave`). `rotary_dim` is the number of channels that
    rotate (partial rotary: the first `rotary_dim` channels of a head). `scaling` holds the HF
    `rope_parameters` extras (e.g. yarn factor) as a sorted tuple of items.
    """

    theta: float = 10000.0
    rotary_dim: int = 64
    style: str = "neox"
    scaling_type: str = "default"
    scaling: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        _number(self, "rope.", "theta", positive=True)
        _positive(self, "rope.", "rotary_dim")
        _require(self.rotary_dim % 2 == 0, "rope.rotary_dim", "must be even")
        _require(self.style in ("neox", "interleave"), "rope.style", "must be neox|interleave")
        _require(
            self.scaling_type in ROPE_SCALING_TYPES,
            "rope.scaling_type",
            f"{self.scaling_type!r} not in {ROPE_SCALING_TYPES}",
        )
        needed = {"linear": ("factor",), "yarn": ("factor", "original_max_position_embeddings")}
        for key in needed.get(self.scaling_type, ()):
            _require(
                dict(self.scaling).get(key) is not None,
                f"rope.scaling.{key}",
                f"{self.scaling_type} needs {key!r}",
            )

    def scaling_dict(self) -> dict[str, Any]:
        return dict(self.scaling)


@dataclass(frozen=True)
class LinearAttentionConfig:
    """Linear-attention (KDA / Gated DeltaNet) layer dimensions.

    `num_k_heads` query/key heads of `head_k_dim`; `num_v_heads` value heads of `head_v_dim`
    (GVA: `num_v_heads` is a multiple of `num_k_heads`). `conv_kernel_size` is the short causal
    convolution width W; the carried conv state holds the last W - 1 inputs. `gate_lower_bound`
    (KDA, GLM-5.3-Flash) bounds the log decay below; `projection_layout` (Gated DeltaNet) is
    "grouped" (Qwen3-Next's `in_proj_qkvz` / `in_proj_ba`, rows grouped per key head) or "flat"
    (Qwen3.5's separate `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`).
    """

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel_size: int = 4
    gate_lower_bound: float | None = None
    projection_layout: str = "grouped"

    def __post_init__(self) -> None:
        _positive(self, "linear.", "num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim")
        _positive(self, "linear.", "conv_kernel_size")
        if self.gate_lower_bound is not None:
            _number(self, "linear.", "gate_lower_bound")
            _require(self.gate_lower_bound < 0, "linear.gate_lower_bound", "must be < 0")
        _require(
            self.projection_layout in ("grouped", "flat"),
            "linear.projection_layout",
            f"must be grouped|flat, got {self.projection_layout!r}",
        )
        _require(
            self.num_v_heads % self.num_k_heads == 0,
            "linear.num_v_heads",
            f"must be a multiple of num_k_heads={self.num_k_heads}, got {self.num_v_heads}",
        )


@dataclass(frozen=True)
class MLAConfig:
    """Multi-head latent attention (DeepSeek-V2 section 2.1) dimensions.

    `q_lora_rank` None means a direct q projection. `use_rope=False` is Kimi-Linear's NoPE MLA:
    its `qk_rope_head_dim` channels (e.g. 64) still exist and are shared across heads, but are never
    rotated. The paged cache stores `kv_lora_rank + qk_rope_head_dim` values per token per layer.
    `norm_eps` is the epsilon of `q_a_layernorm` / `kv_a_layernorm` (HF builds both with the
    default 1e-6, not `rms_norm_eps`); `bias` is HF's `attention_bias` (q_a_proj,
    kv_a_proj_with_mqa, o_proj).
    """

    num_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None
    use_rope: bool = True
    norm_eps: float = 1e-6
    bias: bool = False

    def __post_init__(self) -> None:
        _positive(self, "mla.", "num_heads", "kv_lora_rank", "qk_nope_head_dim", "v_head_dim")
        _non_negative(self, "mla.", "qk_rope_head_dim")
        if self.q_lora_rank is not None:
            _positive(self, "mla.", "q_lora_rank")
        _flag(self, "mla.", "use_rope", "bias")
        _number(self, "mla.", "norm_eps", positive=True)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_dim(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True)
class GQAConfig:
    """Grouped-query attention dimensions (Qwen3-Next: q/k RMSNorm and a sigmoid output gate)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    qk_norm: bool = False
    output_gate: bool = False
    bias: bool = False

    def __post_init__(self) -> None:
        _positive(self, "gqa.", "num_heads", "num_kv_heads", "head_dim")
        _flag(self, "gqa.", "qk_norm", "output_gate", "bias")
        _require(
            self.num_heads % self.num_kv_heads == 0,
            "gqa.num_heads",
            f"must be a multiple of num_kv_heads={self.num_kv_heads}",
        )


@dataclass(frozen=True)
class DSAConfig:
    """DeepSeek Sparse Attention lightning indexer (DeepSeek-V3.2 report, section 2.1).

    `index_kpool` > 0 is GLM-5.3-Flash's pooled indexer: keys are compressed over groups of
    `index_kpool` tokens, the best `index_topk / index_kpool` complete pools are selected and the
    incomplete tail pool is added when `index_kpool_always_select_tail`. `indexer_types` (one per
    layer, empty: all "full") marks "shared" DSA layers that reuse the selection of the last
    "full" DSA layer before them in the same step. `index_rope_style` is how the indexer's
    queries and keys rotate: "neox" halves (DeepSeek-V3.2) or "interleave" pairs (GLM-5).
    """

    index_n_heads: int
    index_head_dim: int
    index_topk: int
    index_kpool: int = 0
    index_kpool_always_select_tail: bool = True
    indexer_types: tuple[str, ...] = ()
    index_rope_style: str = "neox"

    def __post_init__(self) -> None:
        _positive(self, "dsa.", "index_n_heads", "index_head_dim", "index_topk")
        _non_negative(self, "dsa.", "index_kpool")
        _flag(self, "dsa.", "index_kpool_always_select_tail")
        object.__setattr__(self, "indexer_types", tuple(self.indexer_types))
        for i, kind in enumerate(self.indexer_types):
            _require(kind in ("full", "shared"), f"dsa.indexer_types[{i}]", "must be full|shared")
        _require(
            self.index_rope_style in ("neox", "interleave"),
            "dsa.index_rope_style",
            f"must be neox|interleave, got {self.index_rope_style!r}",
        )
        if self.index_kpool:
            _require(
                self.index_topk % self.index_kpool == 0,
                "dsa.index_topk",
                f"must be a multiple of index_kpool={self.index_kpool}, got {self.index_topk}",
            )

    def is_shared(self, layer_idx: int) -> bool:
        """True when DSA layer `layer_idx` reuses the last full layer's selection."""
        return bool(self.indexer_types) and self.indexer_types[layer_idx] == "shared"


@dataclass(frozen=True)
class CompressedAttentionConfig:
    """DeepSeek-V4 attention (kinds "swa", "csa", "hca"; paper section 2.3): shared-KV
    multi-query attention with per-head sinks over a `sliding_window` of tokens; "csa" layers
    add entries pooled over overlapping windows of `csa_ratio` tokens, of which a lightning
    indexer (`index_*`) picks `index_topk` per query; "hca" layers add entries pooled over
    windows of `hca_ratio` tokens, all read. Queries go through a `q_lora_rank` bottleneck, the
    output through `o_groups` groups of rank `o_lora_rank`. Compressed layers rotate with
    `compress_rope_theta` (and the `compress_rope_scaling*` of the rope dict), sliding-only ones
    with the model's `rope`."""

    num_heads: int
    head_dim: int
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    sliding_window: int
    csa_ratio: int = 4
    hca_ratio: int = 128
    index_n_heads: int = 64
    index_head_dim: int = 128
    index_topk: int = 512
    compress_rope_theta: float = 160000.0
    compress_rope_scaling_type: str = "default"
    compress_rope_scaling: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        _positive(self, "compressed.", "num_heads", "head_dim", "q_lora_rank", "o_groups",
                  "o_lora_rank", "sliding_window", "csa_ratio", "hca_ratio", "index_n_heads",
                  "index_head_dim", "index_topk")  # fmt: skip
        _number(self, "compressed.", "compress_rope_theta", positive=True)
        object.__setattr__(self, "compress_rope_scaling", tuple(self.compress_rope_scaling))
        _require(
            self.num_heads % self.o_groups == 0,
            "compressed.o_groups",
            f"must divide num_heads={self.num_heads}, got {self.o_groups}",
        )

    def compress_rope(self, rope: RopeConfig) -> RopeConfig:
        """The rope of the compressed layers: `rope`'s rotated channels, this theta and scaling."""
        return dataclasses.replace(
            rope, theta=self.compress_rope_theta, scaling_type=self.compress_rope_scaling_type,
            scaling=self.compress_rope_scaling,
        )  # fmt: skip


@dataclass(frozen=True)
class MoEConfig:
    """Mixture-of-experts FFN.

    `scoring` is "sigmoid" (DeepSeek-V3 / Kimi: grouped top-k over sigmoid scores plus a correction
    bias, weights from the unbiased scores), "softmax" (Qwen3-Next) or "sqrt_softplus"
    (DeepSeek-V4: plain top-k over sqrt(softplus) scores plus the bias; "hash_moe" FFN layers
    take their experts from a token-id table instead). `shared_expert_gate` adds
    Qwen3-Next's sigmoid gate on the shared expert output.
    """

    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    num_shared_experts: int = 0
    shared_intermediate_size: int = 0
    scoring: str = "softmax"
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    norm_topk_prob: bool = True
    has_correction_bias: bool = False
    shared_expert_gate: bool = False

    def __post_init__(self) -> None:
        _positive(self, "moe.", "num_experts", "num_experts_per_tok", "moe_intermediate_size")
        _positive(self, "moe.", "n_group", "topk_group")
        _non_negative(self, "moe.", "num_shared_experts", "shared_intermediate_size")
        _number(self, "moe.", "routed_scaling_factor", positive=True)
        _flag(self, "moe.", "norm_topk_prob", "has_correction_bias", "shared_expert_gate")
        _require(self.scoring in ("softmax", "sigmoid", "sqrt_softplus"), "moe.scoring",
                 "must be softmax|sigmoid|sqrt_softplus")  # fmt: skip
        _require(
            self.num_experts_per_tok <= self.num_experts,
            "moe.num_experts_per_tok",
            f"must be <= num_experts={self.num_experts}",
        )
        _require(
            self.num_experts % self.n_group == 0,
            "moe.n_group",
            f"must divide num_experts={self.num_experts}",
        )
        _require(self.topk_group <= self.n_group, "moe.topk_group", f"must be <= {self.n_group}")


@dataclass(frozen=True)
class QuantizationConfig:
    """Weight quantization (vLLM's `quantization` / HF `quantization_config`): `method` "fp8"
    (float8_e4m3fn weights); `weight_block_size` (bn, bk) rows x columns per weight scale, None
    for one scale per output channel; `activation_scheme` "dynamic" (per-token, per-bk-column
    group scales computed at run time); `modules_to_not_convert` module names (HF or hyla,
    matched as substrings) kept in the model dtype."""

    method: str = "fp8"
    weight_block_size: tuple[int, int] | None = (128, 128)
    activation_scheme: str = "dynamic"
    modules_to_not_convert: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _require(self.method in QUANTIZATION_METHODS, "quantization.method",
                 f"must be one of {QUANTIZATION_METHODS}, got {self.method!r}")  # fmt: skip
        _require(self.activation_scheme == "dynamic", "quantization.activation_scheme",
                 f"only 'dynamic' is supported, got {self.activation_scheme!r}")  # fmt: skip
        block = self.weight_block_size
        if block is not None:
            ok = isinstance(block, (list, tuple)) and len(block) == 2
            ok = ok and all(isinstance(b, int) and b > 0 for b in block)
            _require(ok, "quantization.weight_block_size", f"must be two ints > 0, got {block!r}")
            object.__setattr__(self, "weight_block_size", tuple(block))
        names = self.modules_to_not_convert
        _require(isinstance(names, (list, tuple)) and all(isinstance(n, str) for n in names),
                 "quantization.modules_to_not_convert", "must be a list of names")  # fmt: skip
        object.__setattr__(self, "modules_to_not_convert", tuple(names))


_SUBCONFIGS = {
    "quantization": QuantizationConfig,
    "rope": RopeConfig,
    "linear": LinearAttentionConfig,
    "mla": MLAConfig,
    "gqa": GQAConfig,
    "dsa": DSAConfig,
    "moe": MoEConfig,
    "compressed": CompressedAttentionConfig,
}


@dataclass(frozen=True)
class ModelConfig:
    """A hybrid decoder: one mixer kind and one FFN kind per layer.

    `layer_pattern[i]` is one of `kda`, `gdn` (linear: recurrent state + short-conv state in a
    state slot), `mla`, `gqa` (full attention over the paged KV cache) or `dsa` (MLA whose queries
    attend only to the `dsa.index_topk` tokens the lightning indexer picks). `ffn_pattern[i]` is
    `dense` or `moe`. `norm_offset` is 1.0 for zero-centred RMSNorm weights (Qwen3-Next:
    `x * (1 + w)`), else 0.0. `hc_mult` > 1 carries that many residual streams through the
    layers (GLM-5.3-Flash's manifold-constrained hyper-connections: Sinkhorn-normalised mixing
    with `hc_sinkhorn_iters` and floor `hc_eps`); `swiglu_limit` clamps every SwiGLU's gate
    (above) and up (both sides) projections before the product. `architecture` names the
    adapter family (e.g. "kimi_linear") or "hyla" for the native layout; it decides the
    checkpoint tensor names only. DeepSeek-V4 adds the kinds `swa`, `csa`, `hca`
    (`compressed`), the FFN kind `hash_moe` (experts by token id) and `hc_head_weighted` (the
    streams' final collapse by learned weights instead of their mean).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    layer_pattern: tuple[str, ...]
    ffn_pattern: tuple[str, ...]
    architecture: str = "hyla"
    rms_norm_eps: float = 1e-6
    norm_offset: float = 0.0
    tie_word_embeddings: bool = False
    max_context_len: int = 4096
    kv_cache_dtype: str = "auto"
    mamba_ssm_cache_dtype: str = "float32"
    dtype: str = "float32"
    quantization: QuantizationConfig | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    rope: RopeConfig | None = None
    linear: LinearAttentionConfig | None = None
    mla: MLAConfig | None = None
    gqa: GQAConfig | None = None
    dsa: DSAConfig | None = None
    moe: MoEConfig | None = None
    hc_mult: int = 1
    hc_eps: float = 1e-6
    hc_sinkhorn_iters: int = 20
    swiglu_limit: float | None = None
    compressed: CompressedAttentionConfig | None = None
    hc_head_weighted: bool = False
    extra: tuple[tuple[str, Any], ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        _positive(self, "", "vocab_size", "hidden_size", "intermediate_size", "max_context_len")
        _require(len(self.layer_pattern) > 0, "layer_pattern", "must not be empty")
        for i, kind in enumerate(self.layer_pattern):
            _require(kind in LAYER_KINDS, f"layer_pattern[{i}]", f"{kind!r} not in {LAYER_KINDS}")
        _require(
            len(self.ffn_pattern) == len(self.layer_pattern),
            "ffn_pattern",
            f"length {len(self.ffn_pattern)} != layer_pattern length {len(self.layer_pattern)}",
        )
        for i, kind in enumerate(self.ffn_pattern):
            _require(kind in FFN_KINDS, f"ffn_pattern[{i}]", f"{kind!r} not in {FFN_KINDS}")
        _require(
            self.kv_cache_dtype in KV_CACHE_DTYPES, "kv_cache_dtype", f"not in {KV_CACHE_DTYPES}"
        )
        _require(
            self.dtype in ("float32", "bfloat16", "float16"), "dtype", "float32|bfloat16|float16"
        )
        _require(self.mamba_ssm_cache_dtype in MAMBA_SSM_CACHE_DTYPES, "mamba_ssm_cache_dtype",
                 f"not in {MAMBA_SSM_CACHE_DTYPES}")  # fmt: skip
        kinds = set(self.layer_pattern)
        self._need(kinds & set(LINEAR_KINDS), "linear")
        self._need(kinds & {"mla", "dsa"}, "mla")
        self._need("gqa" in kinds, "gqa")
        self._need("dsa" in kinds, "dsa")
        self._need("moe" in self.ffn_pattern or "hash_moe" in self.ffn_pattern, "moe")
        self._need(kinds & set(COMPRESSED_KINDS), "compressed")
        if "gqa" in kinds or ("mla" in kinds or "dsa" in kinds) and self.mla.use_rope:
            _require(self.rope is not None, "rope", "required by rotary attention layers")
        self._check_scalars()
        self._check_attention_dims(kinds)
        self._check_hyper()

    def _check_scalars(self) -> None:
        _number(self, "", "rms_norm_eps", positive=True)
        _number(self, "", "norm_offset")
        _flag(self, "", "tie_word_embeddings")
        _require(isinstance(self.architecture, str), "architecture", "must be a string")
        if self.bos_token_id is not None:
            _non_negative(self, "", "bos_token_id")
        for i, token in enumerate(self.eos_token_ids):
            _require(
                isinstance(token, int) and not isinstance(token, bool) and token >= 0,
                f"eos_token_ids[{i}]",
                f"must be an integer >= 0, got {token!r}",
            )

    def _check_attention_dims(self, kinds: set[str]) -> None:
        if kinds & {"mla", "dsa"} and self.mla.use_rope:
            _require(
                self.rope.rotary_dim == self.mla.qk_rope_head_dim,
                "rope.rotary_dim",
                f"{self.rope.rotary_dim} != mla.qk_rope_head_dim={self.mla.qk_rope_head_dim}",
            )
        if "dsa" in kinds:
            _require(
                self.mla.q_lora_rank is not None,
                "mla.q_lora_rank",
                "required by dsa layers (the indexer reads the q low-rank activation)",
            )
        if "gqa" in kinds:
            _require(
                self.rope.rotary_dim <= self.gqa.head_dim,
                "rope.rotary_dim",
                f"{self.rope.rotary_dim} > gqa.head_dim={self.gqa.head_dim}",
            )

    def _check_hyper(self) -> None:
        _positive(self, "", "hc_mult", "hc_sinkhorn_iters")
        _number(self, "", "hc_eps", positive=True)
        if self.swiglu_limit is not None:
            _number(self, "", "swiglu_limit", positive=True)
        types = self.dsa.indexer_types if self.dsa is not None else ()
        if not types:
            return
        _require(
            len(types) == self.num_layers,
            "dsa.indexer_types",
            f"length {len(types)} != layer_pattern length {self.num_layers}",
        )
        dsa_layers = self.layer_ids("dsa")
        _require(
            not dsa_layers or types[dsa_layers[0]] == "full",
            f"dsa.indexer_types[{dsa_layers[0] if dsa_layers else 0}]",
            "the first dsa layer must be 'full' (a shared layer reuses an earlier selection)",
        )

    def _need(self, used: Any, name: str) -> None:
        _require(not used or getattr(self, name) is not None, name, "required by the layer pattern")

    @property
    def num_layers(self) -> int:
        return len(self.layer_pattern)

    def layer_ids(self, *kinds: str) -> list[int]:
        return [i for i, k in enumerate(self.layer_pattern) if k in kinds]

    def extra_dict(self) -> dict[str, Any]:
        return dict(self.extra)

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Build from hyla's JSON layout (the `to_dict` output). Raises ConfigError."""
        if not isinstance(data, dict):
            raise ConfigError(f"config: expected a JSON object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known - {"model_type"})
        if unknown:
            raise ConfigError(f"{unknown[0]}: unknown field in hyla config")
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key == "model_type":
                continue
            if key in _SUBCONFIGS and value is not None:
                kwargs[key] = _build_sub(key, value)
            elif key in ("layer_pattern", "ffn_pattern", "eos_token_ids"):
                kwargs[key] = _as_tuple(key, value)
            elif key == "extra":
                if not isinstance(value, dict):
                    raise ConfigError(f"extra: expected an object, got {type(value).__name__}")
                kwargs[key] = tuple(sorted(value.items()))
            else:
                kwargs[key] = value
        missing = [
            f.name
            for f in dataclasses.fields(cls)
            if f.name not in kwargs
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            raise ConfigError(f"{missing[0]}: required field missing from hyla config")
        try:
            return cls(**kwargs)
        except TypeError as e:
            raise ConfigError(f"config: {e}") from e

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["model_type"] = "hyla"
        out["layer_pattern"] = list(self.layer_pattern)
        out["ffn_pattern"] = list(self.ffn_pattern)
        out["eos_token_ids"] = list(self.eos_token_ids)
        out["extra"] = dict(self.extra)
        if self.rope is not None:
            out["rope"]["scaling"] = dict(self.rope.scaling)
        if self.compressed is not None:
            scaling = dict(self.compressed.compress_rope_scaling)
            out["compressed"]["compress_rope_scaling"] = scaling
        return out

    @classmethod
    def from_json(cls, path: str | Path) -> ModelConfig:
        try:
            data = json.loads(Path(path).read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"config: {path} is not valid JSON ({e})") from e
        return cls.from_dict(data)


def _as_tuple(name: str, value: Any) -> tuple:
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{name}: expected a list, got {type(value).__name__}")
    return tuple(value)


def _build_sub(name: str, value: Any) -> Any:
    sub = _SUBCONFIGS[name]
    if not isinstance(value, dict):
        raise ConfigError(f"{name}: expected an object, got {type(value).__name__}")
    known = {f.name for f in dataclasses.fields(sub)}
    for key in value:
        if key not in known:
            raise ConfigError(f"{name}.{key}: unknown field")
    value = dict(value)
    if name == "rope" and "scaling" in value:
        value["scaling"] = tuple(sorted(dict(value["scaling"]).items()))
    if name == "compressed" and "compress_rope_scaling" in value:
        value["compress_rope_scaling"] = tuple(sorted(dict(value["compress_rope_scaling"]).items()))
    try:
        return sub(**value)
    except TypeError as e:
        raise ConfigError(f"{name}: {e}") from e


@dataclass(frozen=True)
class CacheConfig:
    """Paged-cache settings. `block_size` tokens per block; pools are sized from
    `kv_cache_memory` bytes when set, else from `gpu_memory_fraction` of free device memory
    (CPU: of `cpu_cache_memory_default`). `enable_prefix_caching` reuses cached prompt prefixes
    across requests (attention blocks plus linear-state checkpoints); `state_checkpoint_stride`
    is the token stride of linear-state checkpoints, a multiple of block_size; the checkpoint
    pool takes `num_state_checkpoints` state slots of the budget (None: one per stride of
    cached tokens, at most a quarter of the budget)."""

    block_size: int = field(default=16, metadata={"help": "Tokens per paged-cache block."})
    kv_cache_memory: int | None = field(
        default=None,
        metadata={
            "help": "Bytes for cache blocks, state slots and checkpoints: a count or a size "
            "such as 8GiB, 8G, 512MiB, 8GB (default: by fraction).", "cli_type": str,
        },
    )  # fmt: skip
    gpu_memory_utilization: float | None = field(
        default=None,
        metadata={"help": "vLLM's: fraction of the GPU's total memory this engine may use "
                  "(weights and workspace included); the caches take what is left of it once "
                  "the model is loaded (default: --memory-fraction of free memory). A GPU "
                  "option: on the CPU use --kv-cache-memory."},
    )  # fmt: skip
    memory_fraction: float = field(
        default=0.5,
        metadata={
            "help": "Fraction of free device memory for the caches when --kv-cache-memory is unset."
        },
    )
    num_state_slots: int | None = field(
        default=None, metadata={"help": "Linear-attention state slots (default: max_num_seqs)."}
    )
    enable_prefix_caching: bool = field(
        default=True,
        metadata={
            "help": "Reuse cached prompt prefixes: attention blocks plus linear-state checkpoints."
        },
    )
    state_checkpoint_stride: int = field(
        default=256,
        metadata={"help": "Token stride of linear-state checkpoints (a multiple of block_size)."},
    )
    num_blocks: int | None = field(
        default=None,
        metadata={"help": "Usable cache blocks (default: as many as the cache memory holds)."},
    )
    cpu_cache_memory_default: int = field(
        default=512 * 1024**2,
        metadata={"help": "Upper bound in bytes of the cache budget on the CPU."},
    )
    num_state_checkpoints: int | None = field(
        default=None,
        metadata={"help": "State checkpoints for prefix caching (default: one per stride)."},
    )
    kv_cache_dtype: str | None = field(
        default=None,
        metadata={"help": "Attention cache entries: auto, float32, bfloat16, float16 or fp8 "
                  "(e4m3 with one scale per token and head; default: the checkpoint's)."},
    )  # fmt: skip
    mamba_ssm_cache_dtype: str | None = field(
        default=None,
        metadata={"help": "Linear-attention recurrent state: float32 or bfloat16 (default: "
                  "float32)."},
    )  # fmt: skip
    prefix_checkpoint_policy: str = field(
        default="auto",
        metadata={
            "help": "Stride boundaries whose linear state is checkpointed: 'all', 'deepest' "
            "(per chunk, plus those a waiting request asks for), or 'repeat' (chunk ends, and "
            "inside a chunk only prefixes seen before), or 'auto' (repeat on CUDA, all "
            "elsewhere); LRU under the budget."
        },
    )

    kv_offload_host_gib: float = field(
        default=0.0,
        metadata={"help": "GiB of host memory (pinned on CUDA) holding KV blocks and state "
                  "checkpoints evicted from the device (0: off)."},
    )  # fmt: skip
    kv_offload_disk_gib: float = field(
        default=0.0,
        metadata={"help": "GiB of local disk under --kv-offload-disk-dir holding evicted KV "
                  "blocks and state checkpoints (0: off)."},
    )  # fmt: skip
    kv_offload_disk_dir: str | None = field(
        default=None,
        metadata={"help": "Directory of the disk tier (default: a new temporary directory)."},
    )
    kv_offload_remote_url: str | None = field(
        default=None,
        metadata={"help": "A Redis/Valkey store shared by engines, redis://host:port[/db], "
                  "holding evicted and pinned KV blocks and state checkpoints."},
    )  # fmt: skip
    kv_offload_remote_timeout: float = field(
        default=0.25,
        metadata={"help": "Seconds a call to the remote store may take; a slower or failed "
                  "store counts as a miss (recompute) and is skipped for 5 s."},
    )  # fmt: skip

    def __post_init__(self) -> None:
        _check_offload(self)
        if self.kv_cache_memory is not None:
            try:
                object.__setattr__(self, "kv_cache_memory",
                                   parse_bytes(self.kv_cache_memory, "kv_cache_memory"))
            except ValueError as e:
                raise ConfigError(str(e)) from None
        u = self.gpu_memory_utilization
        _require(u is None or (isinstance(u, (int, float)) and 0 < u <= 1),
                 "gpu_memory_utilization", f"must be in (0, 1], got {u!r}")  # fmt: skip
        _positive(self, "", "block_size", "state_checkpoint_stride", "cpu_cache_memory_default")
        for name in ("kv_cache_memory", "num_state_slots", "num_blocks"):
            if getattr(self, name) is not None:
                _positive(self, "", name)
        n = self.num_state_checkpoints
        _require(
            n is None or (isinstance(n, int) and n >= 0), "num_state_checkpoints", "must be >= 0"
        )
        _require(0 < self.memory_fraction <= 1, "memory_fraction", "must be in (0, 1]")
        for name, allowed in (("kv_cache_dtype", KV_CACHE_DTYPES),
                              ("mamba_ssm_cache_dtype", MAMBA_SSM_CACHE_DTYPES)):  # fmt: skip
            value = getattr(self, name)
            _require(value is None or value in allowed, name, f"not in {allowed}, got {value!r}")
        _require(
            self.prefix_checkpoint_policy in ("auto", "all", "deepest", "repeat"),
            "prefix_checkpoint_policy",
            "must be 'auto', 'all', 'deepest' or 'repeat'",
        )
        _require(
            self.state_checkpoint_stride % self.block_size == 0,
            "state_checkpoint_stride",
            f"must be a multiple of block_size={self.block_size}",
        )


SPEC_METHODS = ("ngram",)
# `disable_by_batch_size`: a full batch gains nothing from a draft's eager step and round trip.
DEFAULT_SPEC_DISABLE_BATCH_SIZE = 8


@dataclass(frozen=True)
class SpeculativeConfig:
    """`--speculative-config` in vLLM's JSON form: drafts from n-gram prompt lookup (the last
    n tokens, n from `prompt_lookup_max` down to `prompt_lookup_min`, found earlier in the
    sequence propose the `num_speculative_tokens` that followed them); no step drafts while
    more than `disable_by_batch_size` sequences run."""

    method: str = "ngram"
    num_speculative_tokens: int = 3
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    disable_by_batch_size: int = DEFAULT_SPEC_DISABLE_BATCH_SIZE

    def __post_init__(self) -> None:
        name = "speculative_config"
        _require(self.method in SPEC_METHODS, f"{name}.method",
                 f"must be one of {SPEC_METHODS}, got {self.method!r}")  # fmt: skip
        _positive(self, f"{name}.", "num_speculative_tokens", "disable_by_batch_size")
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        pairs = (("prompt_lookup_min", lo), ("prompt_lookup_max", hi))
        given = [n for n, v in pairs if v is not None]
        _positive(self, f"{name}.", *given)
        lo, hi = (5, 5) if lo is None and hi is None else (lo or hi, hi or lo)  # as vLLM's
        object.__setattr__(self, "prompt_lookup_min", lo)
        object.__setattr__(self, "prompt_lookup_max", hi)
        _require(self.num_speculative_tokens <= 16, f"{name}.num_speculative_tokens",
                 f"must be at most 16, got {self.num_speculative_tokens}")  # fmt: skip
        _require(lo <= hi, f"{name}.prompt_lookup_min",
                 f"must be <= prompt_lookup_max ({hi}), got {lo}")  # fmt: skip

    @classmethod
    def parse(cls, value: Any) -> SpeculativeConfig | None:
        """None, a SpeculativeConfig, a mapping or its JSON text -> a SpeculativeConfig."""
        if value is None or isinstance(value, cls):
            return value
        name = "speculative_config"
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise ConfigError(f"{name}: expected a JSON object such as "
                                  f'{{"method": "ngram", "num_speculative_tokens": 3}}, '
                                  f"got {value!r}") from None  # fmt: skip
        _require(isinstance(value, dict), name, f"expected a JSON object, got {value!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        for key in value:
            _require(key in known, f"{name}.{key}", f"unknown field (known: {sorted(known)})")
        _require("method" in value, f"{name}.method", "is required (ngram)")
        return cls(**value)


def _check_offload(cache: CacheConfig) -> None:
    for name in ("kv_offload_host_gib", "kv_offload_disk_gib", "kv_offload_remote_timeout"):
        value = getattr(cache, name)
        ok = isinstance(value, (int, float)) and value >= 0
        _require(ok, name, f"must be >= 0, got {value!r}")
    _require(cache.kv_offload_remote_timeout > 0, "kv_offload_remote_timeout", "must be > 0")
    url = cache.kv_offload_remote_url
    _require(url is None or url.startswith(("redis://", "rediss://", "unix://")),
             "kv_offload_remote_url", f"must be redis://host:port[/db], got {url!r}")  # fmt: skip


@dataclass(frozen=True)
class SchedulerConfig:
    """Token budgets of one engine step."""

    max_num_batched_tokens: int = field(
        default=2048, metadata={"help": "Token budget of one step (prefill chunks plus decodes)."}
    )
    max_num_seqs: int = field(default=64, metadata={"help": "Most sequences running at once."})
    long_prefill_token_threshold: int = field(
        default=0, metadata={"help": "Cap on one request's prefill chunk per step (0: no cap)."}
    )
    policy: str = field(
        default="fcfs",
        metadata={"help": "Scheduling policy: fcfs or priority (lower value first)."},
    )
    max_step_seconds: float = field(
        default=1.0,
        metadata={"help": "Time budget of a step while a request is decoding: prefill "
                  "chunks are cut to what the measured seconds per token allow, so a long "
                  "prompt does not stall the streams for whole seconds (0: tokens only)."},
    )  # fmt: skip
    max_num_encoder_input_tokens: int = field(
        default=0,
        metadata={"help": "Image tokens the vision encoder may produce per step (0: "
                  "max_num_batched_tokens)."},
    )  # fmt: skip

    def __post_init__(self) -> None:
        _positive(self, "", "max_num_batched_tokens", "max_num_seqs")
        _require(
            isinstance(self.long_prefill_token_threshold, int)
            and self.long_prefill_token_threshold >= 0,
            "long_prefill_token_threshold",
            "must be an integer >= 0 (0: off)",
        )
        _require(self.policy in ("fcfs", "priority"), "policy", "must be fcfs|priority")
        _number(self, "", "max_step_seconds")
        _require(self.max_step_seconds >= 0, "max_step_seconds", "must be >= 0 (0: off)")
        _require(
            isinstance(self.max_num_encoder_input_tokens, int)
            and self.max_num_encoder_input_tokens >= 0,
            "max_num_encoder_input_tokens",
            "must be an integer >= 0 (0: max_num_batched_tokens)",
        )


# --dtype spellings vLLM accepts besides the torch names; "auto" is the default (None).
DTYPE_ALIASES: dict[str, str | None] = {"auto": None, "float": "float32", "half": "float16"}


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs besides the model: cache, scheduler and engine options.

    `max_model_len` None follows the model's `max_context_len`; `dtype` None keeps the
    checkpoint's dtype; `tokenizer` None looks in the checkpoint directory; `seed` seeds the
    sampler of requests without their own seed; `request_timeout` (seconds) finishes a request
    with reason "timeout"; `max_queue_len` bounds the waiting requests (None: unbounded);
    `enforce_eager` turns off CUDA graphs for decode steps. Build from flat keyword arguments
    with `EngineConfig.from_kwargs`.
    """

    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    max_model_len: int | None = field(
        default=None,
        metadata={"help": "Longest sequence, prompt + output (default: the model's context)."},
    )
    dtype: str | None = field(
        default=None,
        metadata={
            "help": "auto (the checkpoint's dtype on a GPU, float32 on the CPU), float32 "
            "(float), bfloat16 or float16 (half); default: auto."
        },
    )
    quantization: str | None = field(
        default=None,
        metadata={"help": "Quantize a float checkpoint's weights at load: fp8 (e4m3, 128x128 "
                  "blocks, dynamic activation scales). Default: as stored (fp8 stays fp8)."},
    )  # fmt: skip
    device: str = field(
        default="auto",
        metadata={"help": "Torch device: cpu, cuda, cuda:N, or auto (cuda when available)."},
    )
    seed: int = field(
        default=0, metadata={"help": "Seed of the sampler of requests without their own seed."}
    )
    tokenizer: str | None = field(
        default=None,
        metadata={"help": "Tokenizer directory (default: the checkpoint directory)."},
    )
    chat_template: str | None = field(
        default=None,
        metadata={"help": "Chat template replacing the tokenizer's, as vLLM's: a file path, "
                  "or the Jinja template itself (default: the tokenizer's)."},
    )  # fmt: skip
    request_timeout: float | None = field(
        default=None,
        metadata={"help": 'Seconds before a request ends with reason "timeout" (default: none).'},
    )
    max_queue_len: int | None = field(
        default=None,
        metadata={"help": "Most waiting requests; more get 503 (default: unbounded)."},
    )
    enforce_eager: bool = field(
        default=False,
        metadata={"help": "Run every step eagerly: no CUDA graphs for decode steps."},
    )
    limit_mm_per_prompt: int = field(
        default=DEFAULT_IMAGES_PER_PROMPT,
        metadata={"help": 'Most images per prompt (multimodal models): a count, or vLLM\'s JSON '
                  'form \'{"image": 4}\' (other modalities only at 0).', "cli_type": str},
    )  # fmt: skip
    max_image_pixels: int = field(
        default=4096 * 4096, metadata={"help": "Most pixels (width x height) of one image."}
    )
    max_image_bytes: int = field(
        default=20 * 2**20, metadata={"help": "Most bytes of one encoded image (data URL)."}
    )
    allowed_local_media_path: str | None = field(
        default=None,
        metadata={"help": "Directory whose files a file:// image URL may read (default: none)."},
    )
    allowed_media_domains: tuple[str, ...] = field(
        default=(),
        metadata={"help": "Hosts http(s) image URLs may be fetched from, comma-separated, "
                  "exact names (default: none: remote images are refused).", "cli_type": str},
    )  # fmt: skip
    media_fetch_timeout: float = field(
        default=5.0,
        metadata={"help": "Seconds one remote image fetch may take, redirects included."},
    )
    piecewise_cuda_graphs: bool = field(
        default=False,
        metadata={"help": "Replay mixed prefill+decode steps from CUDA graphs too: norms and "
                  "MLP/MoE captured per token bucket, mixers eager (experimental; default off)."},
    )  # fmt: skip
    mixed_cuda_graphs: bool = field(
        default=True,
        metadata={"help": "Replay whole mixed prefill+decode steps of up to 2048 tokens from "
                  "CUDA graphs captured per token, sequence and context bucket (KDA/MLA models)."},
    )  # fmt: skip
    tensor_parallel_size: int = field(
        default=1,
        metadata={"help": "Ranks (processes, one GPU each) the model is sharded over."},
    )
    enable_expert_parallel: bool = field(
        default=False,
        metadata={"help": "Split MoE experts whole across the tensor-parallel ranks (default: "
                  "every rank holds a slice of every expert)."},
    )  # fmt: skip
    tool_call_parser: str = field(
        default="auto",
        metadata={"help": "Format of the model's tool calls (vLLM's names): auto (from the chat "
                  "template, then the model family), kimi_k2, deepseek_v31, deepseek_v32, "
                  "glm45, glm47, hermes, qwen3_coder."},
    )  # fmt: skip
    reasoning_parser: str | None = field(
        default=None,
        metadata={"help": "Split <think>...</think> into reasoning_content: auto, deepseek_r1, "
                  "deepseek_v3, qwen3, glm45, kimi_k2 (all one format); default: none."},
    )  # fmt: skip
    speculative_config: SpeculativeConfig | None = field(
        default=None,
        metadata={"help": 'Speculative decoding, vLLM\'s JSON form: \'{"method": "ngram", '
                  '"num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}\' '
                  '(optional "disable_by_batch_size", default 8); default: off.',
                  "cli_type": str},
    )  # fmt: skip
    distributed_executor_backend: str | None = field(
        default=None,
        metadata={"help": "mp (worker processes; also with one rank) or uni (in process, one "
                  "rank only); default: mp when tensor_parallel_size > 1, else uni."},
    )  # fmt: skip

    def __post_init__(self) -> None:
        for name in ("max_model_len", "max_queue_len"):
            if getattr(self, name) is not None:
                _positive(self, "", name)
        _positive(self, "", "max_image_pixels", "max_image_bytes")
        object.__setattr__(self, "limit_mm_per_prompt", images_per_prompt(self.limit_mm_per_prompt))
        object.__setattr__(self, "allowed_media_domains", media_domains(self.allowed_media_domains))
        spec = SpeculativeConfig.parse(self.speculative_config)
        object.__setattr__(self, "speculative_config", spec)
        local = self.allowed_local_media_path  # as vLLM: checked at start, not per request
        _require(local is None or Path(local).is_dir(), "allowed_local_media_path",
                 f"{local!r} is not an existing directory")  # fmt: skip
        _require(self.chat_template is None or bool(str(self.chat_template).strip()),
                 "chat_template", "must not be empty")  # fmt: skip
        timeout = self.media_fetch_timeout  # a socket takes no inf (OverflowError)
        _require(isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
                 and 0 < timeout <= 86400, "media_fetch_timeout",
                 f"must be > 0 seconds and at most a day (86400), got {timeout!r}")  # fmt: skip
        if self.dtype in DTYPE_ALIASES:
            object.__setattr__(self, "dtype", DTYPE_ALIASES[self.dtype])
        if self.dtype is not None:
            _require(
                self.dtype in ("float32", "bfloat16", "float16"),
                "dtype",
                f"must be auto|float32|float|bfloat16|float16|half, got {self.dtype!r}",
            )
        _require(self.quantization in (None, *QUANTIZATION_METHODS), "quantization",
                 f"must be one of {QUANTIZATION_METHODS}, got {self.quantization!r}")  # fmt: skip
        _require(isinstance(self.seed, int) and not isinstance(self.seed, bool), "seed", "integer")
        if self.request_timeout is not None:
            _require(self.request_timeout > 0, "request_timeout", "must be > 0 seconds")
        _require(
            isinstance(self.tensor_parallel_size, int) and self.tensor_parallel_size >= 1,
            "tensor_parallel_size", f"must be an integer >= 1, got {self.tensor_parallel_size!r}",
        )  # fmt: skip
        _require(self.tool_call_parser in TOOL_CALL_PARSERS, "tool_call_parser",
                 f"must be one of {', '.join(TOOL_CALL_PARSERS)}, got {self.tool_call_parser!r}")
        _require(self.reasoning_parser in (None, *REASONING_PARSERS), "reasoning_parser",
                 f"must be one of {', '.join(REASONING_PARSERS)}, got {self.reasoning_parser!r}")
        _require(self.distributed_executor_backend in (None, "mp", "uni"),
                 "distributed_executor_backend",
                 f"must be mp|uni, got {self.distributed_executor_backend!r}")  # fmt: skip
        _require(
            self.distributed_executor_backend != "uni" or self.tensor_parallel_size == 1,
            "distributed_executor_backend", "uni runs one rank: tensor_parallel_size must be 1",
        )  # fmt: skip

    @property
    def uses_executor(self) -> bool:
        """Whether the model runs behind worker processes (`hyla.distributed`)."""
        backend = self.distributed_executor_backend
        return backend == "mp" or (backend is None and self.tensor_parallel_size > 1)

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        """Route flat options to the config owning each field; ConfigError for an unknown name."""
        sub: dict[str, dict[str, Any]] = {"cache": {}, "scheduler": {}}
        top: dict[str, Any] = {}
        own = {f.name for f in dataclasses.fields(cls)}
        fields_of = {
            "cache": {f.name for f in dataclasses.fields(CacheConfig)},
            "scheduler": {f.name for f in dataclasses.fields(SchedulerConfig)},
        }
        for key, value in kwargs.items():
            if key in own:
                top[key] = value
            elif key in fields_of["cache"]:
                sub["cache"][key] = value
            elif key in fields_of["scheduler"]:
                sub["scheduler"][key] = value
            else:
                raise ConfigError(f"{key}: unknown engine option")
        for name, sub_cls in (("cache", CacheConfig), ("scheduler", SchedulerConfig)):
            base = top.get(name, sub_cls())
            top[name] = dataclasses.replace(base, **sub[name]) if sub[name] else base
        return cls(**top)
