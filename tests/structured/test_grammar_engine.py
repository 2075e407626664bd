"""Structured output in the engine, on the embedded model: the bitmask is right bit for bit,
constrained greedy decoding equals a token-by-token reference that masks with a grammar matcher
of its own, unconstrained neighbours are untouched, and sampled outputs validate (jsonschema)."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
import torch
import xgrammar as xgr

from hyla.assets import default_model_path
from hyla.models.loader import load_model
from hyla.models.runner import SequenceRunner
from hyla.request import SamplingParams
from hyla.structured import StructuredOutputsError, StructuredOutputsParams
from hyla.structured.backend import build_grammar
from hyla.structured.bitmask import apply_token_bitmask, unpack_bitmask
from tests.engine.engine_util import make_engine, one_torch_thread, run_all

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
PROMPTS = ["def fibonacci(n):", "import os\n", "# settings", "class Point:"]


def test_unpack_bitmask_matches_bit_arithmetic():
    rng = random.Random(0)
    vocab = 77
    words = [[rng.getrandbits(32) for _ in range(3)] for _ in range(4)]
    signed = [[w - (1 << 32) if w >= 1 << 31 else w for w in row] for row in words]
    got = unpack_bitmask(torch.tensor(signed, dtype=torch.int32), vocab)
    want = [[bool(row[t // 32] >> (t % 32) & 1) for t in range(vocab)] for row in words]
    assert got.tolist() == want
    logits = torch.randn(6, vocab)
    masked = apply_token_bitmask(logits, torch.tensor(signed, dtype=torch.int32),
                                 torch.tensor([5, 0, 2, 3]))
    for j, i in enumerate([5, 0, 2, 3]):
        for t in range(vocab):
            expect = logits[i, t].item() if want[j][t] else float("-inf")
            assert masked[i, t].item() == expect
    assert torch.equal(masked[[1, 4]], logits[[1, 4]])


@pytest.fixture(scope="module")
def model():
    return load_model(default_model_path(), dtype="float32", progress=False)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_path())


def _reference(model, tokenizer, prompt_ids: list[int], max_tokens: int,
               schema: dict | None) -> list[int]:
    """Greedy token by token on the whole model (no engine), masked by a fresh matcher."""
    matcher = None
    if schema is not None:
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=model.config.vocab_size,
                                                  stop_token_ids=[0])
        compiled = xgr.GrammarCompiler(info).compile_grammar(
            build_grammar(StructuredOutputsParams(json=schema)))
        matcher = xgr.GrammarMatcher(compiled)
    runner = SequenceRunner(model, 1, len(prompt_ids) + max_tokens + 1)
    logits = runner.step({0: prompt_ids})[0]
    out: list[int] = []
    for _ in range(max_tokens):
        if matcher is not None:
            bitmask = xgr.allocate_token_bitmask(1, model.config.vocab_size)
            matcher.fill_next_token_bitmask(bitmask, 0)
            allowed = unpack_bitmask(bitmask, logits.shape[0])[0]
            logits = logits.masked_fill(~allowed, float("-inf"))
        out.append(int(logits.argmax()))
        if out[-1] == 0:
            break
        if matcher is not None:
            assert matcher.accept_token(out[-1])
        logits = runner.step({0: out[-1:]})[0]
    return out


def test_constrained_greedy_equals_reference_in_a_mixed_batch(model, tokenizer):
    engine = make_engine(model, default_model_path())
    so = StructuredOutputsParams(json=SCHEMA)
    cases = [(p, i % 2 == 0) for i, p in enumerate(PROMPTS)]
    with one_torch_thread():
        for i, (prompt, constrained) in enumerate(cases):
            params = SamplingParams(temperature=0, max_tokens=40,
                                    structured_outputs=so if constrained else None)
            engine.add_request(f"r{i}", prompt, params)
        outs = run_all(engine)
        for i, (prompt, constrained) in enumerate(cases):
            ids = tokenizer(prompt)["input_ids"]
            want = _reference(model, tokenizer, ids, 40, SCHEMA if constrained else None)
            got = outs[f"r{i}"].outputs[0].token_ids
            assert got == want, (prompt, constrained)
            if constrained:
                jsonschema.validate(json.loads(outs[f"r{i}"].outputs[0].text), SCHEMA)


def test_sampled_outputs_are_valid(model):
    engine = make_engine(model, default_model_path())
    so = StructuredOutputsParams(json=SCHEMA)
    with one_torch_thread():
        for i, prompt in enumerate(PROMPTS):
            engine.add_request(f"s{i}", prompt, SamplingParams(
                temperature=1.0, seed=i, n=2, max_tokens=64, structured_outputs=so))
        outs = run_all(engine)
    for out in outs.values():
        for c in out.outputs:
            assert c.finish_reason == "stop", c.text
            jsonschema.validate(json.loads(c.text), SCHEMA)


@pytest.mark.parametrize("params", [
    dict(json={"type": "objectx"}),
    dict(json={"type": "object", "properties": 3}),
    dict(regex="(ab"),
], ids=["unknown-type", "bad-properties", "bad-regex"])
def test_invalid_constraint_is_refused_naming_the_field(model, params):
    engine = make_engine(model, default_model_path())
    so = StructuredOutputsParams(field="response_format.json_schema.schema", **params)
    with pytest.raises(StructuredOutputsError) as e:
        engine.add_request("bad", "x", SamplingParams(structured_outputs=so))
    assert e.value.field == "response_format.json_schema.schema"
    assert not engine.has_unfinished_requests()
    assert engine.cache.num_free_slots == engine.cache_plan.num_usable_slots


def test_params_need_exactly_one_constraint():
    with pytest.raises(StructuredOutputsError):
        StructuredOutputsParams()
    with pytest.raises(StructuredOutputsError):
        StructuredOutputsParams(json={}, regex="a")
