"""Linear projections with weights prepacked once for oneDNN: the CPU fast path beside
`reference.linear` (held to it within fp32 rounding by tests/ops/test_linear.py).

torch's fp32 `F.linear` on the CPU runs MKL, which packs the weight on every call and, on some
processors, keeps to narrower vector instructions. oneDNN (the `mkldnn` ops that torch.compile's
CPU backend uses) takes a weight reordered once into its blocked layout and picks the widest
instructions the processor has: for a decode step's few rows against a large weight (the LM
head: 16 x 512 x 32000) it is about twice as fast.

It is also how the CPU keeps batch transparency (I3) bit for bit: a row's result must not depend
on how many rows share the call. MKL's `F.linear` rounds a row differently for 1, 2-3 and 4+
rows; oneDNN's blocked kernel gives every row the same bits for any row count from 2 up and
any thread count (one row may take another kernel). So every fp32 inference input runs here,
padded with zero rows to at least 2 rows and to one of a few row counts (oneDNN builds and
caches one kernel, ~0.6 MB, per shape); inputs longer than `_MAX_ROWS` run in pieces of that
many rows. tests/ops/test_linear_rows.py holds this across row counts and thread counts.

A `Prepacked` cache, owned by the caller (a module attribute), holds the packed copies of one
or more weights: it rebuilds them when a weight changes (another tensor, or an in-place update
bumping its version) and is never copied or pickled. The fast path applies to fp32 CPU tensors
without autograd; every other call is `reference.linear`. Rows computed by oneDNN differ from
MKL's in the last bits (another summation order), and a row's rounding may depend on the number
of rows, as MKL's does.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hyla.ops.linear.dispatch import linear
from hyla.ops.linear.stacked import adjacent_rows

# Row count oneDNN's weight layout is chosen for; any row count works with it.
_ROWS_HINT = 64
# Row counts inputs are padded to (never 1: see the module docstring); longer inputs are cut
# into pieces of `_MAX_ROWS`.
_ROW_BUCKETS = (2, 4, 8, 16, 32, 64, 128, 256)
_MAX_ROWS = _ROW_BUCKETS[-1]
ONEDNN = (
    torch.backends.mkldnn.is_available()
    and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
)


def usable(x: torch.Tensor, weights: Sequence[torch.Tensor]) -> bool:
    """Whether x @ w^T for w in `weights` may run on packed copies: fp32 CPU, no autograd."""
    return (
        ONEDNN
        and x.dtype == torch.float32
        and x.device.type == "cpu"
        and x.numel() > 0
        and not torch.is_grad_enabled()
        and all(w.dtype == torch.float32 and w.device.type == "cpu" for w in weights)
    )


def packed_matmul(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [..., D_in] @ W^T (+ bias) with W packed by `Prepacked` -> [..., D_out]; `usable(x)`
    must hold. Each row's result is the same whatever the other rows (see the module
    docstring): pieces of `_MAX_ROWS` rows, the last padded with zeros to a `_ROW_BUCKETS`."""
    flat = x.reshape(-1, x.shape[-1])
    pieces = [_padded_matmul(p, packed, bias) for p in flat.split(_MAX_ROWS)]
    out = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
    return out.reshape(*x.shape[:-1], out.shape[-1])


def _padded_matmul(
    flat: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    rows = flat.shape[0]
    bucket = next(b for b in _ROW_BUCKETS if b >= rows)
    if bucket != rows:
        flat = torch.cat([flat, flat.new_zeros(bucket - rows, flat.shape[1])])
    out = torch.ops.mkldnn._linear_pointwise(flat, packed, bias, "none", [], "")
    return out[:rows]


def _key(weights: Sequence[torch.Tensor]) -> tuple:
    return tuple((w.data_ptr(), w._version, tuple(w.shape), w.stride()) for w in weights)


class Prepacked:
    """Lazily built oneDNN copies of weights; empty after copy or pickle.

    `get(w1, w2, ...)` packs the weights stacked along D_out (one matmul for several
    projections of one input); `get_each(fused)` packs each `fused[e]` of a stacked
    [E, D_out, D_in] tensor on its own (the experts of a MoE layer)."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._packed: list[torch.Tensor] = []

    def _refresh(self, key: tuple, matrices) -> list[torch.Tensor]:
        if self._key != key:
            with torch.no_grad():
                self._packed = [
                    torch.ops.mkldnn._reorder_linear_weight(m.detach(), _ROWS_HINT)
                    for m in matrices()
                ]
            self._key = key
        return self._packed

    def get(self, *weights: torch.Tensor) -> torch.Tensor:
        """The packed copy of `weights` ([D_i, D_in] each) concatenated along dim 0."""
        stacked = lambda: [weights[0] if len(weights) == 1 else torch.cat(weights)]  # noqa: E731
        return self._refresh(_key(weights), stacked)[0]

    def get_each(self, fused: torch.Tensor) -> list[torch.Tensor]:
        """The packed copies of fused[0], fused[1], ... (fused: [E, D_out, D_in])."""
        return self._refresh(_key([fused]), lambda: list(fused.unbind(0)))

    def __deepcopy__(self, memo: dict) -> Prepacked:
        return Prepacked()

    def __getstate__(self) -> dict:
        return {"_key": None, "_packed": []}


def prepacked_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    cache: Prepacked,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """`reference.linear(x, weight, bias)` through oneDNN with `cache`'s packed copy of `weight`.

    Args:
        x: [..., D_in]; weight: [D_out, D_in]; cache: the Prepacked kept for `weight`;
        bias: [D_out] or None.
    Returns: [..., D_out] in x's dtype. Falls back to `reference.linear` unless x, weight and
        bias are float32 CPU tensors, autograd is off and torch has the oneDNN ops.
    """
    if not usable(x, (weight,) if bias is None else (weight, bias)):
        return linear(x, weight, bias)
    return packed_matmul(x, cache.get(weight), bias)


def prepacked_stacked_linear(
    x: torch.Tensor, weights: Sequence[torch.Tensor], cache: Prepacked
) -> torch.Tensor:
    """`torch.cat([reference.linear(x, w) for w in weights], -1)` as one matmul with the
    weights stacked (several projections of the same input, no biases).

    Args:
        x: [..., D_in]; weights: [D_i, D_in] each; cache: the Prepacked kept for them.
    Returns: [..., sum D_i] in x's dtype (the same fallback as `prepacked_linear`).
    """
    if not usable(x, weights):
        block = adjacent_rows(weights)  # weights stacked in one tensor (`stacked.stack_rows`)
        if block is not None:
            return linear(x, block)
        return torch.cat([linear(x, w) for w in weights], dim=-1)
    return packed_matmul(x, cache.get(*weights))
