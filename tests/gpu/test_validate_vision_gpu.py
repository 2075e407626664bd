"""`hyla validate --checks vision` on CUDA in bf16 (tiny glm5_next and qwen3_5 checkpoints of
tests.mm_tiny): hyla's kernels against transformers' fp32 image-text model, bounded by
transformers' own bf16-vs-fp32 error on the same device; the image-matters and repeat checks
pass too."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from typer.testing import CliRunner

from hyla.cli import app
from hyla.ops.kda.kernels import fla_available
from tests.mm_tiny import FAMILIES, save_mm_checkpoint

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(
        torch.cuda.is_available() and not fla_available(), reason="needs fla-core (and einops)"
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("transformers.models.glm5_next") is None,
        reason="needs transformers >= 5.24 to build the tiny checkpoints",
    ),
]


@pytest.mark.parametrize("family", FAMILIES)
def test_vision_check_passes_on_cuda_in_bf16(family, tmp_path):
    save_mm_checkpoint(family, tmp_path / "m")
    out = tmp_path / "r"
    result = CliRunner().invoke(app, ["validate", str(tmp_path / "m"), "--checks", "vision",
                                      "--quick", "--device", "cuda", "--dtype", "bfloat16",
                                      "--out", str(out)])  # fmt: skip
    vision = json.loads((out / "summary.json").read_text())["checks"]["vision"]
    assert result.exit_code == 0, (result.output, vision["failures"])
    assert vision["status"] == "pass" and vision["bound"].startswith("bfloat16: <= 1.5x")
    assert vision["metrics"]["repeat_cached_tokens"] > 0
