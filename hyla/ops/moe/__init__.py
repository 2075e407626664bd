"""Mixture-of-experts routing and expert computation. See `reference.py` for the definitions.

`moe_experts` is the grouped form of `cpu.py` (tokens sorted by expert once), tested against the
per-expert reference; a fused GPU kernel (same signature) will dispatch here.
"""

from hyla.ops.moe.cpu import moe_experts
from hyla.ops.moe.reference import (
    group_limited_mask,
    route_sigmoid,
    route_softmax,
    stable_topk,
)

__all__ = ["group_limited_mask", "moe_experts", "route_sigmoid", "route_softmax", "stable_topk"]
