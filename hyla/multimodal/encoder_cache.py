"""The encoder cache: vision tower rows by image hash, referenced by each request from its first
computed placeholder of the image until all are (or it ends); shared by equal images."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class EncoderCacheStats:
    num_encoded_images: int = 0
    num_encoded_tokens: int = 0
    num_hits: int = 0


class EncoderCache:
    def __init__(self) -> None:
        self.entries: dict[str, torch.Tensor] = {}
        self._holders: dict[str, set[str]] = {}  # hash -> request ids holding it
        self._held: dict[str, set[str]] = {}  # request id -> hashes it holds
        self.stats = EncoderCacheStats()

    def __contains__(self, image_hash: str) -> bool:
        return image_hash in self.entries

    @property
    def num_entries(self) -> int:
        return len(self.entries)

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.entries.values())

    def get(self, image_hash: str, request_id: str) -> torch.Tensor | None:
        """The rows of `image_hash` (taking `request_id`'s reference), or None."""
        rows = self.entries.get(image_hash)
        if rows is not None:
            if request_id not in self._holders[image_hash]:
                self.stats.num_hits += 1
            self._hold(image_hash, request_id)
        return rows

    def put(self, image_hash: str, request_id: str, rows: torch.Tensor) -> None:
        """Store freshly encoded rows [n, D], held by `request_id`."""
        self.entries[image_hash] = rows
        self._holders[image_hash] = set()
        self._hold(image_hash, request_id)
        self.stats.num_encoded_images += 1
        self.stats.num_encoded_tokens += rows.shape[0]

    def _hold(self, image_hash: str, request_id: str) -> None:
        self._holders[image_hash].add(request_id)
        self._held.setdefault(request_id, set()).add(image_hash)

    def release(self, request_id: str, image_hash: str | None = None) -> None:
        """Drop `request_id`'s reference on `image_hash` (None: on every image it holds)."""
        held = self._held.get(request_id, set())
        for h in [image_hash] if image_hash is not None else list(held):
            if h not in held:
                continue
            held.discard(h)
            holders = self._holders[h]
            holders.discard(request_id)
            if not holders:
                del self._holders[h], self.entries[h]
        if not held:
            self._held.pop(request_id, None)
