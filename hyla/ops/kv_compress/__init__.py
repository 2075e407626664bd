"""DeepSeek-V4's KV compression (CSA / HCA windows) and CSA indexer, PyTorch only."""

from hyla.ops.kv_compress.reference import compress_kv, compressed_indexer_topk, visible_entries

__all__ = ["compress_kv", "compressed_indexer_topk", "visible_entries"]
