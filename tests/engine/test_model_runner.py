"""ModelRunner: the packed batch it builds from scheduler output, and which rows get logits.

A stub model records the ForwardBatch and returns hidden states that encode (token id,
position), so each logits row says which token and position it came from."""

from __future__ import annotations

import torch
from torch import nn

from hyla.cache.manager import CacheManager
from hyla.engine.memory import CachePlan
from hyla.engine.model_runner import ModelRunner
from hyla.models.registry import config_from_hf
from hyla.request import Request, SamplingParams
from hyla.scheduler import SchedulerOutput
from tests.hf_tiny import tiny_hf_config

V = 256


class StubModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = config_from_hf(tiny_hf_config("kimi_linear").to_dict())
        self.dummy = nn.Parameter(torch.zeros(1))
        self.batches = []

    def forward(self, input_ids, positions, batch):
        self.batches.append(batch)
        return torch.stack([input_ids.float(), positions.float()], dim=-1)

    def compute_logits(self, hidden):
        code = (hidden[:, 0] * 1000 + hidden[:, 1]).long() % V  # token id, position -> argmax
        return torch.nn.functional.one_hot(code, V).float() * 40


def code(token: int, pos: int) -> int:
    return (token * 1000 + pos) % V


def test_batch_and_logit_rows():
    model = StubModel()
    runner = ModelRunner(model, CachePlan(32, 5, 4, 0, 0))
    cache = CacheManager(32, 5, 4)
    a = Request("a", list(range(10, 20)), SamplingParams(prompt_logprobs=1))
    b = Request("b", [7, 8, 9], SamplingParams())
    b.append_token(40)
    b.append_token(41)
    b.num_computed_tokens = 4
    c = Request("c", [50, 51, 52, 53, 54, 55], SamplingParams(prompt_logprobs=0))
    reqs = {"a": a, "b": b, "c": c}
    cache.allocate("b", 5)
    cache.allocate("a", 4)
    cache.allocate("c", 6)
    out = SchedulerOutput({"a": 4, "b": 1, "c": 6})
    result = runner.execute(out, reqs, cache, {"a": 0, "c": 2})
    (batch,) = model.batches
    assert batch.query_lens == [4, 1, 6] and batch.context_lens == [0, 4, 0]
    assert batch.positions.tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5]
    assert batch.state_indices.tolist() == [cache.state_slot(r) for r in "abc"]
    table_b = cache.block_table("b")
    assert batch.slot_mapping[4].item() == table_b[1] * 4 + 0  # b's token 4: block 1, offset 0
    # sampled rows: b (decode) and c (whole prompt); a is mid-prefill
    assert result.sample_ids == ["b", "c"]
    assert result.logits.argmax(-1).tolist() == [code(41, 4), code(55, 5)]
    # prompt logprobs: a rows 0..3 predict tokens 1..4; c from position 2 predicts 3..5
    entries_a, entries_c = result.prompt_logprobs["a"], result.prompt_logprobs["c"]
    assert len(entries_a) == 4 and len(entries_c) == 3
    for p, entry in enumerate(entries_a):  # top-1 (the row's hot code) + the actual next token
        assert set(entry) == {code(a.prompt_token_ids[p], p), a.prompt_token_ids[p + 1]}
        assert abs(entry[code(a.prompt_token_ids[p], p)]) < 1e-5
    for p, entry in zip(range(2, 5), entries_c, strict=True):  # top-0: the actual token only
        assert list(entry) == [c.prompt_token_ids[p + 1]]
