"""A stderr that cannot end the process: an unwritable stderr (`2>/dev/full`, `2>&-`, a closed
pipe) made tqdm raise OSError and `hyla serve` exit 1 silently before loading."""

from __future__ import annotations

import os
import sys
from typing import Any


class TolerantStream:
    """Wraps a text stream; `write` and `flush` drop what cannot be written instead of raising."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except (OSError, ValueError):  # ENOSPC, EPIPE, EBADF; ValueError: a closed file
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except (OSError, ValueError):
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def tolerate_broken_stderr() -> None:
    """Make `sys.stderr` a TolerantStream (over os.devnull when fd 2 was closed: stderr is None)."""
    if isinstance(sys.stderr, TolerantStream):
        return
    stream = sys.stderr
    if stream is None:
        stream = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    sys.stderr = TolerantStream(stream)
