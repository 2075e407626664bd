"""Load the vision tower of a multimodal checkpoint (`vision_config` + `model.visual.*` tensors)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from hyla.config import ConfigError
from hyla.layers.glm5_next_vision import Glm5NextVisionTower, VisionConfig
from hyla.layers.qwen3_5_vision import Qwen35VisionConfig, Qwen35VisionTower
from hyla.models.checkpoint import CheckpointError
from hyla.models.loader import DTYPES, checkpoint_files

PREFIXES = ("model.visual.", "visual.")
TOWERS = {
    "glm5_next": (Glm5NextVisionTower, VisionConfig),
    "qwen3_5": (Qwen35VisionTower, Qwen35VisionConfig),
    "qwen3_5_moe": (Qwen35VisionTower, Qwen35VisionConfig),  # the same tower as Qwen3.5's
}


def load_vision_tower(path: str | Path, dtype: str = "float32") -> torch.nn.Module:
    """The vision tower of checkpoint directory `path` (eval mode). Raises ConfigError (no or
    another `vision_config`), CheckpointError (tower tensors do not fit)."""
    config = json.loads((Path(path) / "config.json").read_text())
    family = config.get("model_type")
    if family not in TOWERS or "vision_config" not in config:
        raise ConfigError(
            f"vision_config: no supported vision tower for model_type {family!r} "
            f"(supported: {', '.join(TOWERS)})"
        )
    tower_cls, config_cls = TOWERS[family]
    tower = tower_cls(config_cls.from_hf(config["vision_config"]))
    state = {}
    for file in checkpoint_files(path):
        with safe_open(str(file), "pt") as f:
            for name in f.keys():
                prefix = next((p for p in PREFIXES if name.startswith(p)), None)
                if prefix is not None:
                    state[name[len(prefix) :]] = f.get_tensor(name)
    want = tower.state_dict()
    problems = sorted(set(want) ^ set(state))
    problems += [n for n in want if n in state and want[n].shape != state[n].shape]
    if problems:
        raise CheckpointError(f"vision tower tensors missing, unexpected or mis-shaped: {problems}")
    tower.load_state_dict(state)
    return tower.to(DTYPES[dtype]).eval()


__all__ = ["load_vision_tower"]
