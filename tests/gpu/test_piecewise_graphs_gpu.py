"""Piecewise CUDA graphs of mixed prefill+decode steps (`piecewise_cuda_graphs=True`: norms and
MLP/MoE replayed per token bucket, mixers eager) give the tokens of the same engine run eagerly
with each step's tokens read before the next (`enforce_eager=True`, `flush()` after every step:
the oracle of test_cuda_graphs_gpu.py), for tiny Kimi-Linear (KDA + MLA + MoE), Qwen3-Next
(GDN + gated GQA + MoE) and DeepSeek-V3.2 (DSA + MoE) models in fp32.

Requests arrive while others decode and prefills are chunked by a 16-token budget, so most steps
mix decodes with a prefill chunk and are padded to a token bucket (16). Bounds: identical greedy
token ids; top-3 logprobs within 2e-3 (padding changes matmul shapes, hence cuBLAS's reduction
order, and the chunk kernels run TF32).

    python3 -m pytest -q tests/gpu/test_piecewise_graphs_gpu.py
"""

from __future__ import annotations

import pytest
import torch

from hyla.ops.kda.kernels import fla_available
from tests.engine.engine_util import assert_same_completion, make_engine, run_staggered

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(
        torch.cuda.is_available() and not fla_available(), reason="needs fla-core (and einops)"
    ),
]


def _engine(model, eager: bool):
    engine = make_engine(
        model, enforce_eager=eager, piecewise_cuda_graphs=not eager, mixed_cuda_graphs=False,
        max_num_seqs=8,
        max_num_batched_tokens=16, device="cuda",
    )  # fmt: skip
    if eager:  # the oracle: eager, each step's tokens on the host before the next step
        step = engine.step
        engine.step = lambda: step() + engine.flush()
    return engine


@pytest.mark.parametrize("family", ["kimi_linear", "qwen3_next", "deepseek_v32"])
def test_piecewise_mixed_steps_match_eager(tmp_path, family) -> None:
    from hyla.models.loader import load_model
    from tests.hf_tiny import save_tiny_hf_model

    save_tiny_hf_model(family, tmp_path, seed=0)
    model = load_model(str(tmp_path), dtype="float32", device="cuda", progress=False)
    vocab = model.config.vocab_size
    eager, num_mixed = run_staggered(_engine(model, True), vocab)
    engine = _engine(model, False)
    graphed, _ = run_staggered(engine, vocab)
    pieces = engine.runner.piecewise
    assert pieces is not None and any(b.graphs for b in pieces.steps.values())
    assert num_mixed >= 2 and pieces.num_replayed_steps >= 2
    print(f"{family}: {num_mixed} mixed steps, {pieces.num_replayed_steps} replayed, "
          f"buckets {sorted(pieces.steps)}")  # fmt: skip
    for rid, want in eager.items():
        assert_same_completion(graphed[rid], want, atol=2e-3)
