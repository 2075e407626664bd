"""Mixture-of-experts routing and expert computation. See `reference.py`.

Only the reference exists so far; a fused GPU kernel (same signatures) will dispatch here.
"""

from hyla.ops.moe.reference import (
    group_limited_mask,
    moe_experts,
    route_sigmoid,
    route_softmax,
    stable_topk,
)

__all__ = ["group_limited_mask", "moe_experts", "route_sigmoid", "route_softmax", "stable_topk"]
