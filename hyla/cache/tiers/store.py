"""The tier interface and the byte tiers' frame, MAGIC (4) | blake2b-128 of payload (16) |
payload: a corrupted entry is found on read, dropped and recomputed."""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MAGIC = b"HYT1"
DIGEST_SIZE = 16


@dataclass
class TierStats:
    """Counters since start; `num_errors`: store faults (timeouts, refusals) treated as misses."""

    num_puts: int = 0
    num_hits: int = 0
    num_misses: int = 0
    num_corrupt: int = 0
    num_errors: int = 0


class Tier(ABC):
    """One level below the device pool; `holds_bytes`: sealed frames, else objects (host)."""

    name: str = "tier"
    holds_bytes: bool = True

    def __init__(self) -> None:
        self.stats = TierStats()

    @abstractmethod
    def put(self, key: bytes, entry: Any, nbytes: int) -> None:
        """Store `entry` under `key` (an existing entry stays); never raises for a store fault."""

    @abstractmethod
    def get(self, key: bytes) -> Any | None:
        """The entry under `key`, or None (absent, corrupted, or the store failed)."""

    @abstractmethod
    def contains_many(self, keys: Sequence[bytes]) -> list[bool]:
        """Whether each key has an entry (False for all when the store failed)."""

    @property
    @abstractmethod
    def num_bytes(self) -> int:
        """Bytes held (0 where the tier cannot tell, e.g. a shared remote store)."""

    def get_many(self, keys: Sequence[bytes]) -> list[Any | None]:
        return [self.get(k) for k in keys]

    def close(self) -> None:
        return None


def seal(payload: bytes) -> bytes:
    digest = hashlib.blake2b(payload, digest_size=DIGEST_SIZE).digest()
    return MAGIC + digest + payload


def unseal(frame: bytes | None) -> memoryview | None:
    """The payload of `frame`, or None when it is not an intact frame."""
    if frame is None or len(frame) < len(MAGIC) + DIGEST_SIZE or frame[:4] != MAGIC:
        return None
    view = memoryview(frame)[len(MAGIC) + DIGEST_SIZE :]
    digest = hashlib.blake2b(view, digest_size=DIGEST_SIZE).digest()
    return view if digest == frame[4 : 4 + DIGEST_SIZE] else None
