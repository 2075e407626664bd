"""Tiny multimodal checkpoints for the serving-path image tests: the tiny random glm5_next,
qwen3_5 and qwen3_5_moe models (tests.glm_tiny, tests.qwen35_tiny, tests.qwen35_moe_tiny)
saved with a local tokenizer whose special tokens sit at the models' image ids, and the
family's own transformers image processor (preprocessor_config.json), so `LLMEngine.from_path`
and `hyla serve` load them as shipped."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.engine.tiny_tokenizer import build_tokenizer
from tests.glm_tiny import MM_IDS as GLM_IDS
from tests.glm_tiny import save_tiny_glm
from tests.qwen35_moe_tiny import save_tiny_qwen35_moe
from tests.qwen35_tiny import MM_IDS as QWEN_IDS
from tests.qwen35_tiny import save_tiny_qwen35

FAMILIES = ("glm5_next", "qwen3_5")  # qwen3_5_moe: the same tower (tests/multimodal)
# (image token, start, end) ids of each family's tiny config
IMAGE_IDS = {
    "glm5_next": (GLM_IDS["image_token_id"], GLM_IDS["image_start_token_id"],
                  GLM_IDS["image_end_token_id"]),
    "qwen3_5": (QWEN_IDS["image_token_id"], QWEN_IDS["vision_start_token_id"],
                QWEN_IDS["vision_end_token_id"]),
}
IMAGE_IDS["qwen3_5_moe"] = IMAGE_IDS["qwen3_5"]  # the same ids (tests.qwen35_moe_tiny)  # fmt: skip
SPECIAL_TEXT = {248: "<|vision_start|>", 249: "<|vision_end|>", 250: "<|image_pad|>"}


def image_processor(family: str):
    """The family's transformers image processor, tiny patches (at most 256 image tokens)."""
    if family == "glm5_next":
        from transformers.models.glm5_next.image_processing_pil_glm5_next import (
            Glm5NextImageProcessorPil,
        )

        return Glm5NextImageProcessorPil(
            patch_size=4, temporal_patch_size=2, merge_size=2, max_image_tokens=256
        )
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    return Qwen2VLImageProcessorPil(
        patch_size=4, temporal_patch_size=2, merge_size=2, min_pixels=64, max_pixels=64 * 64
    )


def image_tokenizer():
    """The tiny tokenizer with fillers up to id 248, then the image specials at 248-250."""
    tok = build_tokenizer()
    fillers = [f"<|filler{i}|>" for i in range(248 - len(tok))]
    tok.add_special_tokens({"additional_special_tokens": fillers + list(SPECIAL_TEXT.values())})
    assert tok.convert_tokens_to_ids(SPECIAL_TEXT[250]) == 250
    return tok


def save_mm_checkpoint(family: str, path: Path, seed: int = 0):
    """Model (safetensors), tokenizer and image processor into `path`; returns the HF model."""
    savers = {"glm5_next": save_tiny_glm, "qwen3_5": save_tiny_qwen35,
              "qwen3_5_moe": save_tiny_qwen35_moe}  # fmt: skip
    hf = savers[family](path, seed=seed)
    image_tokenizer().save_pretrained(path)
    image_processor(family).save_pretrained(path)
    return hf


def random_images(sizes, seed: int = 0):
    """PIL RGB images of (height, width) `sizes`, random pixels."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]


def hf_inputs(family: str, images):
    """What transformers' model takes for `images`: pixel_values and image_grid_thw."""
    return image_processor(family)(images=images, return_tensors="pt")


def cuda_marks() -> list:
    """The marks of a GPU test on these checkpoints: CUDA, fla-core, a transformers that has
    the families' config classes."""
    import importlib.util

    import pytest
    import torch

    from hyla.ops.kda.kernels import fla_available

    cuda = torch.cuda.is_available()
    return [
        pytest.mark.gpu,
        pytest.mark.skipif(not cuda, reason="needs CUDA"),
        pytest.mark.skipif(cuda and not fla_available(), reason="needs fla-core (and einops)"),
        pytest.mark.skipif(
            importlib.util.find_spec("transformers.models.glm5_next") is None,
            reason="needs transformers >= 5.24 to build the tiny checkpoints",
        ),
    ]
