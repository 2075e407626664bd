"""Remote tier on a Redis/Valkey server shared by engines; a failing store counts as empty for
`retry_after` s (one timeout, not one per lookup). The server's `maxmemory` bounds it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from hyla.cache.tiers.store import Tier, seal, unseal


class RemoteTier(Tier):
    """`url`: `redis://host:port[/db]`; `timeout` per call, `retry_after` a failure (seconds)."""

    name = "remote"

    def __init__(self, url: str, timeout: float, retry_after: float = 5.0) -> None:
        super().__init__()
        try:
            import redis
        except ImportError as e:  # pragma: no cover - the dev extra installs it
            raise ImportError("kv_offload_remote_url: needs the `redis` package") from e
        self._errors = (redis.RedisError, OSError)
        self.url = url
        self.retry_after = retry_after
        self._client = redis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout, retry_on_timeout=False
        )
        self._down_until = 0.0

    @property
    def num_bytes(self) -> int:
        return 0

    @property
    def is_down(self) -> bool:
        return time.monotonic() < self._down_until

    def _call(self, fn: Any, default: Any) -> Any:
        if self.is_down:
            return default
        try:
            return fn()
        except self._errors:
            self.stats.num_errors += 1
            self._down_until = time.monotonic() + self.retry_after
            return default

    def put(self, key: bytes, entry: bytes, nbytes: int) -> None:
        if self._call(lambda: self._client.set(key, seal(entry), nx=True), None):
            self.stats.num_puts += 1

    def put_many(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        def send() -> list:
            pipe = self._client.pipeline(transaction=False)
            for key, entry in items:
                pipe.set(key, seal(entry), nx=True)
            return pipe.execute()

        self.stats.num_puts += sum(1 for r in self._call(send, []) if r)

    def get(self, key: bytes) -> memoryview | None:
        return self.get_many([key])[0]

    def get_many(self, keys: Sequence[bytes]) -> list[memoryview | None]:
        frames = self._call(lambda: self._client.mget(list(keys)), [None] * len(keys))
        out = []
        for key, frame in zip(keys, frames, strict=True):
            payload = unseal(frame)
            if frame is None:
                self.stats.num_misses += 1
            elif payload is None:
                self.stats.num_corrupt += 1
                self._call(lambda k=key: self._client.delete(k), None)
            else:
                self.stats.num_hits += 1
            out.append(payload)
        return out

    def contains_many(self, keys: Sequence[bytes]) -> list[bool]:
        def ask() -> list:
            pipe = self._client.pipeline(transaction=False)
            for key in keys:
                pipe.exists(key)
            return pipe.execute()

        return [bool(r) for r in self._call(ask, [0] * len(keys))]

    def close(self) -> None:
        self._client.close()
