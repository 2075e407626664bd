"""What each rank holds: its ModelConfig (heads and FFN widths / N) and the slice of every weight.
Output rows split for q/k/v, gates and gate/up; input columns for o/out/down_proj (one all-reduce
per mixer and FFN); ceil(V / N) zero-padded rows of embed_tokens/lm_head. Replicated: norms,
routers, MLA q_a/kv_a (the latent is per token), the DSA indexer, KDA f_a/g_a, and GQA KV heads
fewer than N (rank r holds head r * HKV // N). Segmented weights (q | k | v) split each segment.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from hyla.config import ConfigError, ModelConfig
from hyla.layers.moe import shared_width

SUPPORTED_KINDS = ("kda", "gdn", "mla", "gqa", "dsa")


@dataclass(frozen=True)
class Shard:
    """Part `part` of each of `segments` (back to back along `dim`) cut into `num_parts`, the
    short last one zero-padded. `first_rank_only`: a row-parallel bias, held by rank 0 only."""

    dim: int
    segments: tuple[int, ...]
    num_parts: int
    part: int
    first_rank_only: bool = False

    def ranges(self) -> list[tuple[int, int]]:
        out, start = [], 0
        for size in self.segments:
            n = -(-size // self.num_parts)
            lo = min(size, self.part * n)
            out.append((start + lo, start + min(size, lo + n)))
            start += size
        return out

    def local_sizes(self) -> list[int]:
        return [-(-size // self.num_parts) for size in self.segments]


def check_parallel(config: ModelConfig, tp_size: int, expert_parallel: bool) -> None:
    """ConfigError when `tp_size` cannot shard `config` (also used by `hyla plan`: one rule)."""
    if tp_size < 1:
        raise ConfigError(f"tensor_parallel_size: must be >= 1, got {tp_size}")
    if tp_size == 1:
        return
    unsupported = sorted(set(config.layer_pattern) - set(SUPPORTED_KINDS))
    if unsupported:
        raise ConfigError(f"tensor_parallel_size: layer kinds {unsupported} cannot be sharded")
    if config.quantization is not None:
        _check_fp8_blocks(config, tp_size, expert_parallel)
    for name, value in _divisible_fields(config, expert_parallel):
        if value % tp_size:
            raise ConfigError(f"tensor_parallel_size: {tp_size} does not divide {name}={value}")
    gqa = config.gqa
    if gqa is not None and "gqa" in config.layer_pattern and gqa.num_kv_heads < tp_size:
        if tp_size % gqa.num_kv_heads:
            raise ConfigError(
                f"tensor_parallel_size: {tp_size} must be a multiple of "
                f"gqa.num_kv_heads={gqa.num_kv_heads} (KV heads are replicated)"
            )
    if expert_parallel and config.moe is None:
        raise ConfigError("enable_expert_parallel: the model has no MoE layers")


def _check_fp8_blocks(config: ModelConfig, tp: int, expert_parallel: bool) -> None:
    """fp8 weights are sharded as stored, scales with their blocks: slices must be whole blocks."""
    quant = config.quantization
    if quant.weight_block_size is None:
        raise ConfigError("tensor_parallel_size: fp8 weights with per-tensor or per-channel "
                          "scales cannot be sharded yet (use 1)")  # fmt: skip
    if set(config.layer_pattern) & {"kda", "gdn"}:
        raise ConfigError("tensor_parallel_size: fp8 weights of linear-attention layers "
                          "(kda/gdn) cannot be sharded yet (use 1)")  # fmt: skip
    bn, bk = quant.weight_block_size
    for field_name, size, block in _fp8_cuts(config, tp, expert_parallel, bn, bk):
        if size % block:
            raise ConfigError(
                f"tensor_parallel_size: {tp} cuts fp8 blocks: {field_name} gives {size} per "
                f"rank, not a multiple of quantization.weight_block_size's {block}"
            )


def _fp8_cuts(
    config: ModelConfig, tp: int, expert_parallel: bool, bn: int, bk: int
) -> list[tuple[str, int, int]]:
    kinds, out = set(config.layer_pattern), []
    if kinds & {"mla", "dsa"}:
        m, heads = config.mla, config.mla.num_heads // tp
        out += [("mla.num_heads x qk_head_dim (q rows)", heads * m.qk_head_dim, bn),
                ("mla.num_heads x v_head_dim (o_proj columns)", heads * m.v_head_dim, bk)]
    if "gqa" in kinds:
        g, heads = config.gqa, config.gqa.num_heads // tp
        gate = 2 if g.output_gate else 1
        out += [("gqa.num_heads x head_dim (q rows)", heads * g.head_dim * gate, bn),
                ("gqa.num_kv_heads x head_dim (k/v rows)",
                 max(g.num_kv_heads // tp, 1) * g.head_dim, bn),
                ("gqa.num_heads x head_dim (o_proj columns)", heads * g.head_dim, bk)]
    widths = []
    if "dense" in config.ffn_pattern:
        widths.append(("intermediate_size", config.intermediate_size))
    moe = config.moe
    if moe is not None and "moe" in config.ffn_pattern:
        if not expert_parallel:
            widths.append(("moe.moe_intermediate_size", moe.moe_intermediate_size))
        if shared_width(moe):
            widths.append(("moe.shared_intermediate_size", shared_width(moe)))
    for name, width in widths:
        out += [(name, width // tp, bn), (name, width // tp, bk)]
    return out  # fmt: skip


def _divisible_fields(config: ModelConfig, expert_parallel: bool) -> list[tuple[str, int]]:
    kinds = set(config.layer_pattern)
    out: list[tuple[str, int]] = []
    if kinds & {"kda", "gdn"}:
        out += [("linear.num_k_heads", config.linear.num_k_heads),
                ("linear.num_v_heads", config.linear.num_v_heads)]  # fmt: skip
    if kinds & {"mla", "dsa"}:
        out.append(("mla.num_heads", config.mla.num_heads))
    if "gqa" in kinds:
        out.append(("gqa.num_heads", config.gqa.num_heads))
    if "dense" in config.ffn_pattern:
        out.append(("intermediate_size", config.intermediate_size))
    moe = config.moe
    if moe is not None and "moe" in config.ffn_pattern:
        if expert_parallel:
            out.append(("moe.num_experts", moe.num_experts))
        else:
            out.append(("moe.moe_intermediate_size", moe.moe_intermediate_size))
        if shared_width(moe):
            out.append(("moe.shared_intermediate_size", shared_width(moe)))
    return out


def rank_config(config: ModelConfig, tp_size: int, expert_parallel: bool) -> ModelConfig:
    """Every rank's shard config: heads and widths / N. The vocabulary stays whole (token ids are
    validated against it); under EP the router keeps all experts."""
    if tp_size == 1:
        return config
    n = tp_size
    changes: dict = {"intermediate_size": max(config.intermediate_size // n, 1)}
    if config.linear is not None:
        lin = config.linear
        changes["linear"] = dataclasses.replace(
            lin, num_k_heads=lin.num_k_heads // n, num_v_heads=lin.num_v_heads // n
        )
    if config.mla is not None:
        changes["mla"] = dataclasses.replace(config.mla, num_heads=config.mla.num_heads // n)
    if config.gqa is not None:
        gqa = config.gqa
        changes["gqa"] = dataclasses.replace(
            gqa, num_heads=gqa.num_heads // n, num_kv_heads=max(gqa.num_kv_heads // n, 1)
        )
    if config.moe is not None:
        moe = config.moe
        width = shared_width(moe) // n
        inter = moe.moe_intermediate_size if expert_parallel else moe.moe_intermediate_size // n
        changes["moe"] = dataclasses.replace(
            moe, moe_intermediate_size=inter, shared_intermediate_size=width
        )
    return config.replace(**changes)


_LAYER = re.compile(r"^layers\.(\d+)\.(mixer|mlp)\.(.+)$")


def shard_of(
    name: str, config: ModelConfig, rank: int, tp_size: int, expert_parallel: bool
) -> Shard | None:
    """`rank`'s slice of state-dict weight `name`; None when replicated."""
    if tp_size == 1:
        return None
    if name in ("embed_tokens.weight", "lm_head.weight"):
        return Shard(0, (config.vocab_size,), tp_size, rank)
    m = _LAYER.match(name)
    if m is None:
        return None
    layer, part, leaf = int(m.group(1)), m.group(2), m.group(3)
    if part == "mixer":
        rule = _mixer_rule(config, config.layer_pattern[layer], leaf, tp_size)
    else:
        rule = _ffn_rule(config, config.ffn_pattern[layer], leaf, expert_parallel)
    if rule is None:
        return None
    dim, segments, *rest = rule
    if rest and rest[0] == "bias":
        return Shard(dim, segments, 1, 0, first_rank_only=True)
    num_parts = rest[0] if rest else tp_size
    return Shard(dim, segments, num_parts, rank * num_parts // tp_size)


def _mixer_rule(config: ModelConfig, kind: str, leaf: str, tp_size: int) -> tuple | None:
    if kind not in ("kda", "gdn", "gqa", "mla", "dsa"):
        return None
    if kind in ("kda", "gdn"):
        return _linear_rule(config, kind, leaf)
    if kind == "gqa":
        g = config.gqa
        q_rows = g.num_heads * g.head_dim * (2 if g.output_gate else 1)
        kv_rows = g.num_kv_heads * g.head_dim
        kv_parts = min(g.num_kv_heads, tp_size)
        return {
            "q_proj.weight": (0, (q_rows,)), "q_proj.bias": (0, (q_rows,)),
            "k_proj.weight": (0, (kv_rows,), kv_parts),
            "k_proj.bias": (0, (kv_rows,), kv_parts),
            "v_proj.weight": (0, (kv_rows,), kv_parts),
            "v_proj.bias": (0, (kv_rows,), kv_parts),
            "o_proj.weight": (1, (g.num_heads * g.head_dim,)), "o_proj.bias": (0, (0,), "bias"),
        }.get(leaf)  # fmt: skip
    mla = config.mla
    q_rows = mla.num_heads * mla.qk_head_dim
    return {
        "q_proj.weight": (0, (q_rows,)), "q_b_proj.weight": (0, (q_rows,)),
        "kv_b_proj.weight": (0, (mla.num_heads * (mla.qk_nope_head_dim + mla.v_head_dim),)),
        "o_proj.weight": (1, (mla.num_heads * mla.v_head_dim,)), "o_proj.bias": (0, (0,), "bias"),
    }.get(leaf)  # fmt: skip


def _linear_rule(config: ModelConfig, kind: str, leaf: str) -> tuple | None:
    lin = config.linear
    key, value = lin.num_k_heads * lin.head_k_dim, lin.num_v_heads * lin.head_v_dim
    hv = lin.num_v_heads
    if kind == "kda":
        a_log_dim = 0 if lin.gate_lower_bound is not None else 2
        return {
            "q_proj.weight": (0, (key,)), "k_proj.weight": (0, (key,)),
            "v_proj.weight": (0, (value,)), "q_conv1d.weight": (0, (key,)),
            "k_conv1d.weight": (0, (key,)), "v_conv1d.weight": (0, (value,)),
            "f_b_proj.weight": (0, (hv * lin.head_k_dim,)), "dt_bias": (0, (hv * lin.head_k_dim,)),
            "A_log": (a_log_dim, (hv,)), "b_proj.weight": (0, (hv,)),
            "g_b_proj.weight": (0, (value,)), "o_proj.weight": (1, (value,)),
        }.get(leaf)  # fmt: skip
    return {  # gdn: rows are grouped per key head, so a contiguous block is whole key heads
        "in_proj_qkvz.weight": (0, (2 * key + 2 * value,)), "in_proj_ba.weight": (0, (2 * hv,)),
        "in_proj_qkv.weight": (0, (key, key, value)), "in_proj_z.weight": (0, (value,)),
        "in_proj_b.weight": (0, (hv,)), "in_proj_a.weight": (0, (hv,)),
        "conv1d.weight": (0, (key, key, value)), "dt_bias": (0, (hv,)), "A_log": (0, (hv,)),
        "out_proj.weight": (1, (value,)),
    }.get(leaf)  # fmt: skip


def _ffn_rule(config: ModelConfig, kind: str, leaf: str, expert_parallel: bool) -> tuple | None:
    if kind == "dense":
        return _mlp_rule(config.intermediate_size, leaf)
    moe = config.moe
    if leaf.startswith("shared_experts."):
        return _mlp_rule(shared_width(moe), leaf.removeprefix("shared_experts."))
    inter, num_experts = moe.moe_intermediate_size, moe.num_experts
    if leaf in ("experts.gate_up_proj", "experts.down_proj"):
        if expert_parallel:
            return (0, (num_experts,))
        if leaf == "experts.gate_up_proj":
            return (1, (inter, inter))
        return (2, (inter,))
    return None


def _mlp_rule(width: int, leaf: str) -> tuple | None:
    return {
        "gate_proj.weight": (0, (width,)), "up_proj.weight": (0, (width,)),
        "down_proj.weight": (1, (width,)),
    }.get(leaf)  # fmt: skip
