"""`hyla validate --checks vision` on the tiny multimodal checkpoints (tests/mm_tiny.py).

Oracle: transformers' image-text model on the same checkpoint (fp32, eager, the checkpoint's own
image processor; placeholders expanded from the processor's grid). A broken engine (the image's
encoder rows reversed, or zeroed) must fail at the image's first placeholder, naming the sample
and the bound.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from hyla.cli import app
from hyla.multimodal.runtime import MultimodalRuntime
from tests.mm_tiny import FAMILIES, IMAGE_IDS, save_mm_checkpoint


@pytest.fixture(scope="module", params=FAMILIES)
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"{request.param}_validate")
    save_mm_checkpoint(request.param, path)
    return request.param, path


def _validate(model, out, *args: str):
    result = CliRunner().invoke(app, ["validate", str(model), "--checks", "vision", "--quick",
                                      "--device", "cpu", "--out", str(out), *args])  # fmt: skip
    return result, json.loads((out / "summary.json").read_text())["checks"]["vision"]


def test_tiny_multimodal_family_passes_against_transformers(checkpoint, tmp_path):
    _, path = checkpoint
    result, vision = _validate(path, tmp_path / "r")
    assert result.exit_code == 0, result.output
    assert vision["status"] == "pass" and not vision["failures"]
    assert vision["reason"].startswith("reference: transformers image-text model (float32)")
    metrics = vision["metrics"]
    assert metrics["max_logprob_diff"] <= 1e-3 and metrics["min_top1_agreement"] == 1.0
    assert metrics["image_effect"] > 1e-3  # image B against image A's reference breaks the bound
    assert metrics["repeat_cached_tokens"] > 0
    assert (
        metrics["preprocess_ms_per_image"] > 0 and metrics["preprocess_ms_per_image_concurrent"] > 0
    )
    report = (tmp_path / "r" / "report.md").read_text()
    assert report.count("| A: gradient") == 1 and "| two images: checkerboard" in report
    assert (tmp_path / "r" / "vision.png").stat().st_size > 0


def _sample_a(path):
    from transformers import AutoTokenizer

    from hyla.validate.vision_samples import image_samples

    config = json.loads((path / "config.json").read_text())
    return image_samples(config, AutoTokenizer.from_pretrained(str(path)), 256, quick=True)[0]


@pytest.mark.parametrize("fault", ["reversed", "zeros"])
def test_broken_image_rows_fail_naming_the_sample_and_the_bound(fault, monkeypatch, tmp_path):
    family = "qwen3_5"
    path = tmp_path / "m"
    save_mm_checkpoint(family, path)
    rows_of = MultimodalRuntime._rows

    def broken(self, request_id, prompt, index):
        rows = rows_of(self, request_id, prompt, index)
        return rows.flip(0) if fault == "reversed" else torch.zeros_like(rows)

    monkeypatch.setattr(MultimodalRuntime, "_rows", broken)
    result, vision = _validate(path, tmp_path / "r")
    assert result.exit_code == 1, result.output
    assert vision["status"] == "fail"
    image = IMAGE_IDS[family][0]
    first = vision["failures"][0]
    assert first.startswith("A: gradient 16x24: |logprob diff| ") and "> 0.001 first at" in first
    # the first placeholder: hyla and the reference expand the one image token in place
    k = _sample_a(path).ids.index(image)
    assert first.endswith(f"first at position {k} (token {image} -> {image})"), first
    assert any(f.startswith("two images:") for f in vision["failures"])


def test_text_only_model_is_skipped_without_loading_it(tmp_path):
    from hyla.validate.runner import Context
    from hyla.validate.vision import run_vision
    from tests.hf_tiny import save_tiny_hf_model

    save_tiny_hf_model("qwen3_next", tmp_path / "m", seed=0)
    ctx = Context(model=tmp_path / "m", reference=tmp_path / "m", out_dir=tmp_path / "r",
                  device="cpu", dtype="float32", quick=True)  # fmt: skip
    result = run_vision(ctx, type("Bar", (), {"update": lambda self, n: None})())
    assert result.status == "skipped" and result.reason == "skipped: no vision (text-only model)"
    assert ctx._llm is None


def test_without_an_image_processor_the_check_is_skipped_saying_why(tmp_path):
    path = tmp_path / "m"
    save_mm_checkpoint("qwen3_5", path)
    (path / "preprocessor_config.json").unlink()
    result, vision = _validate(path, tmp_path / "r")
    assert result.exit_code == 0 and vision["status"] == "skipped"
    assert vision["reason"].startswith("skipped: no vision tower loaded")
    assert "preprocessor_config.json" in vision["reason"]


def test_identical_images_fail_the_image_matters_check(monkeypatch, tmp_path):
    """With B's image equal to A's, nothing could show an engine ignoring images: the check
    must say so rather than pass."""
    from hyla.validate import vision_samples

    path = tmp_path / "m"
    save_mm_checkpoint("qwen3_5", path)
    monkeypatch.setattr(vision_samples, "noise", lambda h, w, seed: vision_samples.gradient(h, w))
    result, vision = _validate(path, tmp_path / "r")
    assert result.exit_code == 1 and vision["status"] == "fail"
    assert vision["failures"] == [vision["failures"][0]], vision["failures"]
    assert vision["failures"][0].startswith("image matters: hyla's logprobs with B's image are "
                                            "within the bound")  # fmt: skip


def test_image_pair_has_one_size_and_other_pixels():
    from hyla.validate.vision_samples import image_samples

    image, start, end = IMAGE_IDS["qwen3_5"]
    config = {
        "vision_config": {"patch_size": 4, "spatial_merge_size": 2},
        "image_token_id": image,
        "vision_start_token_id": start,
        "vision_end_token_id": end,
        "video_token_id": 251,
    }
    a, b, two = image_samples(config, None, 256, quick=True)
    assert a.ids == b.ids and a.sizes == b.sizes == [(16, 24)]
    assert not np.array_equal(np.asarray(a.images[0]), np.asarray(b.images[0]))
    assert two.sizes == [(24, 24), (19, 31)]  # square; not a multiple of the patch
    assert a.ids.count(image) == 1 and two.ids.count(image) == 2 and 251 not in two.ids
    assert image_samples(config, None, 256, quick=True)[2].ids == two.ids  # deterministic


def test_bf16_is_bounded_by_the_references_own_bf16_error(tmp_path):
    save_mm_checkpoint("qwen3_5", tmp_path / "m")
    result, vision = _validate(tmp_path / "m", tmp_path / "r", "--dtype", "bfloat16")
    assert result.exit_code == 0, result.output
    assert vision["bound"].startswith("bfloat16: <= 1.5x the reference's own")
    assert "own error: transformers image-text model (bfloat16)" in vision["reason"]
    assert 1e-4 < vision["metrics"]["max_logprob_diff"] < 0.2  # bf16 error, not fp32's


def test_image_requests_missing_the_prefix_cache_fail_the_repeat_check(monkeypatch, tmp_path):
    """An engine whose image requests never hit the prefix cache (every match a miss): the
    outputs still equal the reference's, so only the repeat check can see it."""
    from hyla.cache.prefix import PrefixCache, PrefixHit

    save_mm_checkpoint("qwen3_5", tmp_path / "m")
    monkeypatch.setattr(PrefixCache, "match", lambda self, req: PrefixHit())
    result, vision = _validate(tmp_path / "m", tmp_path / "r")
    assert result.exit_code == 1 and vision["status"] == "fail"
    (failure,) = vision["failures"]
    assert failure.startswith("repeat: the second identical request reused 0 cached tokens")
    assert failure.endswith("and encoded 1 images again"), failure


def test_text_checks_run_on_a_multimodal_checkpoint(tmp_path):
    """Their random-id prompts held the image token (id 250 of 256), which the engine refuses
    without an image: they draw below the first image/video id now."""
    save_mm_checkpoint("qwen3_5", tmp_path / "m")
    out = tmp_path / "r"
    result = CliRunner().invoke(app, ["validate", str(tmp_path / "m"), "--checks",
                                      "precision,long_context,throughput", "--quick", "--device",
                                      "cpu", "--out", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    checks = json.loads((out / "summary.json").read_text())["checks"]
    assert {c: v["status"] for c, v in checks.items()} == dict.fromkeys(
        ("precision", "long_context", "throughput"), "pass")  # fmt: skip
