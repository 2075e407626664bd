"""Build one rank's model shard and read only its slices from the safetensors files (peak host
memory: the shard plus one slice)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from hyla.config import ModelConfig
from hyla.distributed.groups import TPGroup
from hyla.distributed.sharding import Shard, check_parallel, rank_config, shard_of
from hyla.layers.parallel import ExpertParallelExperts, ParallelLMHead, VocabParallelEmbedding
from hyla.models.checkpoint import CheckpointError, Entry, plan_checkpoint, targets_of
from hyla.models.hybrid import HybridModel
from hyla.models.loader import DTYPES, build_empty_model, checkpoint_files
from hyla.models.quantization import choose_fp8, convert_modules, dequantize_stored
from hyla.models.weights import Placement
from hyla.ops.fp8 import FP8


def build_rank_model(
    config: ModelConfig, tp: TPGroup, expert_parallel: bool, device: str | torch.device
) -> HybridModel:
    """An unloaded shard for `tp.rank`; mixers and FFNs all-reduce their partial-sum outputs."""
    n = tp.world_size
    local = build_empty_model(rank_config(config, n, expert_parallel), device)
    if n == 1:
        return local
    dtype = DTYPES[config.dtype]
    # fp8 experts are allocated when `load_rank_model` converts them
    experts_device = "meta" if config.quantization is not None else device
    with torch.device(device):
        local.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, tp)
        local.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, tp)
        if config.tie_word_embeddings:
            local.lm_head.weight = local.embed_tokens.weight
        for layer in local.layers:
            if expert_parallel and hasattr(layer.mlp, "experts"):
                moe = config.moe
                num_local = moe.num_experts // n
                with torch.device(experts_device):
                    experts = ExpertParallelExperts(
                        config.hidden_size, moe.moe_intermediate_size, num_local,
                        tp.rank * num_local,
                    )  # fmt: skip
                layer.mlp.experts = experts.to(dtype)
    local.embed_tokens.to(dtype)
    local.lm_head.to(dtype)
    for layer in local.layers:
        for module in (layer.mixer, layer.mlp):
            module.register_forward_hook(_all_reduce_output(tp))
    return local


def _all_reduce_output(tp: TPGroup):
    def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        return tp.all_reduce(output)

    return hook


@torch.no_grad()
def load_rank_model(
    path: str | Path,
    config: ModelConfig,
    tp: TPGroup,
    expert_parallel: bool,
    device: str | torch.device = "cpu",
) -> HybridModel:
    """`tp.rank`'s shard, in eval mode. Raises: ConfigError, CheckpointError before any read."""
    check_parallel(config, tp.world_size, expert_parallel)
    files, full_targets, entries = check_checkpoint(path, config)
    model = build_rank_model(config, tp, expert_parallel, device)
    if config.quantization is not None:  # fp8 modules stay as stored
        stored_fp8 = {p.target for e in entries if e.scale is not None for p in e.placements}
        chosen = choose_fp8(model, stored_fp8, quantize_floats=False)
        convert_modules(model, chosen, DTYPES[config.dtype], device)
    targets, _ = targets_of(model)
    specs = {
        name: shard_of(name.removesuffix("_scale_inv"), config, tp.rank, tp.world_size,
                       expert_parallel)
        for name in targets
    }  # fmt: skip
    for name, spec in specs.items():
        if spec is not None:
            targets[name].zero_()  # vocab padding, and row-parallel biases off rank 0
    block = config.quantization.weight_block_size if config.quantization else None
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for entry in (e for e in entries if e.file == file):
                scale = _stored_scale(entry, f)
                _copy_entry(entry, f, full_targets, targets, specs, scale, block)
    return model.eval()


def _stored_scale(entry: Entry, f) -> torch.Tensor | None:  # noqa: ANN001
    if entry.scale is None:
        return None
    name, file = entry.scale
    if file == entry.file:
        return f.get_tensor(name)
    with safe_open(str(file), framework="pt") as other:
        return other.get_tensor(name)


def check_checkpoint(
    path: str | Path, config: ModelConfig
) -> tuple[list[Path], dict[str, torch.Tensor], list[Entry]]:
    """(files, full model's meta tensors, entries) from the headers. Raises: CheckpointError."""
    files = checkpoint_files(path)
    with torch.device("meta"):
        full = HybridModel(config)
    full_targets, full_aliases = targets_of(full)
    return files, full_targets, plan_checkpoint(config, full_targets, full_aliases, files)


