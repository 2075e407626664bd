"""Size the block and state-slot pools from a memory budget. Slots are paid first; automatic
checkpoints (one per stride of blocks, plus two per slot: a request's tail and its in-flight save)
take at most a quarter of the rest; blocks get the remainder, capped at what the sequences can use.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

from hyla.cache.manager import num_blocks_for
from hyla.cache.spec import bytes_per_state_slot, bytes_per_token
from hyla.config import CacheConfig, ConfigError, ModelConfig

logger = logging.getLogger("hyla.engine")

MIB = 1024 * 1024


@dataclass(frozen=True)
class CachePlan:
    """Pool sizes (including the reserved block 0 and slot 0) and their byte costs."""

    num_blocks: int
    num_slots: int
    block_size: int
    bytes_per_block: int
    bytes_per_slot: int
    num_checkpoints: int = 0

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_usable_slots(self) -> int:
        return self.num_slots - 1

    @property
    def total_bytes(self) -> int:
        rows = self.num_slots + self.num_checkpoints
        return self.num_blocks * self.bytes_per_block + rows * self.bytes_per_slot

    def describe(self) -> str:
        tokens = self.num_usable_blocks * self.block_size
        return (
            f"paged cache: {self.num_usable_blocks} blocks x {self.block_size} tokens = "
            f"{tokens} tokens ({self.num_blocks * self.bytes_per_block / MIB:.1f} MiB); "
            f"{self.num_usable_slots} state slots "
            f"({self.num_slots * self.bytes_per_slot / MIB:.1f} MiB); "
            f"{self.num_checkpoints} state checkpoints of {self.bytes_per_slot} bytes "
            f"({self.num_checkpoints * self.bytes_per_slot / MIB:.1f} MiB)"
        )


def free_memory_bytes(device: torch.device | str) -> int | None:
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def memory_budget(cache: CacheConfig, device: torch.device | str) -> int:
    if cache.kv_cache_memory is not None:
        return cache.kv_cache_memory
    if cache.gpu_memory_utilization is not None:
        return _utilization_budget(cache.gpu_memory_utilization, torch.device(device))
    free = free_memory_bytes(device)
    if torch.device(device).type == "cuda":
        return int(cache.memory_fraction * (free or 0))
    if free is None:
        return cache.cpu_cache_memory_default
    return min(int(cache.memory_fraction * free), cache.cpu_cache_memory_default)


def _utilization_budget(utilization: float, device: torch.device) -> int:
    if device.type != "cuda":
        raise ConfigError(
            "gpu_memory_utilization: a GPU option (a fraction of the GPU's memory); on the CPU "
            "give the cache budget as --kv-cache-memory (e.g. 8GiB) or --memory-fraction of "
            "the available RAM"
        )
    free, total = torch.cuda.mem_get_info(device)
    budget = int(utilization * total) - (total - free)
    if budget <= 0:
        raise ConfigError(
            f"gpu_memory_utilization: {utilization:g} of {total / 2**30:.1f} GiB leaves nothing "
            f"for the caches ({(total - free) / 2**30:.1f} GiB in use after loading); raise it"
        )
    return budget


def plan_cache(
    model: ModelConfig,
    cache: CacheConfig,
    max_model_len: int,
    max_num_seqs: int,
    budget: int,
) -> CachePlan:
    """Pool sizes for `budget` bytes; ConfigError unless it holds the slots and one sequence."""
    block_size = cache.block_size
    per_block = bytes_per_token(model) * block_size
    per_slot = bytes_per_state_slot(model)
    num_slots = (cache.num_state_slots or max_num_seqs) + 1
    blocks_per_seq = num_blocks_for(max_model_len, block_size)
    use_checkpoints = cache.enable_prefix_caching and per_slot > 0
    fixed = cache.num_state_checkpoints if use_checkpoints else 0
    stride_blocks = cache.state_checkpoint_stride // block_size
    reserve: int | None = None
    if cache.num_blocks is not None:
        num_blocks = cache.num_blocks + 1
    else:
        left = budget - (num_slots + (fixed or 0)) * per_slot
        if left < 0:
            raise ConfigError(
                f"kv_cache_memory: {budget} bytes cannot hold {num_slots} state slots of "
                f"{per_slot} bytes; lower max_num_seqs/num_state_slots or raise the budget"
            )
        if fixed is None:
            units = left // (stride_blocks * per_block + per_slot) + 2 * (num_slots - 1)
            reserve = min(units * per_slot, left // 4 // per_slot * per_slot)
            left -= reserve
        cap = max_num_seqs * blocks_per_seq + 1
        num_blocks = cap if per_block == 0 else min(cap, left // per_block)
    if num_blocks - 1 < blocks_per_seq:
        raise ConfigError(
            f"kv_cache_memory: {budget} bytes buy {max(num_blocks - 1, 0)} blocks of "
            f"{block_size} tokens, fewer than the {blocks_per_seq} blocks one "
            f"max_model_len={max_model_len} sequence needs; raise the budget or lower "
            "max_model_len"
        )
    num_checkpoints = fixed
    if fixed is None:
        num_checkpoints = -(-(num_blocks - 1) // stride_blocks) + 2 * (num_slots - 1)
        if reserve is not None:
            num_checkpoints = min(num_checkpoints, reserve // per_slot)
    plan = CachePlan(num_blocks, num_slots, block_size, per_block, per_slot, num_checkpoints)
    logger.info("%s", plan.describe())
    return plan
