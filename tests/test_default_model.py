"""The embedded default model (hyla/assets/default_model, docs/model_card.md), on the CPU.

It loads through the normal loader, decodes deterministically, and predicts held-out standard
library code (modules it never saw: `hyla.training.stdlib_data.split_of`) far better than the
same architecture with random weights.
"""

from __future__ import annotations

import math
import random
import time

import pytest
import torch
from tokenizers import Tokenizer

from hyla.assets import default_model_path
from hyla.models.loader import load_model
from hyla.models.runner import SequenceRunner
from hyla.training.corpus import RetrievalDocs
from hyla.training.metrics import bits_per_byte, token_byte_lengths
from hyla.training.recipe import MAX_CHECKPOINT_BYTES, build_model
from hyla.training.stdlib_data import split_of, stdlib_root

# The first 512 tokens of `unittest/suite.py` (held out): measured 0.83 bits/byte for the shipped
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
    # no <|endoftext|> in front: a prompt continues the code stream (docs/model_card.md)
    assert tok.bos_token_id == tok.eos_token_id not in ids
    assert tok.decode(ids) == "def fibonacci(n):"
    text = tok.apply_chat_template(
        [{"role": "user", "content": "add two numbers"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "# add two numbers\n"


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


# Short retrieval prompts in the evaluation's format (`RetrievalDocs.eval_prompt`): a constant
# on the first line, ~RETRIEVAL_BODY_TOKENS tokens of held-out stdlib code, then `assert NAME ==`.
# Names and values are drawn from a seeded generator, not picked. The shipped model answers
# 10/10 of these exactly on the CPU (fp32); the previous checkpoint, which never learned to copy,
# answered 0/10 (a 5-digit value is 1 in 10^5 to guess). The bound asks for a majority.
RETRIEVAL_MODULES = ("secrets", "tty", "plistlib", "unittest.suite", "multiprocessing.process")
RETRIEVAL_CASES, RETRIEVAL_BODY_TOKENS, RETRIEVAL_MIN_CORRECT = 10, 200, 6


def _retrieval_cases(tokenizer) -> list[tuple[list[int], list[int]]]:
    rng = random.Random(0)
    cases = []
    for i in range(RETRIEVAL_CASES):
        module = RETRIEVAL_MODULES[i % len(RETRIEVAL_MODULES)]
        assert split_of(module) == "heldout"
        path = stdlib_root() / (module.replace(".", "/") + ".py")
        if not path.is_file():
            pytest.skip(f"no {path} in this Python")
        code = tokenizer.encode(path.read_text(), add_special_tokens=False).ids
        offset = rng.randrange(0, max(1, len(code) - RETRIEVAL_BODY_TOKENS))
        name, value = RetrievalDocs.random_pair(rng)
        head = tokenizer.encode(f"{name} = {value}\n\n").ids
        tail = tokenizer.encode(f"\nassert {name} ==", add_special_tokens=False).ids
        prompt = head + code[offset : offset + RETRIEVAL_BODY_TOKENS] + tail
        cases.append((prompt, tokenizer.encode(f" {value}", add_special_tokens=False).ids))
    return cases


def test_short_retrieval_prompts(model, tokenizer):
    correct = 0
    for prompt, answer in _retrieval_cases(tokenizer):
        out = _greedy(model, prompt, len(answer) + 1)
        correct += out[: len(answer)] == answer and not tokenizer.decode(out[-1:])[:1].isdigit()
    assert correct >= RETRIEVAL_MIN_CORRECT, f"{correct}/{RETRIEVAL_CASES} answered"