def _copy_entry(
    entry: Entry,
    f,
    full_targets: dict[str, torch.Tensor],
    targets: dict[str, torch.Tensor],
    specs: dict[str, Shard | None],
    scale: torch.Tensor | None = None,
    block: tuple[int, int] | None = None,
) -> None:
    """Copy the rank's slices of one stored tensor; fp8 ones are dequantized for a float target."""
    stored = f.get_slice(entry.name)
    offset = 0  # a tensor split across targets holds consecutive dim-0 chunks
    for p in entry.placements:
        full_shape = tuple(full_targets[p.target].shape)
        rows = (full_shape[1:] if p.expert is not None else full_shape)[0] // p.num_parts
        local, shard = targets[p.target], specs[p.target]
        if scale is not None and local.dtype == FP8:
            _copy_fp8_scale(p, full_shape, offset, shard, targets, scale, block)
        elif scale is not None:
            stored = dequantize_stored(stored[:], scale, block).to(local.dtype)
            scale = None
        for src, dst in _pieces(p, full_shape, offset, shard, local):
            dst.copy_(stored[src])
        offset += rows


def _copy_fp8_scale(
    p: Placement,
    full_shape: tuple[int, ...],
    offset: int,
    shard: Shard | None,
    targets: dict[str, torch.Tensor],
    scale: torch.Tensor,
    block: tuple[int, int],
) -> None:
    """The same pieces one level down: every size and offset divided by its block dim."""
    lead = 1 if p.expert is not None else 0
    bn, bk = block
    per_dim = {lead: bn, lead + 1: bk}
    rows = full_shape[lead] // p.num_parts
    cut = [(rows, offset, bn)] if p.num_parts > 1 or offset else []
    if shard is not None and shard.dim in per_dim:
        b = per_dim[shard.dim]
        cut += [(n // shard.num_parts, 0, b) for n in shard.segments]
    for size, start, b in cut:
        if size % b or start % b:
            raise CheckpointError(f"{p.target}: a slice of {size} rows/cols at {start} is not "
                                  f"whole {b}-wide fp8 blocks; use tensor_parallel_size 1")
    scaled = [-(-n // per_dim.get(d, 1)) for d, n in enumerate(full_shape)]
    scaled[lead] = p.num_parts * -(-rows // bn)  # each part has its own block grid
    shard_s = None
    if shard is not None:
        b = per_dim.get(shard.dim, 1)
        shard_s = dataclasses.replace(shard, segments=tuple(-(-n // b) for n in shard.segments))
    local = targets[p.target + "_scale_inv"]
    for src, dst in _pieces(p, tuple(scaled), offset // bn, shard_s, local):
        dst.copy_(scale[src].float())


def _pieces(
    p: Placement,
    full_shape: tuple[int, ...],
    offset: int,
    shard: Shard | None,
    local: torch.Tensor,
) -> list[tuple[tuple[slice, ...], torch.Tensor]]:
    """(stored index, destination view) pairs: the placement fills rows [r0, r0 + rows) of
    `target[expert]`, held in the stored dim 0 from `offset` on."""
    dst, lead = local, 0
    if p.expert is not None:
        expert = p.expert
        if shard is not None and shard.dim == 0:  # EP: whole experts
            lo, hi = shard.ranges()[0]
            if not lo <= expert < hi:
                return []
            expert, shard = expert - lo, None
        dst, lead = local[expert], 1
    rows = full_shape[lead] // p.num_parts
    r0 = p.part * rows
    if shard is not None and shard.first_rank_only:
        return [((slice(offset, offset + rows),), dst[r0 : r0 + rows])] if shard.part == 0 else []
    if shard is None:
        return [((slice(offset, offset + rows),), dst[r0 : r0 + rows])]
    d = shard.dim - lead
    pieces, pos = [], 0
    for (lo, hi), size in zip(shard.ranges(), shard.local_sizes(), strict=True):
        if d == 0:
            a, b = max(lo, r0), min(hi, r0 + rows)
            if a < b:
                src = (slice(a - r0 + offset, b - r0 + offset),)
                pieces.append((src, dst[pos + a - lo : pos + b - lo]))
        elif lo < hi:
            src = (slice(offset, offset + rows),) + (slice(None),) * (d - 1) + (slice(lo, hi),)
            pieces.append((src, dst[r0 : r0 + rows].narrow(d, pos, hi - lo)))
        pos += size
    return pieces
