"""The distributed path with one rank on the GPU (`distributed_executor_backend="mp"`,
`tensor_parallel_size=1`: the executor, the per-step plan, the driver runner, CUDA graphs)
against the plain in-process engine on the same checkpoint, in the same test.

Oracle: the plain engine (`LocalExecutor`) through the same scripted scenario
(`tests.distributed.tp_util.run_scenario`: chunked prefill beside decodes, an abort, a
prefix-cache hit, 32 greedy tokens per request): identical tokens, the same sampled-row logits
(the same kernels on the same weights: within 1e-5), every block and slot free afterwards, and
decode CUDA graphs captured on both.
"""

from __future__ import annotations

import pytest
import torch

from tests.distributed.tp_util import engine, run_scenario
from tests.hf_tiny import save_tiny_hf_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
FAMILIES = ["kimi_linear", "deepseek_v32", "qwen3_next"]


@pytest.mark.parametrize("family", FAMILIES)
def test_world_size_one_through_the_executor(tmp_path, family):
    save_tiny_hf_model(family, tmp_path)
    # the executor's runner has no mixed-step graphs yet: compare eager mixed steps on both
    options = dict(device="cuda", mixed_cuda_graphs=False, prefix_checkpoint_policy="all")
    plain = engine(tmp_path, **options)
    ref = run_scenario(plain)
    graphs = plain.runner.graphs is not None
    del plain
    via = engine(tmp_path, **options, distributed_executor_backend="mp")
    try:
        assert via.executor is not None and (via.runner.graphs is not None) == graphs
        got = run_scenario(via)
    finally:
        via.shutdown()
    assert got.tokens == ref.tokens
    assert got.prefix_hit_tokens == ref.prefix_hit_tokens > 0
    assert len(got.logits) == len(ref.logits)
    diff = max((a - b).abs().max().item() for a, b in zip(ref.logits, got.logits, strict=True))
    assert diff <= 1e-5, diff
