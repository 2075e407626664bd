"""Match a checkpoint's stored tensors to a model from the safetensors headers alone (names,
shapes, full coverage); all problems are raised together before any weight is read."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from hyla.config import ModelConfig
from hyla.models.registry import placement_for
from hyla.models.weights import Placement

FP8_SCALE_SUFFIXES = ("_scale_inv", "_scale")  # block scales (DeepSeek/Qwen); per-tensor/channel
SKIPPED_SUFFIXES = (".input_scale",)  # static activation scales: hyla computes them per token


class CheckpointError(ValueError):
    """The checkpoint does not fit the model: missing, unexpected or mis-shaped tensors."""


@dataclass(frozen=True)
class Entry:
    name: str
    file: Path
    placements: tuple[Placement, ...]
    scale: tuple[str, Path] | None = None


def targets_of(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Loadable tensors by name (parameters, persistent buffers), and tied name -> owner."""
    targets: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    owner: dict[int, str] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in owner:
            aliases[name] = owner[id(tensor)]
        else:
            owner[id(tensor)] = name
            targets[name] = tensor
    return targets, aliases


def _read_headers(files: list[Path]) -> dict[str, tuple[Path, tuple[int, ...], str]]:
    out = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                sl = f.get_slice(name)
                out[name] = (file, tuple(sl.get_shape()), sl.get_dtype())
    return out


def plan_checkpoint(
    config: ModelConfig,
    targets: dict[str, torch.Tensor],
    aliases: dict[str, str],
    files: list[Path],
) -> list[Entry]:
    """Match every stored tensor to its destinations; CheckpointError lists every problem."""
    headers = _read_headers(files)
    entries: list[Entry] = []
    unexpected: list[str] = []
    mismatched: list[str] = []
    filled: dict[str, set[tuple[int | None, int, int]]] = {}
    for name, (file, shape, dtype) in headers.items():
        if _is_scale(name, headers) or name.endswith(SKIPPED_SUFFIXES):
            continue
        placements = placement_for(config, name)
        if not placements or all(p.target in aliases for p in placements):
            continue  # known and skipped, or a tied copy (lm_head.weight of tied embeddings)
        absent = [p.target for p in placements if p.target not in targets]
        if absent:
            unexpected.append(f"{name} (-> {', '.join(absent)})")
            continue
        problem = _check_shapes(shape, placements, targets)
        if problem:
            mismatched.append(f"{name}: checkpoint {list(shape)} vs model {problem}")
            continue
        for p in placements:
            filled.setdefault(p.target, set()).add((p.expert, p.part, p.num_parts))
        scale = None
        if dtype.startswith("F8"):
            names = [name + s for s in FP8_SCALE_SUFFIXES if name + s in headers]
            if dtype != "F8_E4M3" or not names:
                why = "not e4m3" if dtype != "F8_E4M3" else f"without {name}_scale_inv"
                mismatched.append(f"{name}: {dtype} tensor {why}")
                continue
            scale = (names[0], headers[names[0]][0])
        entries.append(Entry(name, file, placements, scale))
    missing = _missing(targets, filled)
    _raise_if("unexpected tensors in checkpoint", unexpected)
    _raise_if("shape mismatch", mismatched)
    _raise_if("tensors missing from checkpoint", missing)
    return entries


def _is_scale(name: str, headers: dict) -> bool:
    return any(name.endswith(s) and name.removesuffix(s) in headers for s in FP8_SCALE_SUFFIXES)


def _check_shapes(
    shape: tuple[int, ...], placements: tuple[Placement, ...], targets: dict[str, torch.Tensor]
) -> str | None:
    wanted = [p.shape_in(tuple(targets[p.target].shape)) for p in placements]
    if any(w is None for w in wanted):
        return " / ".join(f"{p.target} {list(targets[p.target].shape)}" for p in placements)
    if len(wanted) == 1:
        return None if wanted[0] == shape else str(list(wanted[0]))
    rows = sum(w[0] for w in wanted)
    if shape and rows == shape[0] and all(w[1:] == shape[1:] for w in wanted):
        return None
    return " + ".join(f"{p.target} {list(w)}" for p, w in zip(placements, wanted, strict=True))


def _missing(
    targets: dict[str, torch.Tensor], filled: dict[str, set[tuple[int | None, int, int]]]
) -> list[str]:
    missing = []
    for name, tensor in targets.items():
        pieces = filled.get(name)
        if not pieces:
            missing.append(name)
            continue
        if (None, 0, 1) in pieces:
            continue
        num_parts = max(n for _, _, n in pieces)
        experts = range(tensor.shape[0]) if any(e is not None for e, _, _ in pieces) else [None]
        for e in experts:
            for part in range(num_parts):
                if (e, part, num_parts) not in pieces:
                    where = "" if e is None else f"expert {e} "
                    missing.append(f"{name} ({where}part {part + 1} of {num_parts})")
    return missing


def _raise_if(what: str, items: list[str], limit: int = 20) -> None:
    if items:
        shown = "\n  ".join(items[:limit])
        more = f"\n  ... and {len(items) - limit} more" if len(items) > limit else ""
        raise CheckpointError(f"{what} ({len(items)}):\n  {shown}{more}")


def dequantize_fp8(weight: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    """Block-wise FP8 dequantization (DeepSeek-V3): weight [R, C] fp8 * scale_inv [ceil(R / b0),
    ceil(C / b1)] float32 per b0 x b1 block (block size from the shapes) -> [R, C] float32."""
    rows, cols = weight.shape
    b0 = -(-rows // scale_inv.shape[0])
    b1 = -(-cols // scale_inv.shape[1])
    scale = scale_inv.float().repeat_interleave(b0, 0)[:rows].repeat_interleave(b1, 1)[:, :cols]
    return weight.float() * scale
