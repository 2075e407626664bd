"""Image placeholder spans as the scheduler and prefix cache see them: a block's key carries the
hashes of the spans it overlaps, so different images never share a block (vLLM's extra keys)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ImageSpan:
    """Prompt tokens [offset, offset + length) are the placeholders of the image `hash`."""

    offset: int
    length: int
    hash: str

    def __post_init__(self) -> None:
        if self.offset < 0 or self.length < 1:
            raise ValueError(f"ImageSpan: offset {self.offset} >= 0, length {self.length} >= 1")

    @property
    def end(self) -> int:
        return self.offset + self.length

    def overlaps(self, start: int, end: int) -> bool:
        return self.offset < end and start < self.end


def spans_in(spans: Sequence[ImageSpan], start: int, end: int) -> list[ImageSpan]:
    return [s for s in spans if s.overlaps(start, end)]


def block_extra_keys(spans: Sequence[ImageSpan], block_size: int) -> Callable[[int], tuple] | None:
    """`extra_keys(j)` for `hyla.cache.prefix.extend_block_hashes`: the hashes of the images
    whose placeholders block j covers; None without images."""
    if not spans:
        return None

    def keys(j: int) -> tuple:
        return tuple(s.hash for s in spans_in(spans, j * block_size, (j + 1) * block_size))

    return keys
