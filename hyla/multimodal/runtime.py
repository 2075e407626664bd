"""The engine's image side: request preparation (processor, hash, placeholders, M-RoPE positions)
and each step's inputs (placeholder rows from the encoder cache, positions)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hyla.cache.mm_spans import ImageSpan, spans_in
from hyla.multimodal.encoder_cache import EncoderCache
from hyla.multimodal.inputs import (
    IMAGE_FIELD,
    ImageLimits,
    ProcessedImage,
    VisionSpec,
    check_images,
    expand_placeholders,
    load_image_processor,
    process_images,
    read_config,
)
from hyla.ops.rotary.mrope import mrope_positions
from hyla.request import InvalidRequestError, Request

logger = logging.getLogger("hyla.multimodal")


@dataclass(frozen=True)
class MultimodalPrompt:
    """A prompt's images, their placeholder spans, and (M-RoPE families) the prompt's positions
    [3, L] with `delta`: the position of token p >= L is p + delta on every axis."""

    images: tuple[ProcessedImage, ...]
    spans: tuple[ImageSpan, ...]
    positions: torch.Tensor | None = None
    delta: int = 0


@dataclass(frozen=True)
class PreparedPrompt:
    """Expanded ids and processed images: what `LLMEngine.add_request` takes off-thread."""

    prompt_token_ids: list[int]
    mm: MultimodalPrompt


class MultimodalRuntime:
    """`tower`: `forward(pixel_values, grids) -> rows` on the engine's device; `uses_mrope`:
    image rows take grid positions (Qwen3.5)."""

    def __init__(
        self,
        tower: torch.nn.Module,
        processor: Any,
        spec: VisionSpec,
        uses_mrope: bool,
        limits: ImageLimits,
    ) -> None:
        self.tower = tower
        self.processor = processor
        self.spec = spec
        self.uses_mrope = uses_mrope
        self.limits = limits
        self.cache = EncoderCache()
        self.prompts: dict[str, MultimodalPrompt] = {}
        self.max_encoder_tokens: int | None = None  # the engine's encoder budget per step

    @classmethod
    def from_path(
        cls, path: str | Path, model: torch.nn.Module, limits: ImageLimits
    ) -> MultimodalRuntime | None:
        """The runtime of checkpoint `path`, or None for a text-only model (also, logged, without
        preprocessor_config.json or vision tower tensors)."""
        from hyla.models.checkpoint import CheckpointError
        from hyla.models.vision_loader import load_vision_tower

        config = read_config(path)
        if "vision_config" not in config:
            return None
        if not (Path(path) / "preprocessor_config.json").exists():
            logger.warning(
                "images off: %s has a vision_config but no preprocessor_config.json", path
            )
            return None
        try:
            tower = load_vision_tower(path)
        except CheckpointError as e:  # a text-only export of a multimodal family
            logger.warning("images off: the checkpoint's vision tower does not load: %s", e)
            return None
        param = next(model.parameters())
        tower = tower.to(param.device, param.dtype)
        rope = model.config.rope  # None: no rotary at all (GLM's MLA without rope dims)
        section = None if rope is None else rope.scaling_dict().get("mrope_section")
        return cls(tower, load_image_processor(path), VisionSpec.from_hf(config),
                   section is not None, limits)  # fmt: skip

    def prepare(self, ids: Sequence[int], images: Sequence[Any]) -> PreparedPrompt:
        """Process `images`, expand their placeholders in `ids` (pure: safe in a worker thread)."""
        check_images(images, self.limits)
        processed = process_images(self.processor, images, self.spec.merge_size)
        self._check_budget(processed)
        expanded, spans = expand_placeholders(ids, self.spec.image_token_id, processed)
        if not self.uses_mrope:
            return PreparedPrompt(expanded, MultimodalPrompt(tuple(processed), spans))
        types = [0] * len(expanded)
        for s in spans:
            types[s.offset : s.end] = [1] * s.length
        grids = [p.grid_thw for p in processed]
        positions, delta = mrope_positions(types, grids, self.spec.merge_size)
        return PreparedPrompt(expanded, MultimodalPrompt(tuple(processed), spans, positions, delta))

    def _check_budget(self, images: Sequence[ProcessedImage]) -> None:
        limit = self.max_encoder_tokens
        for i, image in enumerate(images):
            if limit is not None and image.num_tokens > limit:
                raise InvalidRequestError(
                    f"{IMAGE_FIELD}[{i}]",
                    f"{image.num_tokens} image tokens, over the encoder budget of "
                    f"{limit} per step (max_num_encoder_input_tokens)",
                )

    def check_no_placeholders(self, ids: Sequence[int]) -> None:
        """A prompt without images must not hold the image token (InvalidRequestError("prompt"))."""
        if self.spec.image_token_id in ids:
            raise InvalidRequestError(
                "prompt",
                f"holds the image placeholder token (id "
                f"{self.spec.image_token_id}) but no image was given",
            )

    def placeholder_text(self, tokenizer: Any) -> str:
        """One image's text in a prompt: the family's start, image and end tokens."""
        spec = self.spec
        ids = [
            t
            for t in (spec.start_token_id, spec.image_token_id, spec.end_token_id)
            if t is not None
        ]
        return "".join(tokenizer.convert_ids_to_tokens(ids))

    def add(self, request_id: str, prompt: MultimodalPrompt) -> None:
        self.prompts[request_id] = prompt

    def release(self, request_id: str) -> None:
        self.prompts.pop(request_id, None)
        self.cache.release(request_id)

    def after_step(self, requests: Iterable[Request]) -> None:
        """Drop each request's references on the images it has computed entirely."""
        for req in requests:
            prompt = self.prompts.get(req.request_id)
            if prompt is None:
                continue
            for span in prompt.spans:
                if span.end <= req.num_computed_tokens:
                    self.cache.release(req.request_id, span.hash)

    def _rows(self, request_id: str, prompt: MultimodalPrompt, index: int) -> torch.Tensor:
        image = prompt.images[index]
        rows = self.cache.get(image.hash, request_id)
        if rows is None:
            device = next(self.tower.parameters()).device
            rows = self.tower(image.pixel_values.to(device), [image.grid_thw])
            self.cache.put(image.hash, request_id, rows)
        return rows

    def embeddings(
        self,
        ids: list[str],
        context_lens: list[int],
        query_lens: list[int],
        input_ids: torch.Tensor,
        embed: torch.nn.Module,
    ) -> torch.Tensor | None:
        """inputs_embeds [T, D] of a packed step whose rows reach image placeholders (encoding
        the images not cached), else None (the model embeds the ids itself)."""
        embeds, start = None, 0
        for rid, c, q in zip(ids, context_lens, query_lens, strict=True):
            prompt = self.prompts.get(rid)
            for span in spans_in(prompt.spans, c, c + q) if prompt is not None else ():
                rows = self._rows(rid, prompt, prompt.spans.index(span))
                if embeds is None:
                    embeds = embed(input_ids)
                lo, hi = max(c, span.offset), min(c + q, span.end)
                embeds[start + lo - c : start + hi - c] = rows[lo - span.offset : hi - span.offset]
            start += q
        return embeds

    def positions(
        self, ids: list[str], context_lens: list[int], query_lens: list[int], flat: torch.Tensor
    ) -> torch.Tensor:
        """The step's positions: `flat` [T] (position = context index) unless an M-RoPE image
        request is in it: [3, T] when one of its prompt rows is, else [T] shifted by deltas."""
        found = [(i, self.prompts[r]) for i, r in enumerate(ids)
                 if r in self.prompts and self.prompts[r].positions is not None]  # fmt: skip
        if not found:
            return flat
        starts = [0]
        for q in query_lens:
            starts.append(starts[-1] + q)
        in_prompt = any(context_lens[i] < p.positions.shape[1] for i, p in found)
        out = flat.expand(3, -1).clone() if in_prompt else flat.clone()
        for i, p in found:
            c, q, length = context_lens[i], query_lens[i], p.positions.shape[1]
            rows = out[..., starts[i] : starts[i] + q]
            if c < length:
                rows[:, : length - c] = p.positions[:, c : c + q].to(out.device)
            rows[..., max(0, length - c) :] += p.delta
        return out

    def decode_positions(self, ids: list[str], context_lens: list[int]) -> list[int]:
        """A pure decode step's positions (the captured graphs' host list)."""
        out = []
        for rid, c in zip(ids, context_lens, strict=True):
            prompt = self.prompts.get(rid)
            out.append(c + (prompt.delta if prompt is not None else 0))
        return out
