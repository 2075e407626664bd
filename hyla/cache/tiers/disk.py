"""Local-disk tier: one sealed file per entry, LRU under a byte budget; existing files count."""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

from hyla.cache.tiers.store import Tier, seal, unseal

SUFFIX = ".kv"


class DiskTier(Tier):
    name = "disk"

    def __init__(self, directory: str | Path, capacity_bytes: int) -> None:
        super().__init__()
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.capacity_bytes = capacity_bytes
        self._sizes: OrderedDict[bytes, int] = OrderedDict()
        self._bytes = 0
        files = sorted(self.directory.glob("*" + SUFFIX), key=lambda p: p.stat().st_mtime)
        for path in files:
            self._index(bytes.fromhex(path.stem), path.stat().st_size)

    @property
    def num_bytes(self) -> int:
        return self._bytes

    def _path(self, key: bytes) -> Path:
        return self.directory / (key.hex() + SUFFIX)

    def _index(self, key: bytes, size: int) -> None:
        self._sizes[key] = size
        self._bytes += size
        while self._bytes > self.capacity_bytes and self._sizes:
            self._remove(next(iter(self._sizes)))

    def _remove(self, key: bytes) -> None:
        self._bytes -= self._sizes.pop(key, 0)
        self._path(key).unlink(missing_ok=True)

    def put(self, key: bytes, entry: bytes, nbytes: int) -> None:
        if key in self._sizes:
            return
        frame = seal(entry)
        if len(frame) > self.capacity_bytes:
            return
        path = self._path(key)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        try:
            tmp.write_bytes(frame)
            tmp.replace(path)
        except OSError:
            self.stats.num_errors += 1
            tmp.unlink(missing_ok=True)
            return
        self._index(key, len(frame))
        self.stats.num_puts += 1

    def get(self, key: bytes) -> memoryview | None:
        try:
            frame = self._path(key).read_bytes()
        except OSError:
            self.stats.num_misses += 1
            self._bytes -= self._sizes.pop(key, 0)
            return None
        payload = unseal(frame)
        if payload is None:
            self.stats.num_corrupt += 1
            self._remove(key)
            return None
        if key in self._sizes:
            self._sizes.move_to_end(key)
        else:  # written by another engine on this directory
            self._index(key, len(frame))
        self.stats.num_hits += 1
        return payload

    def clear(self) -> None:
        for key in list(self._sizes):
            self._remove(key)

    def contains_many(self, keys: Sequence[bytes]) -> list[bool]:
        return [k in self._sizes or self._path(k).exists() for k in keys]
