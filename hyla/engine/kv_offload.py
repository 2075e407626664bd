"""The device side of the tiered cache (`hyla.cache.tiers`): block and state-row copies between
the device caches and the tiers, on their own CUDA stream; the next forward waits for them (it may
reuse a spilled block). Byte tiers are written from the previous call's pinned copies.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
from collections.abc import Sequence
from typing import Any

import torch

from hyla.cache.spec import layer_cache_specs
from hyla.cache.tiers import DiskTier, HostTier, RemoteTier, Tier, TieredPrefix, Transfers
from hyla.config import CacheConfig

logger = logging.getLogger("hyla.kv_offload")
GIB = 1024**3


class TierIO:
    """Runs `Transfers` between `token_tensors` ([num_blocks, B, ...] each), `state_tensors`
    ([rows, ...] each; checkpoint c is row `checkpoint_offset + c`) and `tiers`."""

    def __init__(
        self,
        token_tensors: list[torch.Tensor],
        state_tensors: list[torch.Tensor],
        checkpoint_offset: int,
        tiers: Sequence[Tier],
    ) -> None:
        self.token_tensors = token_tensors
        self.state_tensors = state_tensors
        self.checkpoint_offset = checkpoint_offset
        self.tiers = list(tiers)
        self.device = (token_tensors or state_tensors)[0].device
        self.is_cuda = self.device.type == "cuda"
        self.stream = torch.cuda.Stream(self.device) if self.is_cuda else None
        self._unsent: list[tuple[bytes, tuple, torch.cuda.Event | None]] = []

    def __call__(self, todo: Transfers) -> None:
        self._send_bytes()
        if self.stream is None:
            self._run(todo)
            self._send_bytes()
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            self._run(todo)
        torch.cuda.current_stream(self.device).wait_stream(self.stream)

    def _run(self, todo: Transfers) -> None:
        self._spill(todo.spill_blocks, self.token_tensors, 0)
        self._spill(todo.spill_checkpoints, self.state_tensors, self.checkpoint_offset)
        self._load(todo.load_blocks, self.token_tensors, 0)
        self._load(todo.load_checkpoints, self.state_tensors, self.checkpoint_offset)

    def _spill(self, items: list[tuple[int, bytes]], tensors: list[torch.Tensor], offset: int):
        if not items or not tensors:
            return
        idx = torch.tensor([offset + r for r, _ in items], device=self.device)
        hosts = []
        for t in tensors:
            rows = t.index_select(0, idx)
            if self.is_cuda:
                host = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=True)
                host.copy_(rows, non_blocking=True)
                rows = host
            hosts.append(rows)
        event = None
        if self.is_cuda:
            event = torch.cuda.Event()
            event.record(self.stream)
        for k, (_, key) in enumerate(items):
            entry = tuple(h[k] for h in hosts)
            nbytes = sum(e.numel() * e.element_size() for e in entry)
            for tier in self.tiers:
                if not tier.holds_bytes:
                    tier.put(key, entry, nbytes)
            self._unsent.append((key, entry, event))

    def _send_bytes(self) -> None:
        unsent, self._unsent = self._unsent, []
        byte_tiers = [t for t in self.tiers if t.holds_bytes]
        if not byte_tiers or not unsent:
            return
        for event in {id(e): e for _, _, e in unsent if e is not None}.values():
            event.synchronize()
        items = [(key, encode(entry)) for key, entry, _ in unsent]
        for tier in byte_tiers:
            if isinstance(tier, RemoteTier):
                tier.put_many(items)
            else:
                for key, payload in items:
                    tier.put(key, payload, len(payload))

    def _load(self, items: list[tuple[int, Any, bool]], tensors: list[torch.Tensor], offset: int):
        if not items or not tensors:
            return
        entries = [decode(e, tensors) if is_bytes else e for _, e, is_bytes in items]
        idx = torch.tensor([offset + r for r, _, _ in items], device=self.device)
        for i, t in enumerate(tensors):
            rows = stack_rows([e[i] for e in entries])
            if self.is_cuda:
                rows = rows if rows.is_pinned() else rows.pin_memory()
                rows = rows.to(self.device, non_blocking=True)
            if t.element_size() == 1:  # fp8: index_copy_ has no float8 kernels, bytes do
                t, rows = t.view(torch.uint8), rows.view(torch.uint8)
            t.index_copy_(0, idx, rows)


def stack_rows(rows: list[torch.Tensor]) -> torch.Tensor:
    """`torch.stack(rows)`, without a copy when the rows lie back to back in one buffer."""
    first = rows[0]
    step = first.numel() * first.element_size()
    storage = first.untyped_storage()
    if first.is_contiguous() and all(
        r.untyped_storage().data_ptr() == storage.data_ptr()
        and r.data_ptr() == first.data_ptr() + k * step
        and r.is_contiguous()
        for k, r in enumerate(rows)
    ):
        out = torch.empty(0, dtype=first.dtype, device=first.device)
        return out.set_(storage, first.storage_offset(), (len(rows), *first.shape))
    return torch.stack(rows)


def encode(entry: tuple) -> bytes:
    return b"".join(e.contiguous().view(torch.uint8).numpy().tobytes() for e in entry)


def decode(payload: Any, tensors: list[torch.Tensor]) -> tuple:
    """One entry's tensors, a row of each of `tensors`; ValueError for a foreign layout."""
    sizes = [t[0].numel() * t.element_size() for t in tensors]
    if len(payload) != sum(sizes):
        raise ValueError(f"entry: {len(payload)} bytes, the layout needs {sum(sizes)}")
    flat = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    out, at = [], 0
    for t, n in zip(tensors, sizes, strict=True):
        out.append(flat[at : at + n].clone().view(t.dtype).view(t.shape[1:]))
        at += n
    return tuple(out)


