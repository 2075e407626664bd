"""The tiny GLM-5.3-Flash (`tests.glm_tiny`) on CUDA through the GPU paths (fla KDA, Triton
sparse MLA with the safe selection, Triton norms; the pooled indexer, hyper-connections and the
clamped experts run as PyTorch on the device) against the same model on the CPU reference
paths, fp32. Bounds: prefill logits within 2e-3 (fla's chunk kernels run TF32); greedy token ids
identical over 24 decode steps, as a SequenceRunner and through the engine (CUDA defaults:
async output and scheduling, CUDA graphs where the layers allow them); the vision tower's rows
within 1e-3 of the CPU's, relative (TF32 matmuls)."""

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
    runner = SequenceRunner(model, len(prompts), 128, block_size=16)
    logits = runner.step(dict(enumerate(prompts)), all_logits=True)
    first = {i: v.cpu() for i, v in logits.items()}
    outs = {i: [int(v[-1].argmax())] for i, v in logits.items()}
    for _ in range(steps - 1):
        logits = runner.step({i: [o[-1]] for i, o in outs.items()})
        for i, v in logits.items():
            outs[i].append(int(v.argmax()))
    return first, outs


@torch.no_grad()
def test_cuda_matches_cpu_prefill_and_greedy(models):
    cpu, gpu = models
    prompts = [prompt_ids(n, seed=n) for n in PROMPT_LENS]
    ref_logits, ref_ids = _greedy(cpu, prompts, 24)
    got_logits, got_ids = _greedy(gpu, prompts, 24)
    for i in ref_logits:
        err = (got_logits[i] - ref_logits[i]).abs().max().item()
        assert err <= 2e-3, (PROMPT_LENS[i], err)
    assert got_ids == ref_ids


def test_engine_on_cuda_matches_cpu(models):
    cpu, gpu = models
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = {str(n): prompt_ids(n, seed=50 + n) for n in PROMPT_LENS}
    outs = []
    for model, device in ((cpu, "cpu"), (gpu, "cuda")):
        engine = make_engine(model, device=device, max_num_batched_tokens=32)
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
