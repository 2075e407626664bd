"""Qwen3.5's vision tower (`hyla.layers.qwen3_5_vision`, loaded from the saved checkpoint's
`model.visual.*`) against transformers' `get_image_features` (fp32): images of many sizes (a
single pixel to 2048 on a side, square and not, multiples of the patch size and not) through
the family's own image processor (`Qwen2VLImageProcessorPil`) give the same rows within 1e-5,
one row per image placeholder; and a prompt with 1-3 images (hyla's tower rows in the
placeholders, M-RoPE positions) gives transformers' prefill logits within 1e-4 and its greedy
tokens."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from hyla.models.loader import load_model
from hyla.models.runner import SequenceRunner
from hyla.models.vision_loader import load_vision_tower
from hyla.ops.rotary.mrope import mrope_positions
from tests.qwen35_tiny import MM_IDS, save_tiny_qwen35

# Qwen2-VL's processor refuses aspect ratios above 200 (a ValueError the server must turn into a
# 400), so the thinnest image here is 2048 x 12
SIZES = [(1, 1), (7, 13), (16, 16), (33, 8), (100, 37), (2048, 12), (64, 2048)]


@pytest.fixture(scope="module")
def trio(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3_5_vision")
    torch.set_num_threads(1)
    hf = save_tiny_qwen35(path, seed=0)
    return hf, load_model(path, dtype="float32"), load_vision_tower(path)


@pytest.fixture(scope="module")
def models(trio):
    hf, _, tower = trio
    return hf, tower


def _processor():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    return Qwen2VLImageProcessorPil(patch_size=4, temporal_patch_size=2, merge_size=2,
                                    min_pixels=64, max_pixels=64 * 64)  # fmt: skip


@torch.no_grad()
def test_tower_matches_transformers_for_every_image_size(models):
    from PIL import Image

    hf, tower = models
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in SIZES]
    for image, size in zip(images, SIZES, strict=True):
        inputs = _processor()(images=[image], return_tensors="pt")
        grid = inputs["image_grid_thw"]
        want = hf.model.get_image_features(inputs["pixel_values"], grid).pooler_output[0]
        got = tower(inputs["pixel_values"], [tuple(g) for g in grid.tolist()])
        assert got.shape[0] == int(grid.prod()) // 4 == want.shape[0], size  # placeholders
        assert (got - want).abs().max().item() <= 1e-5, size


@torch.no_grad()
def test_two_images_in_one_call(models):
    from PIL import Image

    hf, tower = models
    rng = np.random.default_rng(1)
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
              for h, w in ((20, 44), (9, 9))]  # fmt: skip
    inputs = _processor()(images=images, return_tensors="pt")
    grid = inputs["image_grid_thw"]
    want = torch.cat(hf.model.get_image_features(inputs["pixel_values"], grid).pooler_output)
    got = tower(inputs["pixel_values"], [tuple(g) for g in grid.tolist()])
    assert (got - want).abs().max().item() <= 1e-5


def _prompt(grids) -> tuple[list[int], list[int]]:
    ids = [5, 6]
    for i, grid in enumerate(grids):
        ids += (
            [MM_IDS["vision_start_token_id"]]
            + [MM_IDS["image_token_id"]] * (int(np.prod(grid)) // 4)
            + [MM_IDS["vision_end_token_id"], 7 + i]
        )
    ids += [9, 10]
    return ids, [int(t == MM_IDS["image_token_id"]) for t in ids]


@pytest.mark.parametrize("sizes", [[(16, 24)], [(7, 13), (33, 8)], [(1, 1), (100, 37), (8, 64)]])
@torch.no_grad()
def test_image_prompt_logits_and_greedy_match_transformers(trio, sizes):
    """Placeholders filled by hyla's tower, M-RoPE positions (`mrope_positions`) through hyla's
    paged text model: transformers' prefill logits within 1e-4 and its 16 greedy tokens."""
    from PIL import Image

    hf, model, tower = trio
    rng = np.random.default_rng(len(sizes))
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]
    inputs = _processor()(images=images, return_tensors="pt")
    grids = [tuple(g) for g in inputs["image_grid_thw"].tolist()]
    ids, types = _prompt(grids)
    positions, delta = mrope_positions(types, grids, 2)
    embeds = model.embed_tokens(torch.tensor(ids))
    embeds[torch.tensor(types, dtype=torch.bool)] = tower(inputs["pixel_values"], grids)
    runner = SequenceRunner(model, 1, 256, block_size=8)
    got = runner.step({0: ids}, True, {0: embeds}, {0: positions})[0]
    hf_args = dict(pixel_values=inputs["pixel_values"], image_grid_thw=inputs["image_grid_thw"],
                   mm_token_type_ids=torch.tensor([types]))  # fmt: skip
    want = hf(torch.tensor([ids]), **hf_args).logits[0]
    assert (got - want).abs().max().item() <= 1e-4
    outs = [int(got[-1].argmax())]
    for k in range(15):
        pos = torch.full((3, 1), len(ids) + k + delta)
        outs.append(int(runner.step({0: [outs[-1]]}, mrope_positions={0: pos})[0].argmax()))
    ref = hf.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False, pad_token_id=0,
                      eos_token_id=None, **hf_args)[0, len(ids):].tolist()  # fmt: skip
    assert outs == ref


def test_mrope_positions_follow_the_image_grid():
    positions, delta = mrope_positions([0, 0, 1, 1, 1, 1, 1, 1, 0], [(1, 4, 6)], 2)
    assert positions.tolist() == [
        [0, 1, 2, 2, 2, 2, 2, 2, 5],
        [0, 1, 2, 2, 2, 3, 3, 3, 5],
        [0, 1, 2, 3, 4, 2, 3, 4, 5],
    ]
    assert delta == 6 - 9


@torch.no_grad()
def test_tower_makes_no_tensor_off_its_device(trio):
    """Every tensor the tower builds follows the input's device: run on PyTorch's meta device,
    where a tensor made on the CPU by default fails the op it meets, as it fails on CUDA."""
    tower = copy.deepcopy(trio[2]).to("meta")
    grids = [(1, 8, 12), (1, 4, 4)]
    dim = tower.patch_embed.proj.weight[0].numel()  # C * t * p * p
    pixels = torch.empty(sum(t * h * w for t, h, w in grids), dim)
    out = tower(pixels.to("meta"), grids)
    assert out.device.type == "meta" and out.shape[0] == (8 * 12 + 4 * 4) // 4
