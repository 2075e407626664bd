"""DeepSeek-V4's KV compression (CSA / HCA windows) and the CSA indexer over compressed keys.
See `reference.py` (PyTorch only)."""

from hyla.ops.kv_compress.reference import compress_kv, compressed_indexer_topk, visible_entries

__all__ = ["compress_kv", "compressed_indexer_topk", "visible_entries"]