def _row_nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t[0].numel() * t.element_size() for t in tensors)


def token_tensors(model_config: Any, caches: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
    return [
        caches[i][spec.name]
        for i in range(model_config.num_layers)
        for spec in layer_cache_specs(model_config, i)
        if spec.per == "token"
    ]


def namespace(model: torch.nn.Module, tensors: list[torch.Tensor], block_size: int) -> bytes:
    """8 bytes naming the model and cache layout: only equal namespaces share entries."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(repr(getattr(model, "config", None)).encode())
    digest.update(repr([(tuple(t.shape[1:]), str(t.dtype)) for t in tensors]).encode())
    digest.update(block_size.to_bytes(4, "little"))
    first = next(model.parameters()).detach().reshape(-1)[:64].float().cpu()
    digest.update(first.numpy().tobytes())
    return digest.digest()


def build_tiers(cache: CacheConfig) -> list[Tier]:
    """The configured tiers, fastest first."""
    tiers: list[Tier] = []
    if cache.kv_offload_host_gib > 0:
        tiers.append(HostTier(int(cache.kv_offload_host_gib * GIB)))
    if cache.kv_offload_disk_gib > 0:
        directory = cache.kv_offload_disk_dir or tempfile.mkdtemp(prefix="hyla-kv-")
        tiers.append(DiskTier(directory, int(cache.kv_offload_disk_gib * GIB)))
    if cache.kv_offload_remote_url:
        tiers.append(RemoteTier(cache.kv_offload_remote_url, cache.kv_offload_remote_timeout))
    return tiers


def attach_tiers(engine: Any) -> TieredPrefix | None:
    """Hang the configured tiers below `engine`'s prefix cache; None when off."""
    tiers = build_tiers(engine.config.cache)
    if not tiers or engine.cache.prefix is None or engine.executor.is_distributed:
        if tiers and engine.executor.is_distributed:
            logger.warning("kv offload: not with tensor parallelism yet; tiers are off")
        return None
    runner = engine.runner
    tokens = token_tensors(engine.model_config, runner.caches)
    ns = namespace(engine.model, tokens + runner.state_tensors, engine.cache.block_size)
    tiered = TieredPrefix(engine.cache.prefix, tiers, ns)
    tiered.entry_nbytes = {b"b": _row_nbytes(tokens), b"c": _row_nbytes(runner.state_tensors)}
    tiered.io = TierIO(tokens, runner.state_tensors, engine.cache.slot_pool.num_slots, tiers)
    engine.cache.tiers = tiered
    logger.info("kv offload tiers: %s", ", ".join(t.name for t in tiers))
    return tiered


def tier_stats(cache: Any) -> dict[str, int]:
    """Flat counters of a CacheManager for /metrics."""
    out: dict[str, int] = {}
    if cache.documents is not None:
        docs = cache.documents
        out["documents_pinned"] = len(docs.documents)
        out["documents_pinned_blocks"] = docs.num_pinned_blocks
        out["documents_pinned_tokens"] = docs.num_pinned_tokens
    tiered = cache.tiers
    if tiered is None:
        return out
    out.update({f"kv_offload_{k}": v for k, v in vars(tiered.stats).items()})
    for tier in tiered.tiers:
        out.update({f"kv_offload_{tier.name}_{k}": v for k, v in vars(tier.stats).items()})
        out[f"kv_offload_{tier.name}_bytes"] = tier.num_bytes
    return out
