"""Gated DeltaNet (per-head scalar gated delta rule). See `reference.py` for the math.

`recurrent_gated_delta_rule` is the token-by-token form (decode), `chunk_gated_delta_rule` the
chunked form (prefill); both take packed varlen inputs. The public functions are the vectorized
ones of `cpu.py`; `reference.py` keeps the readable definition they are tested against.
"""

from hyla.ops.gdn.cpu import chunk_gated_delta_rule, recurrent_gated_delta_rule

__all__ = ["chunk_gated_delta_rule", "recurrent_gated_delta_rule"]
