"""Checkpoint tensor placement: where one stored tensor lands in hyla's state dict.

Most tensors map one-to-one onto a hyla parameter. The rest come in two shapes:
  - several stored tensors fill one hyla tensor: per-expert weights of original releases fill one
    slice of the fused `experts.gate_up_proj [E, 2I, D]` / `experts.down_proj [E, D, I]`;
  - one stored tensor feeds several hyla tensors: transformers' fused Kimi `conv1d.weight`
    [3*H*K, 1, W] is split (dim 0, in order) into hyla's `q_conv1d` / `k_conv1d` / `v_conv1d`.
An adapter returns a tuple of `Placement`s per stored tensor (empty: skip it; more than one: split
the tensor along dim 0 into consecutive chunks sized by each destination). The loader copies each
chunk straight into its destination slice, so nothing is stacked in memory.

    destination = target[expert][part * rows : (part + 1) * rows]
    rows = target[expert].shape[0] // num_parts
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Placement:
    """Destination of one checkpoint tensor.

    `target` is a hyla state-dict name; `expert` selects `target[expert]` (fused experts) or is
    None; the tensor fills part `part` of `num_parts` equal row blocks of that (dim 0).
    """

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
        """The slice of `target` this tensor fills (a view; copy into it)."""
        dst = target if self.expert is None else target[self.expert]
        if self.num_parts == 1:
            return dst
        rows = dst.shape[0] // self.num_parts
        return dst[self.part * rows : (self.part + 1) * rows]

    @property
    def key(self) -> tuple[str, int | None, int]:
        """(target, expert, part): which slice of which hyla tensor this placement fills."""
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
    """The decoder-layer index of a (prefix-stripped) name, or None."""
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
    """A per-expert slice of a fused expert tensor, else the same name one-to-one."""
    return (expert_placement(name) or Placement(name),)


def is_rotary_buffer(name: str) -> bool:
    """Rotary caches some older checkpoints saved (`rotary_emb.inv_freq`); hyla recomputes them."""
    return "rotary_emb." in name
