"""`hyla validate --checks vision` on CUDA in bf16 (tiny glm5_next and qwen3_5 checkpoints of
tests.mm_tiny): hyla's kernels against transformers' fp32 image-text model, bounded by
transformers' own bf16-vs-fp32 error on the same device; the image-matters and repeat checks
pass too."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hyla.cli import app
from tests.mm_tiny import FAMILIES, cuda_marks, save_mm_checkpoint

pytestmark = cuda_marks()


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
