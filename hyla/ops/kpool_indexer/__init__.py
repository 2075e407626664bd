"""Pooled DSA indexer (GLM-5.3-Flash `index_kpool`). See `reference.py`: PyTorch on every
device, lengths read on the device (no host sync); no Triton kernel yet."""

from __future__ import annotations

from hyla.ops.kpool_indexer.reference import compress_pools, kpool_indexer_topk, write_pool_keys

__all__ = ["compress_pools", "kpool_indexer_topk", "write_pool_keys"]
