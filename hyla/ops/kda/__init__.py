"""Kimi Delta Attention (per-channel gated delta rule). See `reference.py` for the math.

`recurrent_kda` is the token-by-token definition (decode), `chunk_kda` the chunked form
(prefill); both take packed varlen inputs with `cu_seqlens` and per-sequence states.
"""

from hyla.ops.kda.reference import chunk_kda, recurrent_kda

__all__ = ["chunk_kda", "recurrent_kda"]
