"""Kimi Delta Attention (per-channel gated delta rule). See `reference.py` for the math.

`recurrent_kda` is the token-by-token form (decode), `chunk_kda` the chunked form (prefill);
both take packed varlen inputs with `cu_seqlens` and per-sequence states. The public functions
are the vectorized ones of `cpu.py` (all sequences of a call at once, pure PyTorch, so they run
on any device until a GPU kernel lands); `reference.py` keeps the readable definition they are
tested against.
"""

from hyla.ops.kda.cpu import chunk_kda, recurrent_kda

__all__ = ["chunk_kda", "recurrent_kda"]
