"""The embedded default model (hyla/assets/default_model, docs/model_card.md), on the CPU.

It loads through the normal loader, decodes deterministically, and predicts held-out standard
library code (modules it never saw: `hyla.training.stdlib_data.split_of`) far better than the
same architecture with random weights.
"""

from __future__ import annotations

import math
import time

import pytest
import torch
from tokenizers import Tokenizer

from hyla.assets import default_model_path
from hyla.models.loader import load_model
from hyla.models.runner import SequenceRunner
from hyla.training.metrics import bits_per_byte, token_byte_lengths
from hyla.training.recipe import MAX_CHECKPOINT_BYTES, build_model
from hyla.training.stdlib_data import split_of, stdlib_root

# The first 512 tokens of `unittest/suite.py` (held out): measured 0.84 bits/byte for the shipped
# model (CPython 3.11 source, fp32, SequenceRunner) and 2.94 for random weights of the same
# architecture. The bound leaves room for other Python versions' copies of the file.
HELDOUT_MODULE = "unittest.suite"
HELDOUT_TOKENS = 512
BPB_BOUND = 1.3


@pytest.fixture(scope="module")
def model():
    return load_model(default_model_path(), dtype="float32", progress=False)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(default_model_path() / "tokenizer.json"))


def test_package_files_and_load_time():
    path = default_model_path()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (path / name).is_file(), name
    assert (path / "model.safetensors").stat().st_size <= MAX_CHECKPOINT_BYTES
    load_model(path, progress=False)  # warm the imports and the file cache
    start = time.perf_counter()
    model = load_model(path, progress=False)
    assert time.perf_counter() - start < 2.0
    config = model.config
    assert config.layer_pattern == ("kda", "kda", "dsa", "kda") * 2
    assert config.ffn_pattern == ("dense",) + ("moe",) * 7
    assert next(model.parameters()).dtype == torch.bfloat16


def test_hf_tokenizer_and_chat_template():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_path(), local_files_only=True)
    ids = tok("def fibonacci(n):")["input_ids"]
    assert ids[0] == tok.bos_token_id == tok.eos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == "def fibonacci(n):"
    text = tok.apply_chat_template(
        [{"role": "user", "content": "add two numbers"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|endoftext|># add two numbers\n"


def _greedy(model, ids: list[int], num_new: int) -> list[int]:
    runner = SequenceRunner(model, 1, len(ids) + num_new + 1)
    logits = runner.step({0: ids})[0]
    out: list[int] = []
    for _ in range(num_new):
        out.append(int(logits.argmax()))
        logits = runner.step({0: out[-1:]})[0]
    return out


def test_greedy_is_deterministic(model, tokenizer):
    ids = tokenizer.encode("def fibonacci(n):").ids
    first, second = _greedy(model, ids, 16), _greedy(model, ids, 16)
    assert first == second
    assert all(0 <= t < model.config.vocab_size for t in first)
    assert tokenizer.decode(first).strip()


def _heldout_bpb(model, tokenizer) -> float:
    path = stdlib_root() / (HELDOUT_MODULE.replace(".", "/") + ".py")
    if not path.is_file():
        pytest.skip(f"no {path} in this Python")
    ids = tokenizer.encode(path.read_text()).ids[: HELDOUT_TOKENS + 1]
    runner = SequenceRunner(model, 1, len(ids))
    logits = runner.step({0: ids[:-1]}, all_logits=True)[0]
    lengths = token_byte_lengths(default_model_path() / "tokenizer.json")
    bits, nbytes = bits_per_byte(logits, torch.tensor(ids[1:]), lengths)
    return bits / nbytes


def test_heldout_bits_per_byte_under_bound(model, tokenizer):
    assert split_of(HELDOUT_MODULE) == "heldout"
    trained = _heldout_bpb(model, tokenizer)
    assert math.isfinite(trained) and trained < BPB_BOUND
    random_model = build_model(model.config, seed=0).eval()
    assert _heldout_bpb(random_model, tokenizer) > BPB_BOUND + 1.0


@pytest.mark.xfail(
    strict=True,
    reason="the shipped model has not learned key-value retrieval yet (docs/model_card.md)",
)
def test_short_retrieval_prompt(model, tokenizer):
    prompt = "SECRET_KEY_17 = 48213\n\ndef check():\n    return True\n\nassert SECRET_KEY_17 =="
    answer = tokenizer.encode(" 48213", add_special_tokens=False).ids
    out = _greedy(model, tokenizer.encode(prompt).ids, len(answer))
    assert out == answer
