"""Structured output on CUDA: the bitmask applied on the device equals the CPU result bit for
bit, and through the overlapped pipeline (device tokens, deferred constrained sampling) every
constrained answer of a mixed batch validates against its schema (jsonschema)."""

from __future__ import annotations

import json

import pytest
import torch

from hyla.assets import default_model_path
from hyla.models.loader import load_model
from hyla.request import SamplingParams
from hyla.structured import StructuredOutputsParams
from hyla.structured.bitmask import apply_token_bitmask
from tests.engine.engine_util import make_engine, run_all

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
# a bounded integer: the trained embedded model, sampled at temperature 1, writes unbounded
# digits past max_tokens for 4 of the 8 seeds (CPU and H200 alike)
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 999},
                                           "s": {"type": "string", "maxLength": 6}},
          "required": ["n", "s"], "additionalProperties": False}


def test_device_bitmask_equals_cpu():
    gen = torch.Generator().manual_seed(0)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (5, 9), dtype=torch.int32, generator=gen)
    logits = torch.randn(7, 270, generator=gen)
    rows = torch.tensor([6, 0, 3, 2, 5])
    want = apply_token_bitmask(logits, bitmask, rows)
    got = apply_token_bitmask(logits.cuda(), bitmask.cuda(), rows.cuda())
    assert torch.equal(got.cpu(), want)


def test_cuda_pipeline_constrained_rows_are_valid():
    import jsonschema

    model = load_model(default_model_path(), dtype="float32", device="cuda", progress=False)
    engine = make_engine(model, default_model_path())
    so = StructuredOutputsParams(json=SCHEMA)
    for i, prompt in enumerate(["def f(x):", "import os\n", "# a record", "class A:"] * 4):
        engine.add_request(f"r{i}", prompt, SamplingParams(
            temperature=1.0, seed=i, max_tokens=48, structured_outputs=so if i % 2 else None))
    outs = run_all(engine)
    assert engine.num_device_token_steps > 0  # the overlapped pipeline ran
    for i in range(1, 16, 2):
        c = outs[f"r{i}"].outputs[0]
        assert c.finish_reason == "stop", c.text
        jsonschema.validate(json.loads(c.text), SCHEMA)
