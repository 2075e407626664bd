"""Multi-head latent attention over the paged latent cache."""

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
