"""A standard error stream that cannot end the process.

`hyla serve` writes to stderr at start (the start-up line, the weight-loading progress bar)
and logs there while serving. When stderr cannot be written (a full disk behind `2>file`,
`2>/dev/full`, a closed pipe, or closed altogether: `2>&-`) the first write raised OSError
out of tqdm and the server exited 1 before it loaded, with no message anywhere. The messages
are lost either way; serving must not be.
"""

from __future__ import annotations

import os
import sys
from typing import Any


class TolerantStream:
    """Wraps a text stream: `write` and `flush` drop what cannot be written instead of raising;
    everything else is the stream's."""

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
    """Make `sys.stderr` a TolerantStream (an open null device when the process started with
    file descriptor 2 closed: Python then sets it to None, which tqdm cannot write to)."""
    if isinstance(sys.stderr, TolerantStream):
        return
    stream = sys.stderr
    if stream is None:
        stream = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    sys.stderr = TolerantStream(stream)
