"""DSA lightning indexer scores and deterministic causal top-k over the paged index-key cache.
See `reference.py`."""

from hyla.ops.dsa_indexer.reference import indexer_scores, lightning_indexer_topk, select_topk

__all__ = ["indexer_scores", "lightning_indexer_topk", "select_topk"]
