"""Gated DeltaNet (per-head scalar gated delta rule). See `reference.py` for the math.

`recurrent_gated_delta_rule` is the token-by-token definition (decode),
`chunk_gated_delta_rule` the chunked form (prefill); both take packed varlen inputs.
"""

from hyla.ops.gdn.reference import chunk_gated_delta_rule, recurrent_gated_delta_rule

__all__ = ["chunk_gated_delta_rule", "recurrent_gated_delta_rule"]
