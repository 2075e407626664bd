"""Images -> model inputs: the checkpoint's transformers processor, a content hash per image, and
placeholder expansion (one image token -> t * h * w / m^2 rows), limits checked first."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hyla.cache.mm_spans import ImageSpan
from hyla.config import ConfigError
from hyla.request import InvalidRequestError

IMAGE_FIELD = "multi_modal_data.image"


@dataclass(frozen=True)
class VisionSpec:
    """What the serving path needs to know of a checkpoint's vision side (config.json)."""

    family: str
    image_token_id: int
    start_token_id: int | None
    end_token_id: int | None
    merge_size: int

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> VisionSpec:
        """From a multimodal config.json (Qwen3.5's or GLM's names). Raises ConfigError."""
        if "image_token_id" not in config or "vision_config" not in config:
            raise ConfigError("image_token_id: config.json has no image token / vision_config")
        start = config.get("vision_start_token_id", config.get("image_start_token_id"))
        end = config.get("vision_end_token_id", config.get("image_end_token_id"))
        return cls(
            family=str(config.get("model_type")),
            image_token_id=int(config["image_token_id"]),
            start_token_id=None if start is None else int(start),
            end_token_id=None if end is None else int(end),
            merge_size=int(config["vision_config"].get("spatial_merge_size", 2)),
        )


@dataclass(frozen=True)
class ImageLimits:
    """Per-request image limits (vLLM's `--limit-mm-per-prompt` for the count)."""

    max_images: int = 4
    max_pixels: int = 4096 * 4096

    def __post_init__(self) -> None:
        if self.max_images < 0 or self.max_pixels < 1:
            raise ConfigError("limit_mm_per_prompt: must be >= 0; max_image_pixels >= 1")


@dataclass(frozen=True)
class ProcessedImage:
    """One image as its vision tower takes it: `pixel_values [N, C*t*p*p]` (host), its patch
    grid (t, h, w), `num_tokens` = t*h*w / m^2 placeholder rows, and the content hash."""

    pixel_values: torch.Tensor
    grid_thw: tuple[int, int, int]
    num_tokens: int
    hash: str


def load_image_processor(path: str | Path) -> Any:
    """The checkpoint's transformers image processor. Raises ConfigError without one."""
    directory = Path(path)
    if not (directory / "preprocessor_config.json").exists():
        raise ConfigError(
            f"preprocessor_config.json: not found in {directory} (needed to process images)"
        )
    from transformers import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(str(directory), local_files_only=True)


def read_config(path: str | Path) -> dict[str, Any]:
    return json.loads((Path(path) / "config.json").read_text())


def image_hash(pixel_values: torch.Tensor, grid_thw: Sequence[int]) -> str:
    """blake2b of a processed image's pixels and grid: equal images share caches and blocks."""
    digest = hashlib.blake2b(repr(tuple(grid_thw)).encode(), digest_size=16)
    digest.update(pixel_values.contiguous().numpy().tobytes())
    return digest.hexdigest()


def check_images(images: Sequence[Any], limits: ImageLimits) -> None:
    """Count, type and size checks before processing. Raises InvalidRequestError."""
    from PIL import Image

    if len(images) > limits.max_images:
        raise InvalidRequestError(
            IMAGE_FIELD,
            f"{len(images)} images but at most "
            f"{limits.max_images} per prompt (limit_mm_per_prompt)",
        )
    for i, image in enumerate(images):
        field = f"{IMAGE_FIELD}[{i}]"
        if not isinstance(image, Image.Image):
            raise InvalidRequestError(field, f"expected a PIL image, got {type(image).__name__}")
        w, h = image.size
        if w < 1 or h < 1:
            raise InvalidRequestError(field, f"zero-sized image ({w} x {h})")
        if w * h > limits.max_pixels:
            raise InvalidRequestError(
                field,
                f"{w} x {h} = {w * h} pixels, over the limit of "
                f"{limits.max_pixels} (max_image_pixels)",
            )


def process_images(processor: Any, images: Sequence[Any], merge: int) -> list[ProcessedImage]:
    """Each image through `processor` alone. Raises InvalidRequestError naming a refused image."""
    out = []
    for i, image in enumerate(images):
        try:
            inputs = processor(images=[image.convert("RGB")], return_tensors="pt")
        except Exception as e:  # noqa: BLE001 - a processor's refusal is the image's fault
            raise InvalidRequestError(
                f"{IMAGE_FIELD}[{i}]", f"the image processor refused it: {e}"
            ) from e
        grid = tuple(int(g) for g in inputs["image_grid_thw"][0].tolist())
        pixels = inputs["pixel_values"].float()
        rows = grid[0] * grid[1] * grid[2] // (merge * merge)
        out.append(ProcessedImage(pixels, grid, rows, image_hash(pixels, grid)))  # type: ignore[arg-type]
    return out


def expand_placeholders(
    ids: Sequence[int], image_token_id: int, images: Sequence[ProcessedImage]
) -> tuple[list[int], tuple[ImageSpan, ...]]:
    """Each image token of the prompt (one per image) -> its image's placeholder rows; returns
    the ids and spans. Raises InvalidRequestError("prompt") when the counts differ."""
    positions = [i for i, t in enumerate(ids) if t == image_token_id]
    if len(positions) != len(images):
        raise InvalidRequestError(
            "prompt",
            f"{len(positions)} image placeholders (token id "
            f"{image_token_id}) for {len(images)} images: write one per "
            "image",
        )
    out: list[int] = []
    spans = []
    last = 0
    for pos, image in zip(positions, images, strict=True):
        out.extend(ids[last:pos])
        spans.append(ImageSpan(len(out), image.num_tokens, image.hash))
        out.extend([image_token_id] * image.num_tokens)
        last = pos + 1
    out.extend(ids[last:])
    return out, tuple(spans)


def images_of(data: Any) -> list[Any]:
    """The images of a request's `multi_modal_data` (vLLM's shape: {"image": image or list of
    images}); [] for None. Raises InvalidRequestError for any other key or shape."""
    if data is None:
        return []
    if not isinstance(data, dict):
        raise InvalidRequestError("multi_modal_data", f"expected a dict, got {type(data).__name__}")
    unknown = sorted(set(data) - {"image"})
    if unknown:
        raise InvalidRequestError(
            f"multi_modal_data.{unknown[0]}", "not supported (this engine takes images only)"
        )
    images = data.get("image")
    if images is None:
        return []
    return list(images) if isinstance(images, (list, tuple)) else [images]
