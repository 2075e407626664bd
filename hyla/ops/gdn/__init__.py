"""Gated DeltaNet (per-head scalar gated delta rule). See `reference.py` for the math.

`recurrent_gated_delta_rule` is the token-by-token form (decode), `chunk_gated_delta_rule` the
chunked form (prefill); both take packed varlen inputs. CUDA inputs go to fla-core's kernels
(`kernels.py`) when fla is installed, everything else to the vectorized ops of `cpu.py`;
`reference.py` keeps the readable definition they are tested against.
"""

from hyla.ops.gdn import cpu, kernels
from hyla.ops.kda.kernels import dispatch

chunk_gated_delta_rule = dispatch(cpu.chunk_gated_delta_rule, kernels.chunk_gated_delta_rule)
recurrent_gated_delta_rule = dispatch(
    cpu.recurrent_gated_delta_rule, kernels.recurrent_gated_delta_rule
)

__all__ = ["chunk_gated_delta_rule", "recurrent_gated_delta_rule"]
