"""fp32 CPU linear on weights prepacked once for oneDNN. Also batch transparency (I3): MKL rounds a
row differently for 1, 2-3 and 4+ rows, oneDNN the same for any count >= 2, so inputs are
zero-padded to >= 2 rows (and to a few cached row counts)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hyla.ops.linear.dispatch import linear
from hyla.ops.linear.stacked import adjacent_rows

_ROWS_HINT = 64  # row count oneDNN's weight layout is tuned for; any row count works
_ROW_BUCKETS = (2, 4, 8, 16, 32, 64, 128, 256)
_MAX_ROWS = _ROW_BUCKETS[-1]
ONEDNN = (
    torch.backends.mkldnn.is_available()
    and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
)


def usable(x: torch.Tensor, weights: Sequence[torch.Tensor]) -> bool:
    """Whether x @ w^T may run on packed copies: fp32 CPU, no autograd."""
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
    """x [..., D_in] @ W^T (+ bias) with W packed by `Prepacked` -> [..., D_out]; needs `usable`."""
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
    """Lazy oneDNN copies of weights, rebuilt when one changes; empty after copy or pickle."""

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
    """`reference.linear` (x [..., D_in], weight [D_out, D_in], bias [D_out]) through oneDNN with
    `cache`'s packed copy of `weight`, when `usable`."""
    if not usable(x, (weight,) if bias is None else (weight, bias)):
        return linear(x, weight, bias)
    return packed_matmul(x, cache.get(weight), bias)


def prepacked_stacked_linear(
    x: torch.Tensor, weights: Sequence[torch.Tensor], cache: Prepacked
) -> torch.Tensor:
    """`torch.cat([linear(x, w) for w in weights], -1)` as one matmul (weights [D_i, D_in])."""
    if not usable(x, weights):
        block = adjacent_rows(weights)
        if block is not None:
            return linear(x, block)
        return torch.cat([linear(x, w) for w in weights], dim=-1)
    return packed_matmul(x, cache.get(*weights))
