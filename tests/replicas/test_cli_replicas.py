"""`hyla serve --data-parallel-size N` hands the server a replica client (no Ray here: the
replica start is replaced; tests/replicas/test_replicas_ray.py runs the real one)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

import hyla.replicas
import hyla.server.launch
from hyla.cli import app
from hyla.replicas.client import CacheInfo, EngineInfo


def _serve(*args: str):
    return CliRunner().invoke(app, ["serve", "--port", "0", *args])


def test_serve_with_replicas_gets_the_replica_client(monkeypatch):
    calls, served = [], []
    fake = SimpleNamespace(
        model_name="default", max_model_len=2048, tokenizer=None, is_draining=False,
        engine=EngineInfo(None, SimpleNamespace(vocab_size=10), CacheInfo(16, True), None),
        replicas=SimpleNamespace(info={"device": "cpu"}),
    )  # fmt: skip

    def start(model, options, n, address):
        calls.append((model, options.get("max_model_len"), n, address))
        return fake

    monkeypatch.setattr(hyla.replicas, "serve_replicas", start)
    monkeypatch.setattr(hyla.server.launch, "run_until_signal", lambda s, sockets: served.append(s))
    result = _serve("--data-parallel-size", "2", "--ray-address", "auto", "--max-model-len",
                    "2048")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert calls == [(None, 2048, 2, "auto")]
    assert served[0].async_engine is fake
    assert "2 replicas on Ray" in result.output


@pytest.mark.parametrize("error,expected", [
    (ImportError("No module named 'ray'"), "pip install 'hyla[replicas]'"),
    (RuntimeError("Traceback ...\nConfigError: kv_cache_memory: too small"),
     "did not start: ConfigError: kv_cache_memory: too small"),
])  # fmt: skip
def test_a_replica_start_failure_exits_2_naming_the_cause(monkeypatch, error, expected):
    def start(*args):
        raise error

    monkeypatch.setattr(hyla.replicas, "serve_replicas", start)
    result = _serve("--data-parallel-size", "2")
    assert result.exit_code == 2
    assert expected in result.output
