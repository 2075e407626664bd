"""Sparse MLA over the tokens the DSA indexer selected. See `reference.py`."""

from hyla.ops.sparse_attention.reference import sparse_mla

__all__ = ["sparse_mla"]
