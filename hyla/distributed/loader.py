"""Build one rank's model shard and read only its slices from the safetensors files.

    config.json -> full ModelConfig -> check_parallel (errors before any weight is read)
      full model on the meta device: names and full shapes, checked against the file headers
      rank model from `rank_config` (+ vocab-parallel embedding/head, EP experts), and an
        all-reduce after every mixer and every FFN (their outputs are partial sums)
      each stored tensor: `safe_open(...).get_slice(name)[rows, cols]` for the rank's ranges

Peak host memory per rank is its shard plus one slice.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from hyla.config import ModelConfig
from hyla.distributed.groups import TPGroup
from hyla.distributed.sharding import Shard, check_parallel, rank_config, shard_of
from hyla.layers.parallel import ExpertParallelExperts, ParallelLMHead, VocabParallelEmbedding
from hyla.models.checkpoint import Entry, plan_checkpoint, targets_of
from hyla.models.hybrid import HybridModel
from hyla.models.loader import DTYPES, build_empty_model, checkpoint_files
from hyla.models.weights import Placement


def build_rank_model(
    config: ModelConfig, tp: TPGroup, expert_parallel: bool, device: str | torch.device
) -> HybridModel:
    """An unloaded shard of `config` for `tp.rank` (parameters allocated, not initialised),
    whose mixers and FFNs all-reduce their outputs over the group."""
    n = tp.world_size
    local = build_empty_model(rank_config(config, n, expert_parallel), device)
    if n == 1:
        return local
    dtype = DTYPES[config.dtype]
    with torch.device(device):
        local.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, tp)
        local.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, tp)
        if config.tie_word_embeddings:
            local.lm_head.weight = local.embed_tokens.weight
        for layer in local.layers:
            if expert_parallel and hasattr(layer.mlp, "experts"):
                moe = config.moe
                num_local = moe.num_experts // n
                experts = ExpertParallelExperts(
                    config.hidden_size, moe.moe_intermediate_size, num_local, tp.rank * num_local
                )
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
    """`tp.rank`'s shard of the checkpoint at `path` (`config`: the full model's, dtype and
    cache dtypes already applied), in eval mode.

    Raises: ConfigError (the TP size does not fit the model) and CheckpointError (tensors do
    not fit the model), both before any weight is read.
    """
    check_parallel(config, tp.world_size, expert_parallel)
    files, full_targets, entries = check_checkpoint(path, config)
    model = build_rank_model(config, tp, expert_parallel, device)
    targets, _ = targets_of(model)
    specs = {
        name: shard_of(name, config, tp.rank, tp.world_size, expert_parallel) for name in targets
    }
    for name, spec in specs.items():
        if spec is not None:
            targets[name].zero_()  # vocab padding, and row-parallel biases off rank 0
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for entry in (e for e in entries if e.file == file):
                _copy_entry(entry, f, full_targets, targets, specs)
    return model.eval()


def check_checkpoint(
    path: str | Path, config: ModelConfig
) -> tuple[list[Path], dict[str, torch.Tensor], list[Entry]]:
    """The checkpoint's files, the full model's tensors (meta) and every stored tensor's
    destinations, from the headers alone. Raises CheckpointError listing every problem."""
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
) -> None:
    stored = f.get_slice(entry.name)
    offset = 0  # a tensor split across targets: its consecutive dim-0 chunks
    for p in entry.placements:
        full_shape = tuple(full_targets[p.target].shape)
        rows = (full_shape[1:] if p.expert is not None else full_shape)[0] // p.num_parts
        for src, dst in _pieces(p, full_shape, offset, specs[p.target], targets[p.target]):
            dst.copy_(stored[src])
        offset += rows


def _pieces(
    p: Placement,
    full_shape: tuple[int, ...],
    offset: int,
    shard: Shard | None,
    local: torch.Tensor,
) -> list[tuple[tuple[slice, ...], torch.Tensor]]:
    """(index into the stored tensor, destination view) pairs of one placement's slices.

    The placement fills rows [r0, r0 + rows) of `target[expert]` (or `target`); the stored
    tensor's dim 0 holds those rows from `offset` on. A shard along the expert dim picks the
    expert; along another dim it keeps the intersection of its ranges with the placement."""
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
