"""Multi-head latent attention over the paged latent cache: expanded (prefill) and absorbed
(decode) forms. See `reference.py`."""

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
    "mla_expanded",
    "project_values",
    "split_kv_b",
]
