"""The tiny GLM-5.3-Flash (`tests.glm_tiny`) on CUDA through the GPU paths (fla KDA, Triton
sparse MLA with the safe selection, Triton norms; the pooled indexer, hyper-connections and the
clamped experts run as PyTorch on the device) against the same model on the CPU reference
paths, fp32. Bounds: prefill logits within 2e-3 (fla's chunk kernels run TF32); greedy token ids
identical over 24 decode steps up to a near tie of the CPU's logits; the engine's CUDA defaults
(CUDA graphs where the layers allow them) give its eager tokens; the vision tower's rows within
1e-3 of the CPU's, relative (TF32)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from hyla.models.loader import load_model
from hyla.models.runner import SequenceRunner
from hyla.ops.kda.kernels import fla_available
from hyla.request import SamplingParams
from tests.engine.engine_util import make_engine, prompt_ids, run_all
from tests.glm_tiny import save_tiny_glm

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(
        torch.cuda.is_available() and not fla_available(), reason="needs fla-core (and einops)"
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("transformers.models.glm5_next") is None,
        reason="needs transformers >= 5.24 (Glm5NextConfig) to build the tiny checkpoint",
    ),
]
PROMPT_LENS = (1, 5, 19, 70)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("glm5_next_gpu")
    save_tiny_glm(path, seed=0)
    return path


@pytest.fixture(scope="module")
def models(checkpoint):
    return load_model(checkpoint, dtype="float32"), load_model(checkpoint, dtype="float32").cuda()


def _greedy(model, prompts, steps):
    """(prefill logits per prompt, greedy ids per prompt, top-2 logit gap of each step)."""
    runner = SequenceRunner(model, len(prompts), 128, block_size=16)
    logits = runner.step(dict(enumerate(prompts)), all_logits=True)
    first = {i: v.cpu() for i, v in logits.items()}
    last = {i: v[-1] for i, v in logits.items()}
    outs: dict[int, list[int]] = {i: [] for i in logits}
    gaps: dict[int, list[float]] = {i: [] for i in logits}
    for step in range(steps):
        for i, v in last.items():
            top = v.float().topk(2).values
            outs[i].append(int(v.argmax()))
            gaps[i].append(float(top[0] - top[1]))
        if step + 1 < steps:
            last = runner.step({i: [o[-1]] for i, o in outs.items()})
    return first, outs, gaps


@torch.no_grad()
def test_cuda_matches_cpu_prefill_and_greedy(models):
    """Greedy ids equal up to the first step where the CPU's top two logits are within 1e-2
    (there TF32 rounding may pick the other one, and the sequences may part)."""
    cpu, gpu = models
    prompts = [prompt_ids(n, seed=n) for n in PROMPT_LENS]
    ref_logits, ref_ids, gaps = _greedy(cpu, prompts, 24)
    got_logits, got_ids, _ = _greedy(gpu, prompts, 24)
    for i in ref_logits:
        err = (got_logits[i] - ref_logits[i]).abs().max().item()
        assert err <= 2e-3, (PROMPT_LENS[i], err)
        near_tie = next((k for k, g in enumerate(gaps[i]) if g < 1e-2), len(gaps[i]))
        assert got_ids[i][: near_tie + 1] == ref_ids[i][: near_tie + 1], PROMPT_LENS[i]


def test_engine_defaults_match_eager_engine(models):
    """CUDA defaults (captured decode steps where the layers allow) give the tokens of the same
    engine run eagerly."""
    _, gpu = models
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = {str(n): prompt_ids(n, seed=50 + n) for n in PROMPT_LENS}
    outs = []
    for opts in ({}, {"enforce_eager": True}):
        engine = make_engine(gpu, device="cuda", max_num_batched_tokens=32, **opts)
        for rid, ids in prompts.items():
            engine.add_request(rid, ids, params)
        outs.append({r: o.outputs[0].token_ids for r, o in run_all(engine).items()})
    assert outs[0] == outs[1]


@torch.no_grad()
def test_vision_tower_on_cuda_matches_cpu(checkpoint):
    from hyla.models.vision_loader import load_vision_tower

    tower = load_vision_tower(checkpoint)
    grids = [(1, 8, 12), (1, 4, 4)]
    pixels = torch.randn(sum(t * h * w for t, h, w in grids), tower.config.patch_dim)
    want = tower(pixels, grids)
    got = tower.cuda()(pixels.cuda(), grids).cpu()
    assert (got - want).abs().max().item() <= 1e-3 * want.abs().max().item()
