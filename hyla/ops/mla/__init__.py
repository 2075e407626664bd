"""Multi-head latent attention over the paged latent cache: expanded (prefill) and absorbed
(decode) forms. See `reference.py` for the definitions; `mla_absorbed_batched` (`cpu.py`) is the
absorbed form with all sequences in two matmuls, for decode steps, tested against the reference;
`mla_paged` (`paged.py`) takes the lengths as a device tensor: the CUDA path (Triton) and the
op of captured decode steps; `mla_prefill` (`prefill.py`) is the expanded form through the tiled
GQA kernel, for the prefill sequences of an eager CUDA step."""

from hyla.ops.mla.cpu import mla_absorbed_batched
from hyla.ops.mla.paged import mla_paged
from hyla.ops.mla.prefill import mla_prefill
from hyla.ops.mla.reference import (
    absorb_query,
    latent_attention,
    mla_absorbed,
    mla_expanded,
    project_values,
    split_kv_b,
)

__all__ = [
    "absorb_query",
    "latent_attention",
    "mla_absorbed",
    "mla_absorbed_batched",
    "mla_expanded",
    "mla_paged",
    "mla_prefill",
    "project_values",
    "split_kv_b",
]
