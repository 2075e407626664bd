"""`hyla validate` on GLM-5.3-Flash (`glm5_next`) and with `hyla serve`'s engine options.

Oracles: transformers' own `Glm5NextForConditionalGeneration` (the class the checkpoint's
`architectures` names; AutoModelForCausalLM has no mapping for its config) for the precision
check, and `hyla serve`'s own command line (its parsed options) for the options validate takes
and hands to the server it starts.
"""

from __future__ import annotations

import json

import typer
from typer.testing import CliRunner

from hyla.cli import app
from hyla.validate.service import serve_args
from tests.glm_tiny import save_tiny_glm


def _command(name: str):
    return typer.main.get_command(app).commands[name]


def test_glm5_next_with_a_1m_context_validates_under_max_model_len(tmp_path):
    """transformers' default 1M-token context: without --max-model-len the cache budget cannot
    hold one sequence; with it every engine-side check runs, and the precision check compares
    against transformers' model of that architecture."""
    model = tmp_path / "glm"
    save_tiny_glm(model, seed=0, max_position_embeddings=1 << 20)
    out = tmp_path / "report"
    result = CliRunner().invoke(app, [
        "validate", str(model), "--quick", "--device", "cpu", "--out", str(out),
        "--checks", "precision,long_context,throughput", "--max-model-len", "256",
        "--kv-cache-memory", str(64 << 20)])  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    precision = summary["checks"]["precision"]
    assert precision["status"] == "pass", precision["failures"]
    assert precision["reason"].startswith("reference: transformers")
    assert all(c["status"] == "pass" for c in summary["checks"].values()), summary["checks"]


def test_validate_takes_every_engine_option_serve_takes():
    serve = {p.name for p in _command("serve").params}
    validate = {p.name for p in _command("validate").params}
    own_serve = {"model", "host", "port", "api_key", "served_model_name", "max_request_bytes",
                 "drain_timeout", "log_level", "disable_uvicorn_access_log",
                 "header_timeout", "body_timeout", "timeout_keep_alive", "max_connections",
                 "chat_template", "data_parallel_size", "ray_address",
                 "engine_core_process"}  # fmt: skip
    missing = serve - own_serve - validate
    assert not missing, missing
    wanted = {"max_model_len", "kv_cache_memory", "tensor_parallel_size", "kv_cache_dtype"}
    assert wanted <= validate


def test_engine_options_reach_the_started_server_as_serve_parses_them():
    options = {"max_model_len": 256, "enable_prefix_caching": False, "kv_cache_dtype": "fp8",
               "tensor_parallel_size": 2, "request_timeout": 5.0}  # fmt: skip
    ctx = _command("serve").make_context("serve", ["MODEL", *serve_args(options)])
    assert {k: ctx.params[k] for k in options} == options
