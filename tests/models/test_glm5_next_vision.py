"""GLM-5.3-Flash's vision tower and image prompts against transformers (fp32, eager).

Images of many sizes (a single pixel to 2048 on a side, square and not, multiples of the patch
size and not) go through the checkpoint family's own `transformers` image processor
(`Glm5NextImageProcessorPil`); hyla's tower (`hyla.layers.glm5_next_vision`, loaded from the
saved checkpoint's `model.visual.*`) must give transformers' `get_image_features` rows within
1e-5, one row per placeholder; a prompt with 1-3 images gives transformers' prefill logits
within 1e-4 and its greedy tokens (hyla fills the placeholder embeddings, then runs its own
paged text model).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from hyla.models.loader import load_model
from hyla.models.runner import SequenceRunner
from hyla.models.vision_loader import load_vision_tower
from tests.glm_tiny import MM_IDS, save_tiny_glm

SIZES = [(1, 1), (7, 13), (16, 16), (33, 8), (100, 37), (2048, 5), (64, 2048)]
IMAGE = MM_IDS["image_token_id"]
START, END = MM_IDS["image_start_token_id"], MM_IDS["image_end_token_id"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    path = tmp_path_factory.mktemp("glm5_next_vision")
    torch.set_num_threads(1)
    hf = save_tiny_glm(path, seed=0)
    return hf, load_model(path, dtype="float32"), load_vision_tower(path)


def _processor():
    from transformers.models.glm5_next.image_processing_pil_glm5_next import (
        Glm5NextImageProcessorPil,
    )

    # at most 256 placeholders (1024 patches) per image: a large image is resized down by the
    # processor, and transformers' eager vision attention stays small ([heads, N, N] floats)
    return Glm5NextImageProcessorPil(
        patch_size=4, temporal_patch_size=2, merge_size=2, max_image_tokens=256
    )


def _images(sizes, seed=0):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]


@torch.no_grad()
def test_tower_matches_transformers_for_every_image_size(models):
    hf, _, tower = models
    for image, size in zip(_images(SIZES), SIZES, strict=True):
        inputs = _processor()(images=[image], return_tensors="pt")
        grid = inputs["image_grid_thw"]
        want = hf.model.get_image_features(inputs["pixel_values"], grid).pooler_output[0]
        got = tower(inputs["pixel_values"], [tuple(g) for g in grid.tolist()])
        assert got.shape[0] == int(grid.prod()) // 4 == want.shape[0], size  # placeholders
        assert (got - want).abs().max().item() <= 1e-5, size


def _prompt(grids) -> list[int]:
    ids = [5, 6]
    for i, grid in enumerate(grids):
        ids += [START] + [IMAGE] * (int(np.prod(grid)) // 4) + [END, 7 + i]
    return ids + [9, 10]


@pytest.mark.parametrize("sizes", [[(16, 16)], [(7, 13), (33, 8)], [(1, 1), (100, 37), (8, 64)]])
@torch.no_grad()
def test_image_prompt_logits_and_greedy_match_transformers(models, sizes):
    hf, model, tower = models
    inputs = _processor()(images=_images(sizes, seed=len(sizes)), return_tensors="pt")
    grids = [tuple(g) for g in inputs["image_grid_thw"].tolist()]
    ids = _prompt(grids)
    image_rows = tower(inputs["pixel_values"], grids)
    embeds = model.embed_tokens(torch.tensor(ids))
    embeds[torch.tensor(ids) == IMAGE] = image_rows
    runner = SequenceRunner(model, 1, 256, block_size=8)
    got = runner.step({0: ids}, all_logits=True, embeds={0: embeds})[0]
    hf_args = dict(pixel_values=inputs["pixel_values"], image_grid_thw=inputs["image_grid_thw"])
    want = hf(torch.tensor([ids]), **hf_args).logits[0]
    assert (got - want).abs().max().item() <= 1e-4
    outs = [int(got[-1].argmax())]
    for _ in range(15):
        outs.append(int(runner.step({0: [outs[-1]]})[0].argmax()))
    ref = hf.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False, pad_token_id=0,
                      eos_token_id=None, **hf_args)[0, len(ids):].tolist()  # fmt: skip
    assert outs == ref


@torch.no_grad()
def test_chunked_prefill_through_an_image(models):
    """I1 with images: chunks that cut an image's placeholders give the one-prefill logits."""
    _, model, tower = models
    inputs = _processor()(images=_images([(40, 24)]), return_tensors="pt")
    grids = [tuple(g) for g in inputs["image_grid_thw"].tolist()]
    ids = _prompt(grids)
    embeds = model.embed_tokens(torch.tensor(ids))
    embeds[torch.tensor(ids) == IMAGE] = tower(inputs["pixel_values"], grids)
    whole = SequenceRunner(model, 1, 256, block_size=8).step({0: ids}, True, {0: embeds})[0]
    runner, parts = SequenceRunner(model, 1, 256, block_size=8, seed=2), []
    for s in range(0, len(ids), 7):
        parts.append(runner.step({0: ids[s : s + 7]}, True, {0: embeds[s : s + 7]})[0])
    assert torch.allclose(torch.cat(parts), whole, atol=1e-5, rtol=0)


def test_a_text_only_family_has_no_tower(tmp_path):
    from hyla.config import ConfigError

    (tmp_path / "config.json").write_text('{"model_type": "kimi_linear"}')
    with pytest.raises(ConfigError, match="vision_config"):
        load_vision_tower(tmp_path)


@torch.no_grad()
def test_tower_makes_no_tensor_off_its_device(models):
    """Every tensor the tower builds follows the input's device: run on PyTorch's meta device,
    where a tensor made on the CPU by default (e.g. a rope frequency table) fails the op it
    meets, as it fails on CUDA (an H200 run found one)."""
    _, _, tower = models
    meta = copy.deepcopy(tower).to("meta")
    grids = [(1, 8, 12), (1, 4, 4)]
    pixels = torch.empty(sum(t * h * w for t, h, w in grids), tower.config.patch_dim)
    out = meta(pixels.to("meta"), grids)
    assert out.device.type == "meta" and out.shape[0] == (8 * 12 + 4 * 4) // 4
