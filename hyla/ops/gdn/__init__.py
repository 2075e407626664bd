"""Gated DeltaNet (per-head scalar gated delta rule): CUDA inputs go to fla-core (`kernels.py`),
others to `cpu.py`; `reference.py` is the definition."""

from hyla.ops.gdn import cpu, kernels
from hyla.ops.kda.kernels import dispatch

chunk_gated_delta_rule = dispatch(cpu.chunk_gated_delta_rule, kernels.chunk_gated_delta_rule)
recurrent_gated_delta_rule = dispatch(
    cpu.recurrent_gated_delta_rule, kernels.recurrent_gated_delta_rule
)

__all__ = ["chunk_gated_delta_rule", "recurrent_gated_delta_rule"]
