"""Per-token and per-sequence model costs, split as parallelism splits them (weights, paged cache
per token, linear state per sequence). FLOPs count 2 per multiply-add."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from hyla.cache.spec import DTYPE_BYTES, bytes_per_state_slot, bytes_per_token, layer_cache_specs
from hyla.config import ModelConfig
from hyla.distributed.sharding import rank_config, shard_of
from hyla.models.inspect import stored_model
from hyla.models.loader import build_empty_model
from hyla.plan import compressed_costs as v4

LINEAR_CHUNK = 64  # tokens per chunk of the chunked delta rule (intra-chunk FLOPs)


@dataclass(frozen=True)
class ParamSplit:
    """Parameter counts: `embedding` (one table when tied), routed `experts`, `dense` (the rest);
    `*_bytes` as stored (fp8 + block scales); `replicated_bytes`: the part of `dense_bytes` every
    TP rank holds whole; `vision_bytes`: rank 0's vision tower (not in the counts)."""

    embedding: int
    experts: int
    dense: int
    num_moe_layers: int
    embedding_bytes: int = 0
    experts_bytes: int = 0
    dense_bytes: int = 0
    head_bytes: int = 0
    replicated_bytes: int = 0
    vision_bytes: int = 0

    @property
    def total(self) -> int:
        return self.embedding + self.experts + self.dense

    def rank_weight_bytes(self, tp: int, ep: int) -> int:
        """Weight bytes of one rank of a TP group of `tp` (`ep` > 1: experts over `ep` ranks)."""
        split = self.embedding_bytes + self.dense_bytes - self.replicated_bytes
        whole = self.replicated_bytes + self.vision_bytes
        return whole + split // tp + self.experts_bytes // (ep if ep > 1 else tp)


def _group(name: str) -> str:
    if name.startswith(("embed_tokens.", "lm_head.")):
        return "embedding"
    return "experts" if ".mlp.experts." in name else "dense"


def param_split(
    config: ModelConfig,
    path: Path | None = None,
    quantize_floats: bool | None = None,
    vision_bytes: int = 0,
) -> ParamSplit:
    """Split `config`'s weights (built on meta); bytes as `hyla inspect` counts the checkpoint's."""
    counts = {"embedding": 0, "experts": 0, "dense": 0}
    model = build_empty_model(config.replace(dtype="float32"), "meta")
    for name, p in model.state_dict(keep_vars=True).items():
        counts[_group(name)] += p.numel()
    nbytes = {"embedding": 0, "experts": 0, "dense": 0}
    head = replicated = 0
    stored = stored_model(config, path, quantize_floats)
    for name, p in stored.state_dict(keep_vars=True).items():
        size = p.numel() * p.element_size()
        nbytes[_group(name)] += size
        if name.startswith("lm_head.") or (config.tie_word_embeddings and
                                           name.startswith("embed_tokens.")):  # fmt: skip
            head += size
        weight = name.removesuffix("_scale_inv")  # an fp8 block scale splits with its weight
        if _group(name) == "dense" and shard_of(weight, config, 0, 2, False) is None:
            replicated += size
    return ParamSplit(
        counts["embedding"], counts["experts"], counts["dense"], config.ffn_pattern.count("moe"),
        nbytes["embedding"], nbytes["experts"], nbytes["dense"], head, replicated, vision_bytes,
    )  # fmt: skip


def vision_tower_bytes(raw: dict, dtype: str) -> int:
    """Bytes in `dtype` of the vision tower a config.json `raw` describes (0 without one)."""
    from hyla.models.vision_loader import TOWERS

    family = raw.get("model_type")
    if family not in TOWERS or "vision_config" not in raw:
        return 0
    tower_cls, config_cls = TOWERS[family]
    with torch.device("meta"):
        tower = tower_cls(config_cls.from_hf(raw["vision_config"]))
    return sum(p.numel() for p in tower.state_dict().values()) * DTYPE_BYTES[dtype]


def cache_bytes_per_token(config: ModelConfig, tp: int = 1, ep: bool = False) -> int:
    """Paged-cache bytes of one token on one GPU of a TP group of `tp`, as allocated."""
    return bytes_per_token(rank_config(config, tp, ep))


def state_bytes_per_seq(config: ModelConfig, tp: int = 1, ep: bool = False) -> int:
    """Linear-layer state bytes of one sequence on one GPU of a TP group of `tp`."""
    return bytes_per_state_slot(rank_config(config, tp, ep))


def attention_read_bytes(config: ModelConfig, context: int, tp: int = 1) -> float:
    """Cache bytes a decode token reads at `context` on one GPU (dsa: `index_topk` latents)."""
    own = rank_config(config, tp, False)
    total = 0.0
    for i, kind in enumerate(own.layer_pattern):
        for spec in layer_cache_specs(own, i):
            if spec.per != "token":
                continue
            sparse = kind == "dsa" and spec.name.startswith("latent")
            total += (min(context, own.dsa.index_topk) if sparse else context) * spec.nbytes
    return total


def _mixer_flops_per_token(config: ModelConfig, kind: str, context: float, prefill: bool) -> float:
    """Per-token FLOPs of one `kind` layer; prefill MLA runs expanded, decode and DSA absorbed."""
    if kind in ("kda", "gdn"):
        lin = config.linear
        state = 4 * lin.num_v_heads * lin.head_k_dim * lin.head_v_dim
        intra = 2 * lin.num_v_heads * LINEAR_CHUNK * (lin.head_k_dim + lin.head_v_dim)
        return state + (intra if prefill else 0)
    if kind == "gqa":
        return 4 * config.gqa.num_heads * config.gqa.head_dim * context
    if v4.is_compressed(kind):
        return v4.flops_per_token(config, kind, context)
    m = config.mla
    absorbed = 2 * m.num_heads * (2 * m.kv_lora_rank + m.qk_rope_head_dim)
    if kind == "mla":
        if prefill:
            return (
                2 * m.num_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim) * context
            )
        return absorbed * context
    indexer = 2 * config.dsa.index_n_heads * config.dsa.index_head_dim * context
    return indexer + absorbed * min(context, config.dsa.index_topk)


def attention_flops(config: ModelConfig, context: float, prefill: bool = False) -> float:
    return sum(_mixer_flops_per_token(config, k, context, prefill) for k in config.layer_pattern)


def prefill_attention_flops(config: ModelConfig, num_tokens: int) -> float:
    """Attention FLOPs of a causal prefill of `num_tokens`, in closed form (T^2/2; DSA capped)."""
    t = float(num_tokens)
    total = 0.0
    for kind in config.layer_pattern:
        if kind in ("kda", "gdn"):
            total += t * _mixer_flops_per_token(config, kind, 0, True)
        elif kind in ("gqa", "mla"):
            total += _mixer_flops_per_token(config, kind, 1.0, True) * t * t / 2
        elif v4.is_compressed(kind):  # linear past the window
            total += t * v4.flops_per_token(config, kind, t / 2)
        else:
            m, k = config.mla, config.dsa.index_topk
            absorbed = 2 * m.num_heads * (2 * m.kv_lora_rank + m.qk_rope_head_dim)
            indexer = 2 * config.dsa.index_n_heads * config.dsa.index_head_dim
            head = min(t, k)
            total += indexer * t * t / 2 + absorbed * (head * head / 2 + max(0.0, t - k) * k)
    return total
