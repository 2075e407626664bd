"""Multi-head latent attention over the paged latent cache: expanded (prefill) and absorbed
(decode) forms. See `reference.py` for the definitions; `mla_absorbed_batched` (`cpu.py`) is the
absorbed form with all sequences in two matmuls, for decode steps, tested against the reference."""

from hyla.ops.mla.cpu import mla_absorbed_batched
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
    "project_values",
    "split_kv_b",
]
