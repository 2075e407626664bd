"""`hyla validate --quick` end to end on the CPU: the embedded model and tiny checkpoints of the
three supported families pass and write every report file; a checkpoint with one embedding
row perturbed fails the precision check at the position where that token first appears.

Oracles: `transformers` on the same (or, for the broken model, the unperturbed) checkpoint;
for the embedded native-layout model, its one-shot fp32 forward (`references.NativeReference`).
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from hyla.cli import app
from hyla.validate.samples import precision_samples
from tests.hf_tiny import FAMILIES, save_tiny_hf_model

REPORT_FILES = ("report.md", "report.html", "summary.json")


def _validate(out, *args: str):
    result = CliRunner().invoke(app, ["validate", *args, "--quick", "--device", "cpu",
                                      "--out", str(out)])  # fmt: skip
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() \
        else None  # fmt: skip
    return result, summary


def _assert_report(out, summary, plots: tuple[str, ...]) -> None:
    for name in REPORT_FILES + plots:
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    html = (out / "report.html").read_text()
    assert all(f"src='{p}'" in html for p in plots)
    assert summary["checks"]["vision"]["reason"] == "skipped: no vision (text-only model)"


def test_embedded_model_passes_all_checks(tmp_path):
    """All checks, the live server's included: under load its request timeout cuts greedy runs
    short, which the comparisons now allow for (tests/validate/test_service_timeouts.py)."""
    out = tmp_path / "report"
    result, summary = _validate(out)
    assert result.exit_code == 0, result.output
    assert summary["passed"] and summary["dtype"] == "float32"
    _assert_report(out, summary, ("precision.png", "throughput.png", "long_context.png"))
    assert {c: v["status"] for c, v in summary["checks"].items()} == {
        "precision": "pass", "long_context": "pass", "throughput": "pass", "service": "pass",
        "vision": "skipped"}  # fmt: skip
    assert summary["checks"]["long_context"]["metrics"]["state_slots_max"] == 1
    precision = summary["checks"]["precision"]
    assert precision["status"] == "pass" and precision["metrics"]["min_top1_agreement"] == 1.0
    throughput = summary["checks"]["throughput"]["metrics"]
    assert throughput["max_num_seqs"] >= 1 and throughput["max_num_batched_tokens"] >= 32


@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    save_tiny_hf_model(request.param, path, seed=0)
    return path


def test_tiny_family_passes_against_transformers(tiny, tmp_path):
    out = tmp_path / "report"
    result, summary = _validate(out, str(tiny), "--checks",
                                "precision,long_context,throughput,vision")  # fmt: skip
    assert result.exit_code == 0, result.output
    _assert_report(out, summary, ("precision.png", "throughput.png", "long_context.png"))
    assert summary["checks"]["precision"]["reason"].startswith("reference: transformers")


def test_perturbed_layer_fails_precision_at_the_right_position(tmp_path):
    good = tmp_path / "good"
    save_tiny_hf_model("kimi_linear", good, seed=0)
    seq = precision_samples(None, 256, 48)[0][1]
    k = next(i for i, t in enumerate(seq) if i >= 12 and t not in seq[:i])
    broken = tmp_path / "broken"
    shutil.copytree(good, broken)
    weights = load_file(broken / "model.safetensors")
    name = "model.embed_tokens.weight"
    weights[name] = weights[name].clone()
    weights[name][seq[k]] += 0.5 * torch.randn(weights[name].shape[1])
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    out = tmp_path / "report"
    result, summary = _validate(out, str(broken), "--reference", str(good),
                                "--checks", "precision")  # fmt: skip
    assert result.exit_code == 1, result.output
    precision = summary["checks"]["precision"]
    assert precision["status"] == "fail" and not summary["passed"]
    first = precision["failures"][0]
    assert first.startswith("random-ids-48:") and f"first at position {k} " in first, first
    assert (out / "report.md").read_text().count("FAIL") >= 2


def test_unknown_check_is_an_error(tmp_path):
    result, _ = _validate(tmp_path / "r", "--checks", "precision,nope")
    assert result.exit_code == 2 and "checks: unknown ['nope']" in result.output


def test_unreachable_url_fails_service_and_still_writes_the_report(tmp_path):
    out = tmp_path / "report"
    result, summary = _validate(out, "--checks", "service,vision", "--url",
                                "http://127.0.0.1:9/v1")  # fmt: skip
    assert result.exit_code == 1, result.output
    service = summary["checks"]["service"]
    assert (
        service["status"] == "fail" and "the check crashed: ConnectError" in service["failures"][0]
    )
    assert summary["checks"]["vision"]["status"] == "skipped"
    assert all((out / name).is_file() for name in REPORT_FILES)


def test_bf16_is_bounded_by_the_references_own_bf16_error(tmp_path):
    """bf16 on the CPU: hyla against transformers fp32, bounded by transformers' own
    bf16-vs-fp32 error on the same positions."""
    model = tmp_path / "kimi"
    save_tiny_hf_model("kimi_linear", model, seed=0)
    out = tmp_path / "report"
    result, summary = _validate(out, str(model), "--dtype", "bfloat16", "--checks", "precision")
    assert result.exit_code == 0, result.output
    precision = summary["checks"]["precision"]
    assert precision["bound"].startswith("bfloat16: <= 1.5x the reference's own")
    assert 0 < precision["metrics"]["max_logprob_diff"] < 0.2  # bf16 error, not fp32's


def test_throughput_cell_times_decode_on_prompts_the_prefix_cache_has_not_seen(monkeypatch):
    """The N-token run used the 1-token run's prompts, so the prefix cache skipped their
    prefill and TPOT = (time_N - time_1) / (N - 1) came out as 0 ms (embedded model, L=128)."""
    from hyla.validate import throughput

    seen = []
    monkeypatch.setattr(throughput, "_timed", lambda llm, prompts, n: seen.append(prompts) or 1.0)
    throughput._cell(None, batch=4, length=128, out=8, vocab=8192)
    first, second = seen
    assert len(first) == len(second) == 4 and {len(p) for p in first + second} == {128}
    first_blocks = {tuple(p[:16]) for p in first}  # the smallest block size's first block
    assert not any(tuple(p[:16]) in first_blocks for p in second)
