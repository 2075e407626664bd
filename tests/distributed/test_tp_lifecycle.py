"""Tensor-parallel engines made, shut down and made again in one process (gloo).

Oracle: the single-process engine's greedy tokens on the same checkpoint and prompt. Each TP
engine after the first would once fail with `ValueError: trying to initialize the default
process group twice!`.
"""

from __future__ import annotations

import gc

import pytest

from hyla.config import ConfigError
from hyla.engine.llm import LLM
from hyla.request import SamplingParams
from tests.hf_tiny import save_tiny_hf_model

OPTIONS = dict(device="cpu", dtype="float32", max_model_len=128)
PARAMS = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
PROMPT = [[5, 6, 7, 8, 9]]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("tp_lifecycle")
    save_tiny_hf_model("kimi_linear", path)
    return str(path)


def _tokens(llm: LLM) -> list[int]:
    return list(llm.generate(PROMPT, PARAMS)[0].outputs[0].token_ids)


def test_tp_engines_made_shut_down_and_made_again(checkpoint):
    want = _tokens(LLM(checkpoint, **OPTIONS))
    first = LLM(checkpoint, tensor_parallel_size=2, **OPTIONS)
    assert _tokens(first) == want
    with pytest.raises(ConfigError, match="shutdown"):  # the first still holds the group
        LLM(checkpoint, tensor_parallel_size=2, **OPTIONS)
    first.shutdown()
    with LLM(checkpoint, tensor_parallel_size=2, enable_expert_parallel=True, **OPTIONS) as llm:
        assert _tokens(llm) == want
    dropped = LLM(checkpoint, tensor_parallel_size=2, **OPTIONS)
    assert _tokens(dropped) == want
    del dropped  # never shut down: collected when the next one starts
    gc.collect()
    last = LLM(checkpoint, tensor_parallel_size=2, **OPTIONS)
    try:
        assert _tokens(last) == want
    finally:
        last.shutdown()
