"""Whole mixed prefill+decode steps replayed from CUDA graphs (`mixed_cuda_graphs`, the
default) give the tokens of the same engine run eagerly with each step's tokens read before the
next (`enforce_eager=True`, `flush()` after every step: the oracle of test_cuda_graphs_gpu.py),
for a tiny Kimi-Linear (KDA + MLA + MoE) in fp32; with the reserved slot 0 and block 0 poisoned
with NaN the outputs stay finite and the same (padding reads and writes only those).

Requests arrive while others decode and prefills are chunked by a 16-token budget, so most steps
mix decodes with a prefill chunk, padded to a token bucket. Bounds (`assert_close_completion`):
logprobs of the shared top-3 candidates within 2e-3, a tail swap within 2e-3, greedy token ids
equal up to a near tie (padding changes matmul shapes, and decode rows take fla's chunk
kernels, TF32, instead of the fp32 recurrent one: on the H200 the top-3 sets differed at a
tail, with token ids equal).

    python3 -m pytest -q tests/gpu/test_mixed_graphs_gpu.py
"""

from __future__ import annotations

import pytest
import torch

from hyla.ops.kda.kernels import fla_available
from tests.engine.engine_util import assert_close_completion, make_engine, run_staggered

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(
        torch.cuda.is_available() and not fla_available(), reason="needs fla-core (and einops)"
    ),
]


def _engine(model, eager: bool):
    engine = make_engine(
        model, enforce_eager=eager, max_num_seqs=8, max_num_batched_tokens=16, device="cuda",
        enable_prefix_caching=False,
    )  # fmt: skip
    if eager:  # the oracle: eager, each step's tokens on the host before the next step
        step = engine.step
        engine.step = lambda: step() + engine.flush()
    return engine


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    from hyla.models.loader import load_model
    from tests.hf_tiny import save_tiny_hf_model

    path = tmp_path_factory.mktemp("kimi")
    save_tiny_hf_model("kimi_linear", path, seed=0)
    return load_model(str(path), dtype="float32", device="cuda", progress=False)


@pytest.mark.parametrize("poison", [False, True], ids=["clean", "nan-reserved"])
def test_mixed_graphs_match_eager(kimi, poison) -> None:
    vocab = kimi.config.vocab_size
    eager, num_mixed = run_staggered(_engine(kimi, True), vocab)
    engine = _engine(kimi, False)
    mixed = engine.runner.mixed
    assert mixed is not None
    if poison:
        for layer in engine.runner.caches:
            for t in layer.values():
                if t.is_floating_point():
                    t.view(t.shape[0], -1)[0] = float("nan")
    graphed, _ = run_staggered(engine, vocab)
    assert any(s.graph is not None for s in mixed.steps.values())
    assert num_mixed >= 2 and mixed.num_replayed_steps >= 2
    print(
        f"{num_mixed} mixed steps, {mixed.num_replayed_steps} replayed, keys {sorted(mixed.steps)}"
    )
    for rid, want in eager.items():
        assert_close_completion(graphed[rid], want, atol=2e-3)
