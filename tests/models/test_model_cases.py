"""Reference cases C01 and C02 (../shared/cases/README.md) on whole models, per family.

Each family's tiny random-weight checkpoint (tests/hf_tiny.py: 3 linear + 1 attention layer, or
4 DSA layers with `index_topk = 16`, so prompts longer than 16 run the sparse path) is loaded with
`load_model` and driven through `SequenceRunner` (shuffled blocks and slots, NaN-poisoned caches).

Oracles: a one-shot prefill of the same tokens (split invariance), and the same model fed one
token per step (every layer on its decode path: recurrent delta rule, conv update, absorbed MLA,
decode-time top-k). "Equal" is max abs logit error <= 1e-5 in fp32 and the same greedy token.
"""

from __future__ import annotations

import pytest
import torch

from hyla.layers.sparse_attention import DSAttention
from hyla.models.loader import load_model
from hyla.models.runner import SequenceRunner
from tests.hf_tiny import FAMILIES, save_tiny_hf_model

ATOL = 1e-5
STATE_ATOL = 1e-5
C02_MAX_T = 130
C01_LEN = 1000
C01_CHUNKS = (1, 2, 3, 16, 63, 64, 65, 999, 1000, 1001)
STATE_NAMES = ("recurrent_state", "conv_state")


@pytest.fixture(scope="module", params=FAMILIES)
def model(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"cases_{request.param}")
    save_tiny_hf_model(request.param, path, seed=0)
    return load_model(path, dtype="float32", progress=False)


@pytest.fixture
def sparse_calls(monkeypatch) -> list[int]:
    """Counts DSA sparse-path calls, so the DSA family provably exercises top-k selection."""
    calls: list[int] = []
    original = DSAttention.attend_sparse

    def counted(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(DSAttention, "attend_sparse", counted)
    return calls


def _tokens(n: int, vocab: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=gen).tolist()


def _linear_states(runner: SequenceRunner, seq_id: int) -> dict[tuple[int, str], torch.Tensor]:
    """Copies of sequence `seq_id`'s recurrent and conv states, per linear layer."""
    slot = runner.state_slots[seq_id]
    return {
        (i, name): layer[name][slot].clone()
        for i, layer in enumerate(runner.caches)
        for name in STATE_NAMES
        if name in layer
    }


def _max_state_error(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(((a[k] - b[k]).abs().max().item() for k in a), default=0.0)


def _check_logits(got: torch.Tensor, ref: torch.Tensor, what: str) -> float:
    assert torch.isfinite(got).all(), f"{what}: non-finite logits"
    err = (got - ref).abs().max().item()
    assert err <= ATOL, f"{what}: max abs logit error {err:.3e}"
    assert torch.equal(got.argmax(-1), ref.argmax(-1)), f"{what}: greedy token differs"
    return err


def test_c02_prefill_then_one_decode_equals_full_forward(model, sparse_calls) -> None:
    """For T in 1..130: full forward over x[:T] == prefill(x[:T-1]) + decode(x[T-1]) == x fed
    token by token, in logits (last position) and in every linear layer's final state."""
    family = model.config.architecture
    x = _tokens(C02_MAX_T, model.config.vocab_size, seed=2)
    lengths = range(1, C02_MAX_T + 1)

    full = SequenceRunner(model, C02_MAX_T, C02_MAX_T, seed=0)  # seq T-1 holds x[:T]
    full_logits = full.step({T - 1: x[:T] for T in lengths})

    split = SequenceRunner(model, C02_MAX_T, C02_MAX_T, seed=1)
    split.step({T - 1: x[: T - 1] for T in lengths if T > 1})
    split_logits = split.step({T - 1: [x[T - 1]] for T in lengths})

    oracle = SequenceRunner(model, 1, C02_MAX_T, seed=2)
    logit_err = state_err = 0.0
    for T in lengths:
        step_logits = oracle.step({0: [x[T - 1]]})[0]
        what = f"{family} T={T}"
        logit_err = max(logit_err, _check_logits(split_logits[T - 1], full_logits[T - 1], what))
        logit_err = max(logit_err, _check_logits(full_logits[T - 1], step_logits, what))
        want = _linear_states(oracle, 0)
        for runner in (full, split):
            err = _max_state_error(_linear_states(runner, T - 1), want)
            assert err <= STATE_ATOL, f"{what}: linear state error {err:.3e}"
            state_err = max(state_err, err)
    if family == "deepseek_v32":
        assert model.config.dsa.index_topk < C02_MAX_T and sparse_calls
    else:
        assert len(want) == 2 * len(model.config.layer_ids("kda", "gdn"))
    print(f"C02 {family}: max logit error {logit_err:.2e}, max state error {state_err:.2e}")


def test_c01_chunked_prefill_equals_one_shot(model, sparse_calls) -> None:
    """A 1000-token prompt prefilled at once vs in chunks of 1, 2, 3, 16, 63, 64, 65, 999, 1000
    and 1001 tokens (all sizes in one packed runner, stepping together): the logits of every
    position, the next token and the final linear states agree."""
    family = model.config.architecture
    x = _tokens(C01_LEN, model.config.vocab_size, seed=3)
    one_shot = SequenceRunner(model, 1, C01_LEN, seed=0)
    ref = one_shot.step({0: x}, all_logits=True)[0]  # [1000, V]
    ref_state = _linear_states(one_shot, 0)

    runner = SequenceRunner(model, len(C01_CHUNKS), C01_LEN, seed=5)
    done = [0] * len(C01_CHUNKS)
    pieces: list[list[torch.Tensor]] = [[] for _ in C01_CHUNKS]
    while min(done) < C01_LEN:
        chunks = {
            i: x[done[i] : done[i] + size] for i, size in enumerate(C01_CHUNKS) if done[i] < C01_LEN
        }
        for i, logits in runner.step(chunks, all_logits=True).items():
            pieces[i].append(logits)
            done[i] += len(chunks[i])
    worst = 0.0
    for i, size in enumerate(C01_CHUNKS):
        what = f"{family} chunk={size}"
        worst = max(worst, _check_logits(torch.cat(pieces[i]), ref, what))
        err = _max_state_error(_linear_states(runner, i), ref_state)
        assert err <= STATE_ATOL, f"{what}: final linear state error {err:.3e}"
    if family == "deepseek_v32":
        assert sparse_calls
    print(f"C01 {family}: max logit error {worst:.2e} over all positions and chunk sizes")
