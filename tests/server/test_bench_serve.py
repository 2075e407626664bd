"""`hyla bench serve`'s arrivals, percentiles and progress bar, against a live tiny server.

Oracles: numpy's exponential draws and percentiles computed here independently, the server's own
usage counts, and the client-side send times recorded by a wrapped request function (Poisson
arrivals must not start a request before its scheduled time)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from hyla import bench_serve
from hyla.bench_serve import BenchConfig, arrival_times, run_bench, summarize
from hyla.cli import app

runner = CliRunner()


def test_summarize_is_numpys_linear_percentile():
    values = [5.0, 1.0, 3.0, 10.0, 2.5]
    got = summarize(values)
    for q in (50, 90, 99):
        assert got[f"p{q}"] == pytest.approx(float(np.percentile(values, q)))
    assert got["mean"] == pytest.approx(4.3)
    assert summarize([]) == {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}


def test_arrival_times_are_a_seeded_poisson_process():
    config = BenchConfig(num_requests=2000, request_rate=50.0, seed=3)
    times = np.asarray(arrival_times(config))
    gaps = np.diff(times, prepend=0.0)
    want = np.cumsum(np.random.default_rng(3).exponential(1 / 50.0, 2000))
    np.testing.assert_allclose(times, want)
    assert (gaps > 0).all() and abs(gaps.mean() - 1 / 50.0) < 0.002  # mean gap 1 / rate
    assert arrival_times(BenchConfig(num_requests=4)) == [0.0] * 4  # inf: all at once


@pytest.mark.parametrize("rate", [0.0, -1.0, math.nan])
def test_request_rate_must_be_positive(rate):
    with pytest.raises(ValueError, match="request_rate"):
        BenchConfig(request_rate=rate)


def test_poisson_requests_start_no_earlier_than_scheduled(server, monkeypatch):
    sent: list[float] = []
    real_one = bench_serve._one

    async def recording_one(client, config, model, prompt):
        sent.append(bench_serve.time.perf_counter())
        return await real_one(client, config, model, prompt)

    monkeypatch.setattr(bench_serve, "_one", recording_one)
    config = BenchConfig(url=server.url, num_requests=6, concurrency=6, input_len=4,
                         output_len=2, request_rate=20.0, seed=1, progress=False)  # fmt: skip
    result = run_bench(config)
    assert result.num_ok == 6 and result.output_tokens == 6 * 2
    schedule = sorted(arrival_times(config))
    offsets = sorted(t - min(sent) for t in sent)
    # each request waited for its own arrival time (relative to the first one sent)
    for got, want in zip(offsets, schedule, strict=True):
        assert got >= want - schedule[0] - 0.005
    assert result.duration >= schedule[-1]


def test_cli_request_rate_and_progress_bar(server, tmp_path):
    out = tmp_path / "bench.json"
    result = runner.invoke(app, ["bench", "serve", "--url", server.url, "--num-requests", "4",
                                 "--concurrency", "2", "--input-len", "4", "--output-len", "3",
                                 "--request-rate", "40", "--json", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "request rate 40/s (Poisson)" in result.output
    assert "4/4" in result.output  # tqdm's final count (the runner mixes stderr in)
    data = json.loads(out.read_text())
    assert data["config"]["request_rate"] == 40.0
    assert data["num_ok"] == 4 and data["output_tokens"] == 4 * 3
    ttft = data["percentiles"]["ttft_ms"]
    assert 0 < ttft["p50"] <= ttft["p90"] <= ttft["p99"]


def test_cli_default_rate_is_inf_in_the_json(server, tmp_path):
    out = tmp_path / "bench.json"
    result = runner.invoke(app, ["bench", "serve", "--url", server.url, "--num-requests", "2",
                                 "--input-len", "4", "--output-len", "2", "--disable-tqdm",
                                 "--json", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "4/4" not in result.output and "requests:" not in result.output
    assert json.loads(out.read_text())["config"]["request_rate"] == "inf"
