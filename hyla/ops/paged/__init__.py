"""Paged per-token cache reads and writes. See `reference.py`."""

from hyla.ops.paged.reference import (
    gather_paged,
    gather_paged_padded,
    gather_paged_tokens,
    token_slots,
    write_paged,
)

__all__ = [
    "gather_paged",
    "gather_paged_padded",
    "gather_paged_tokens",
    "token_slots",
    "write_paged",
]
