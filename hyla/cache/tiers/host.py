"""Host-memory tier: entries kept as given (pinned tensors on CUDA), LRU under a byte budget."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from hyla.cache.tiers.store import Tier


class HostTier(Tier):
    name = "host"
    holds_bytes = False

    def __init__(self, capacity_bytes: int) -> None:
        super().__init__()
        self.capacity_bytes = capacity_bytes
        self._entries: OrderedDict[bytes, tuple[Any, int]] = OrderedDict()
        self._bytes = 0

    @property
    def num_bytes(self) -> int:
        return self._bytes

    @property
    def num_entries(self) -> int:
        return len(self._entries)

    def put(self, key: bytes, entry: Any, nbytes: int) -> None:
        if key in self._entries or nbytes > self.capacity_bytes:
            return
        while self._bytes + nbytes > self.capacity_bytes:
            _, (_, n) = self._entries.popitem(last=False)
            self._bytes -= n
        self._entries[key] = (entry, nbytes)
        self._bytes += nbytes
        self.stats.num_puts += 1

    def get(self, key: bytes) -> Any | None:
        item = self._entries.get(key)
        if item is None:
            self.stats.num_misses += 1
            return None
        self._entries.move_to_end(key)
        self.stats.num_hits += 1
        return item[0]

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def contains_many(self, keys: Sequence[bytes]) -> list[bool]:
        return [k in self._entries for k in keys]
