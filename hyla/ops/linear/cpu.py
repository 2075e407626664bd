"""Linear projection with the weight prepacked once for oneDNN: the CPU fast path beside
`reference.linear` (held to it within fp32 rounding by tests/ops/test_linear.py).

torch's fp32 `F.linear` on the CPU runs MKL, which packs the weight on every call and, on some
processors, keeps to narrower vector instructions. oneDNN (the `mkldnn` ops that torch.compile's
CPU backend uses) takes a weight reordered once into its blocked layout and picks the widest
instructions the processor has: for a decode step's few rows against a large weight (the LM
head: 16 x 512 x 32000) it is about twice as fast.

The packed copy lives in a `PrepackedWeight` owned by the caller (a module attribute): it is
rebuilt when the weight changes (another tensor, or an in-place update bumping its version),
and never copied or pickled. The fast path applies to fp32 CPU tensors without autograd; every
other call is `reference.linear`. Rows computed by oneDNN differ from MKL's in the last bits
(another summation order), and a row's rounding may depend on the number of rows, as MKL's does.
"""

from __future__ import annotations

import torch

from hyla.ops.linear.reference import linear

# Row count oneDNN's weight layout is chosen for; any row count works with it.
_ROWS_HINT = 64


def _ops_available() -> bool:
    ops = torch.ops.mkldnn
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(ops, "_linear_pointwise")
        and hasattr(ops, "_reorder_linear_weight")
    )


class PrepackedWeight:
    """A lazily built oneDNN copy of one weight [D_out, D_in]; empty after copy or pickle."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._packed: torch.Tensor | None = None

    def get(self, weight: torch.Tensor) -> torch.Tensor:
        """The packed copy of `weight`, rebuilt when its storage, shape or version changed."""
        key = (weight.data_ptr(), weight._version, tuple(weight.shape), weight.stride())
        if self._key != key or self._packed is None:
            with torch.no_grad():
                self._packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _ROWS_HINT)
            self._key = key
        return self._packed

    def __deepcopy__(self, memo: dict) -> PrepackedWeight:
        return PrepackedWeight()

    def __getstate__(self) -> dict:
        return {"_key": None, "_packed": None}


def prepacked_linear(x: torch.Tensor, weight: torch.Tensor, cache: PrepackedWeight) -> torch.Tensor:
    """`reference.linear(x, weight)` through oneDNN with `cache`'s packed copy of `weight`.

    Args:
        x: [..., D_in]; weight: [D_out, D_in]; cache: the PrepackedWeight kept for `weight`.
    Returns: [..., D_out] in x's dtype. Falls back to `reference.linear` unless x and weight are
        float32 CPU tensors, autograd is off and torch has the oneDNN ops.
    """
    fast = (
        x.dtype == weight.dtype == torch.float32
        and x.device.type == weight.device.type == "cpu"
        and not torch.is_grad_enabled()
        and _ops_available()
    )
    if not fast:
        return linear(x, weight)
    return torch.ops.mkldnn._linear_pointwise(x, cache.get(weight), None, "none", [], "")
