"""`hyla validate --checks precision` on DSA models whose indexer scores tie (issue 41, item 3).

With 4 indexer heads the ReLU'd top-k boundary scores of a tiny DeepSeek-V3.2 / GLM-5.3-Flash
tie exactly; the reference's `torch.topk` then keeps an arbitrary one of them, and from that
row on the logits of hyla and transformers part. Oracles: hand-built score rows with known
ties (`tied_rows`); for the check's verdict, synthetic log-prob tables with a known error
position before and after a known tie; end to end, a PASS whose notes name the tie.
"""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from hyla.cli import app
from hyla.validate.precision import check_sample
from hyla.validate.result import CheckResult
from hyla.validate.ties import IndexerTieProbe, Tie, tied_rows
from tests.glm_tiny import save_tiny_glm
from tests.hf_tiny import save_tiny_hf_model

LOW = torch.finfo(torch.float32).min


def test_tied_rows_finds_boundary_ties_only():
    scores = torch.tensor([
        [3.0, 1.0, 1.0, 0.0],  # k=2: 2nd and 3rd equal -> tie
        [3.0, 2.0, 1.0, 1.0],  # tie below the boundary only
        [0.0, 0.0, LOW, LOW],  # the rest is masked: nothing to choose from
        [5.0, 0.0, 0.0, 0.0],  # ReLU zeros at the boundary
        [2.0, 1.0, 1.0 - 1e-7, 0.0],  # within rounding of the row's scale: a near-tie
    ])  # fmt: skip
    assert tied_rows(scores, 2).tolist() == [True, False, False, True, True]
    assert tied_rows(scores[None], 4).tolist() == [False] * 5  # k >= candidates: no boundary


class _Indexer(torch.nn.Module):  # named as transformers' indexer modules are: *Indexer
    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        return scores.topk(2, dim=-1).indices


def test_probe_reports_the_first_tied_row_of_an_indexer_forward():
    model = torch.nn.Sequential(_Indexer())
    probe = IndexerTieProbe(model)
    model(torch.tensor([[3.0, 2.0, 1.0], [3.0, 1.0, 1.0], [2.0, 0.0, 0.0]]))
    assert probe.first() == Tie(position=1, module="0", num_rows=2)
    probe.reset()
    torch.tensor([[3.0, 1.0, 1.0]]).topk(2)  # outside an indexer: not watched
    assert probe.first() is None


def _tables(num: int, wrong_at: int) -> tuple[torch.Tensor, list, list[int]]:
    """Reference log-probs over 32 tokens, hyla's top-k dicts equal but at `wrong_at`."""
    ref = torch.log_softmax(torch.randn(num, 32, generator=torch.Generator().manual_seed(0)), -1)
    got = [None] + [{t: float(ref[j, t]) + (0.5 if j == wrong_at else 0.0) for t in range(32)}
                    for j in range(num)]  # fmt: skip
    seq = [int(ref[j].argmax()) for j in range(num)]
    return ref, got, [0, *seq]


@pytest.mark.parametrize("wrong_at,fails", [(3, True), (7, False)], ids=["before", "after"])
def test_only_a_miss_before_the_first_tie_fails(wrong_at, fails):
    ref, got, seq = _tables(10, wrong_at)
    result = CheckResult("precision", "p")
    ids = seq[:-2]  # the last two tokens are the greedy continuation: equal on both sides
    check_sample(result, "s", ids, seq, got, seq[len(ids):], ref, None, "float32",
                 Tie(position=5, module="layers.1.indexer", num_rows=2))  # fmt: skip
    assert result.passed is not fails
    assert bool(result.notes) is not fails
    if not fails:
        assert "tie from position 5" in result.notes[0] and "layers.1.indexer" in result.notes[0]
        assert f"first at position {wrong_at}" in result.notes[0]


def _validate_precision(path, out):
    result = CliRunner().invoke(app, ["validate", str(path), "--checks", "precision", "--quick",
                                      "--device", "cpu", "--out", str(out)])  # fmt: skip
    return result, json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize("family", ["deepseek_v32", "glm5_next"])
def test_four_indexer_heads_pass_with_a_named_tie_report(family, tmp_path):
    """Before: FAIL with no hint (DeepSeek-V3.2), a crash (GLM's LM is its image-text model)."""
    model_dir = tmp_path / family
    if family == "glm5_next":
        save_tiny_glm(model_dir, seed=0, index_n_heads=4)
    else:
        save_tiny_hf_model(family, model_dir, seed=0, index_n_heads=4)
    result, summary = _validate_precision(model_dir, tmp_path / "report")
    precision = summary["checks"]["precision"]
    assert result.exit_code == 0 and precision["status"] == "pass", result.output
    assert precision["notes"] and all("indexer top-k boundary scores tie" in n
                                      for n in precision["notes"])  # fmt: skip
    assert "note: " in result.output
