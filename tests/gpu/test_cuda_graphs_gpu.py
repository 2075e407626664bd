"""CUDA-graph decode on a GPU: the engine as it runs by default on CUDA (captured decode steps in
the overlapped pipeline: each step's tokens feed the next step on the device) gives the tokens
of the same engine run eagerly with each step's tokens read before the next step
(`enforce_eager=True`, `flush()` after every step), for tiny Kimi-Linear (KDA +
MLA + MoE), DeepSeek-V3.2 (DSA with top-k 16, so long rows take the indexer) and Qwen3-Next
(GDN + gated GQA + MoE) models in fp32.

Batches of 3 and 6 sequences are padded to the buckets 4 and 8; requests finish at different
steps, so the batch shrinks and changes bucket mid-run. Bounds: identical greedy token ids;
top-5 logprobs within 2e-3 (the padded batch changes matmul shapes, hence cuBLAS's reduction
order, and the chunk kernels run TF32).
"""

from __future__ import annotations

import pytest
import torch

from hyla.ops.kda.kernels import fla_available
from hyla.request import SamplingParams
from tests.engine.engine_util import assert_same_completion, make_engine, prompt_ids, run_all

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(
        torch.cuda.is_available() and not fla_available(), reason="needs fla-core (and einops)"
    ),
]


def _run(model, eager: bool, prompts: list[list[int]]):
    engine = make_engine(model, enforce_eager=eager, max_num_seqs=8, device="cuda")
    for i, p in enumerate(prompts):
        params = SamplingParams(temperature=0, max_tokens=6 + 3 * i, ignore_eos=True, logprobs=5)
        engine.add_request(str(i), p, params)
    if eager:  # the oracle: eager, each step's tokens on the host before the next step
        step = engine.step
        engine.step = lambda: step() + engine.flush()
    return run_all(engine), engine


@pytest.mark.parametrize("family", ["kimi_linear", "deepseek_v32", "qwen3_next"])
@pytest.mark.parametrize("num_seqs", [3, 6])
def test_graph_decode_matches_eager(tmp_path, family, num_seqs) -> None:
    from hyla.models.loader import load_model
    from tests.hf_tiny import save_tiny_hf_model

    save_tiny_hf_model(family, tmp_path, seed=0)
    model = load_model(str(tmp_path), dtype="float32", device="cuda", progress=False)
    prompts = [prompt_ids(5 + 11 * i, seed=i) for i in range(num_seqs)]
    eager, _ = _run(model, True, prompts)
    graphed, engine = _run(model, False, prompts)
    graphs = engine.runner.graphs
    assert graphs is not None and any(s.graph is not None for s in graphs.steps.values())
    assert engine.num_device_token_steps > 0
    print(f"{family} x{num_seqs}: captured {sorted(graphs.steps)}")
    for rid in eager:
        assert_same_completion(eager[rid], graphed[rid], atol=2e-3)
