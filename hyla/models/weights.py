"""Checkpoint tensor placement in hyla's state dict: one-to-one, a slice of fused experts, or
split along dim 0 over several placements (Kimi's fused `conv1d.weight`); () skips it."""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Placement:
    """Part `part` of `num_parts` dim-0 row blocks of `target[expert]` (`expert` None: `target`)."""

    target: str
    expert: int | None = None
    part: int = 0
    num_parts: int = 1

    def shape_in(self, target_shape: tuple[int, ...]) -> tuple[int, ...] | None:
        """Shape the stored tensor must have, or None if the target cannot hold this slice."""
        shape = tuple(target_shape)
        if self.expert is not None:
            if not shape or not 0 <= self.expert < shape[0]:
                return None
            shape = shape[1:]
        if self.num_parts > 1:
            if not shape or shape[0] % self.num_parts:
                return None
            shape = (shape[0] // self.num_parts, *shape[1:])
        return shape

    def view(self, target: torch.Tensor) -> torch.Tensor:
        dst = target if self.expert is None else target[self.expert]
        if self.num_parts == 1:
            return dst
        rows = dst.shape[0] // self.num_parts
        return dst[self.part * rows : (self.part + 1) * rows]

    @property
    def key(self) -> tuple[str, int | None, int]:
        return (self.target, self.expert, self.part)


_LAYER_RE = re.compile(r"^layers\.(\d+)\.")
_EXPERT_RE = re.compile(r"^(layers\.\d+\.mlp\.experts)\.(\d+)\.(\w+)\.weight$")
# per-expert name -> (fused hyla tensor, part, num_parts); w1/w3/w2 is Mixtral/Kimi naming
_EXPERT_PARTS = {
    "gate_proj": ("gate_up_proj", 0, 2),
    "w1": ("gate_up_proj", 0, 2),
    "up_proj": ("gate_up_proj", 1, 2),
    "w3": ("gate_up_proj", 1, 2),
    "down_proj": ("down_proj", 0, 1),
    "w2": ("down_proj", 0, 1),
}


def strip_model_prefix(name: str) -> str:
    """`model.layers.0.x` -> `layers.0.x`; `lm_head.weight` stays."""
    return name.removeprefix("model.")


def layer_index(name: str) -> int | None:
    m = _LAYER_RE.match(name)
    return int(m.group(1)) if m else None


def rename_mixer(name: str, hf_modules: tuple[str, ...]) -> str:
    """`layers.{i}.<hf_module>.x` -> `layers.{i}.mixer.x` for each HF mixer module name."""
    for module in hf_modules:
        name = re.sub(rf"^(layers\.\d+)\.{module}\.", r"\1.mixer.", name)
    return name


def expert_placement(name: str) -> Placement | None:
    """Placement of a per-expert tensor `layers.{i}.mlp.experts.{e}.{proj}.weight`, else None."""
    m = _EXPERT_RE.match(name)
    if m is None or m.group(3) not in _EXPERT_PARTS:
        return None
    fused, part, num_parts = _EXPERT_PARTS[m.group(3)]
    return Placement(f"{m.group(1)}.{fused}", int(m.group(2)), part, num_parts)


def default_placement(name: str) -> tuple[Placement, ...]:
    return (expert_placement(name) or Placement(name),)


def is_rotary_buffer(name: str) -> bool:
    """Rotary caches some older checkpoints saved (`rotary_emb.inv_freq`); hyla recomputes them."""
    return "rotary_emb." in name
