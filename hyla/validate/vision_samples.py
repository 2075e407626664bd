"""Deterministic images (numpy, sized in patch x merge units) and prompts for the vision check, one
image token per image; A and B (same prompt and size) are the image-matters pair."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np

_PREFIX = "Look at this picture: "
_SUFFIX = " What does it show? Answer in one short sentence."
_BETWEEN = " and this one: "


@dataclass(frozen=True)
class ImageSample:
    """`ids`: one image token per image; `images`: PIL RGB; `sizes`: (h, w) before resizing."""

    name: str
    ids: list[int]
    images: list[Any]
    sizes: list[tuple[int, int]]


def gradient(height: int, width: int) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width]
    r = 255 * x / max(width - 1, 1)
    g = 255 * y / max(height - 1, 1)
    b = 255 - (r + g) / 2
    return np.stack([r, g, b], -1).astype(np.uint8)  # [H, W, 3]


def checkerboard(height: int, width: int, cell: int) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width]
    on = ((y // cell + x // cell) % 2).astype(bool)
    out = np.zeros((height, width, 3), np.uint8)
    out[on] = (230, 40, 40)
    out[~on] = (20, 20, 200)
    return out


def noise(height: int, width: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


class _Text:
    """Text as token ids: the tokenizer's, or seeded ids avoiding the config's special ids."""

    def __init__(self, tokenizer: Any, vocab_size: int, special: set[int]) -> None:
        self.tokenizer = tokenizer
        self.allowed = [t for t in range(3, vocab_size) if t not in special]
        self.rng = random.Random(4321)

    def __call__(self, text: str, first: bool = False) -> list[int]:
        if self.tokenizer is None:
            return [self.rng.choice(self.allowed) for _ in range(max(4, len(text) // 5))]
        return list(self.tokenizer.encode(text, add_special_tokens=first))


def _factor(config: dict[str, Any]) -> int:
    vision = config["vision_config"]
    return int(vision.get("patch_size", 14)) * int(vision.get("spatial_merge_size", 2))


def image_samples(
    config: dict[str, Any], tokenizer: Any, vocab_size: int, quick: bool
) -> list[ImageSample]:
    """The vision check's samples; the first two are the image-matters pair (A, B)."""
    from PIL import Image

    from hyla.multimodal.inputs import VisionSpec

    spec = VisionSpec.from_hf(config)
    special = {int(v) for k, v in config.items() if k.endswith("_token_id") and isinstance(v, int)}
    text = _Text(tokenizer, vocab_size, special)
    marker = [t for t in (spec.start_token_id, spec.image_token_id, spec.end_token_id)
              if t is not None]  # fmt: skip
    prefix, suffix, between = text(_PREFIX, first=True), text(_SUFFIX), text(_BETWEEN)
    f = _factor(config)

    def sample(name: str, arrays: list[np.ndarray]) -> ImageSample:
        ids = list(prefix)
        for i in range(len(arrays)):
            ids += (between if i else []) + marker
        images = [Image.fromarray(a) for a in arrays]
        return ImageSample(name, ids + suffix, images, [a.shape[:2] for a in arrays])

    out = [
        sample(f"A: gradient {2 * f}x{3 * f}", [gradient(2 * f, 3 * f)]),
        sample(f"B: noise {2 * f}x{3 * f}", [noise(2 * f, 3 * f, seed=0)]),
        sample(f"two images: checkerboard {3 * f}x{3 * f}, noise {2 * f + 3}x{4 * f - 1}",
               [checkerboard(3 * f, 3 * f, cell=max(1, f // 2)), noise(2 * f + 3, 4 * f - 1, 1)]),
    ]  # fmt: skip
    if not quick:
        three = [noise(1, 1, seed=2), gradient(6 * f, 4 * f), checkerboard(2 * f + 1, 5 * f, f)]
        sizes = f"gradient {6 * f}x{4 * f}, checkerboard {2 * f + 1}x{5 * f}"
        out.append(sample(f"three images: noise 1x1, {sizes}", three))
    return out
