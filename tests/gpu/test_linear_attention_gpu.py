"""KDA and Gated DeltaNet on CUDA (fla-core, `hyla.ops.{kda,gdn}.kernels`) vs the CPU reference.

The reference is `reference.recurrent_*` (the definition, fp32) run on CPU fp32 copies of the
very inputs the GPU saw (bf16 inputs are upcast exactly), so only the kernels' own rounding
counts. Errors are measured over max|ref| ("max") and as RMS(err) / RMS(ref) ("rms", fla's own
test metric, robust to one unlucky element). Bounds, with the reasoning:

  recurrent, fp32 inputs    max 1e-4   fla's fused recurrent kernel is fp32 FMAs like the
                                       reference; only summation order and exp() differ
  recurrent, bf16 inputs    o max 1e-2 the output is rounded to bf16: half an ulp is 2^-9 of
                            state 1e-4 the element, at most 2^-8 of max|o|; states stay fp32
  chunk, fp32 inputs        rms 3e-3   fla's chunk kernels multiply with tl.dot in TF32 (operands
                            max 1e-2   rounded to 2^-11 relative) and solve 16x16 blocks in fp32
  chunk, bf16 inputs        rms 1.5e-2 intra-chunk matrices, w/u and per-chunk states are stored
                            max 5e-2   in bf16 (2^-9 each, a few in a row); fla's own tests
                                       hold bf16 chunk outputs to rms 5e-3 .. 8e-3
  tiny model logits         mean 2e-3  CUDA vs CPU, fp32 weights: the chunk kernels' TF32 noise
  (CUDA vs CPU, fp32)       max 0.25   plus the other ops' reordering; a near-tie in an MoE
                            argmax     router may flip an expert (as in tests/models/test_bf16.py,
                            >= 95%     which allows 0.25 for bf16)

Unused pool slots are NaN: the decode through `state_indices` must neither read nor write them.
"""

from __future__ import annotations

import math

import pytest
import torch

from hyla.ops import gdn, kda
from hyla.ops.gdn import reference as gdn_reference
from hyla.ops.kda import kernels
from hyla.ops.kda import reference as kda_reference

HAS_CUDA = torch.cuda.is_available()
HAS_FLA = HAS_CUDA and kernels.fla_available()
pytestmark = [
    pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA"),
    pytest.mark.skipif(HAS_CUDA and not HAS_FLA, reason="needs fla-core (and einops)"),
]

LENS = [1, 7, 64, 65, 300, 2049]
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]
# (kind, H, HV): Kimi Linear has HV == H, Qwen3-Next HV = 2 H; KDA with GVA is covered too
HEADS = [
    pytest.param("kda", 2, 2, id="kda"),
    pytest.param("kda", 2, 4, id="kda-gva"),
    pytest.param("gdn", 2, 4, id="gdn-gva"),
]
OPS = {
    "kda": (kda.chunk_kda, kda.recurrent_kda, kda_reference.recurrent_kda),
    "gdn": (
        gdn.chunk_gated_delta_rule,
        gdn.recurrent_gated_delta_rule,
        gdn_reference.recurrent_gated_delta_rule,
    ),
}
CHUNK_BOUNDS = {torch.float32: (3e-3, 1e-2), torch.bfloat16: (1.5e-2, 5e-2)}  # (rms, max)


def _errors(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    got, want = got.float().cpu(), want.float().cpu()
    assert torch.isfinite(got).all(), "non-finite values"
    err = got - want
    rms = (err.square().mean().sqrt() / want.square().mean().sqrt().clamp_min(1e-30)).item()
    return rms, (err.abs().max() / want.abs().max().clamp_min(1e-30)).item()


def _inputs(kind, lens, H, HV, dtype, K=128, V=128, seed=0, has_state=True):
    """Packed inputs on CUDA (q, k, v, beta in dtype; g fp32, as the layers make it) and the
    initial states. g spans slow to fast decay: -exp(U(log 1e-3, 0)) per element."""
    gen = torch.Generator().manual_seed(seed)
    T, N = sum(lens), len(lens)
    g_shape = (T, HV, K) if kind == "kda" else (T, HV)
    x = {
        "q": torch.randn(T, H, K, generator=gen),
        "k": torch.randn(T, H, K, generator=gen),
        "v": torch.randn(T, HV, V, generator=gen),
        "g": -torch.empty(g_shape).uniform_(math.log(1e-3), 0.0, generator=gen).exp(),
        "beta": torch.rand(T, HV, generator=gen),
    }
    x = {n: (t if n == "g" else t.to(dtype)).cuda() for n, t in x.items()}
    cu = torch.tensor([0, *lens], dtype=torch.int32).cumsum(0, dtype=torch.int32).cuda()
    h0 = 0.5 * torch.randn(N, HV, K, V, generator=gen) if has_state else None
    return x, cu, (None if h0 is None else h0.cuda())


def _reference(kind, x, cu, h0, **kw):
    cpu = {n: t.float().cpu() for n, t in x.items()}
    h0 = None if h0 is None else h0.cpu()
    return OPS[kind][2](*cpu.values(), cu.cpu(), h0, **kw)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind,H,HV", HEADS)
def test_chunk_varlen_matches_reference(kind, H, HV, dtype) -> None:
    x, cu, h0 = _inputs(kind, LENS, H, HV, dtype)
    o, state = OPS[kind][0](*x.values(), cu, h0, use_qk_l2norm=True)
    ref_o, ref_state = _reference(kind, x, cu, h0, use_qk_l2norm=True)
    assert o.dtype == dtype and o.shape == ref_o.shape
    assert state.dtype == torch.float32 and state.shape == ref_state.shape
    rms_bound, max_bound = CHUNK_BOUNDS[dtype]
    for name, got, want in (("o", o, ref_o), ("state", state, ref_state)):
        rms, mx = _errors(got, want)
        print(f"{kind} H={H} HV={HV} {dtype} chunk {name}: rms {rms:.2e} max {mx:.2e}")
        assert rms <= rms_bound and mx <= max_bound, f"{name}: rms {rms:.2e} max {mx:.2e}"


@pytest.mark.parametrize("kind", ["kda", "gdn"])
def test_chunk_100k_token_sequence_beside_short_ones(kind) -> None:
    """A 100K-token sequence packed with 1- and 37-token ones (fp32, GVA for GDN), against the
    token-by-token fp32 recurrence: the chunk bounds hold over 100K tokens."""
    H, HV = (2, 2) if kind == "kda" else (2, 4)
    x, cu, h0 = _inputs(kind, [1, 100_000, 37], H, HV, torch.float32, seed=3)
    o, state = OPS[kind][0](*x.values(), cu, h0, use_qk_l2norm=True)
    ref_o, ref_state = _reference(kind, x, cu, h0, use_qk_l2norm=True)
    rms_bound, max_bound = CHUNK_BOUNDS[torch.float32]
    for name, got, want in (("o", o, ref_o), ("state", state, ref_state)):
        rms, mx = _errors(got, want)
        print(f"{kind} 100K chunk {name}: rms {rms:.2e} max {mx:.2e}")
        assert rms <= rms_bound and mx <= max_bound, f"{name}: rms {rms:.2e} max {mx:.2e}"


@pytest.mark.parametrize("kind,H,HV", HEADS)
def test_chunk_without_initial_state_inplace_and_no_l2norm(kind, H, HV) -> None:
    # k pre-normalized (use_qk_l2norm=False needs |k| <= 1 for a stable delta rule), custom scale
    x, cu, _ = _inputs(kind, [5, 130, 64], H, HV, torch.float32, has_state=False, seed=1)
    x["k"] = torch.nn.functional.normalize(x["k"], dim=-1)
    o, state = OPS[kind][0](*x.values(), cu, None, 0.05)
    ref_o, ref_state = _reference(kind, x, cu, None, scale=0.05)
    for got, want in ((o, ref_o), (state, ref_state)):
        rms, mx = _errors(got, want)
        assert rms <= 3e-3 and mx <= 1e-2, f"rms {rms:.2e} max {mx:.2e}"
    # inplace_state: the caller's fp32 state is overwritten and returned
    x, cu, h0 = _inputs(kind, [3, 70], H, HV, torch.float32, seed=2)
    ref_o, ref_state = _reference(kind, x, cu, h0, use_qk_l2norm=True)
    h = h0.clone()
    o, state = OPS[kind][0](*x.values(), cu, h, use_qk_l2norm=True, inplace_state=True)
    assert state is h
    assert _errors(h, ref_state)[1] <= 1e-2


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind,H,HV", HEADS)
def test_recurrent_varlen_matches_reference(kind, H, HV, dtype) -> None:
    x, cu, h0 = _inputs(kind, [1, 7, 64, 65, 3], H, HV, dtype)
    o, state = OPS[kind][1](*x.values(), cu, h0, use_qk_l2norm=True)
    ref_o, ref_state = _reference(kind, x, cu, h0, use_qk_l2norm=True)
    assert o.dtype == dtype and state.dtype == torch.float32
    o_bound = 1e-4 if dtype == torch.float32 else 1e-2
    assert _errors(o, ref_o)[1] <= o_bound, _errors(o, ref_o)
    assert _errors(state, ref_state)[1] <= 1e-4, _errors(state, ref_state)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind,H,HV", HEADS)
def test_decode_on_state_pool_in_place(kind, H, HV, dtype) -> None:
    """T == N: one token per sequence, states read and written in a NaN-poisoned pool."""
    N, num_slots = 37, 100
    x, cu, h0 = _inputs(kind, [1] * N, H, HV, dtype, seed=3)
    slots = torch.randperm(num_slots - 1, generator=torch.Generator().manual_seed(3))[:N] + 1
    pool = torch.full((num_slots, *h0.shape[1:]), float("nan"), device="cuda")
    pool[slots.cuda()] = h0
    ref_o, ref_state = _reference(kind, x, cu, h0, use_qk_l2norm=True)
    o_bound = 1e-4 if dtype == torch.float32 else 1e-2

    o, out = OPS[kind][1](
        *x.values(), cu, pool, use_qk_l2norm=True, inplace_state=True,
        state_indices=slots.cuda(),
    )  # fmt: skip
    assert out is pool
    assert _errors(o, ref_o)[1] <= o_bound
    assert _errors(pool[slots.cuda()], ref_state)[1] <= 1e-4
    unused = torch.ones(num_slots, dtype=torch.bool)
    unused[slots] = False
    assert torch.isnan(pool[unused.cuda()]).all(), "an unused slot was written"

    # without inplace_state the pool is untouched and the states come back [N, ...]
    before = pool.clone()
    o2, final = OPS[kind][1](*x.values(), cu, pool, use_qk_l2norm=True, state_indices=slots.cuda())
    assert final.shape == h0.shape and torch.equal(pool.nan_to_num(), before.nan_to_num())
    # and a plain [N, ...] state updated in place (the contiguous-slots path)
    h = h0.clone()
    o3, out3 = OPS[kind][1](*x.values(), cu, h, use_qk_l2norm=True, inplace_state=True)
    assert out3 is h and _errors(o3, ref_o)[1] <= o_bound
    assert _errors(h, ref_state)[1] <= 1e-4


@pytest.mark.parametrize("family", ["kimi_linear", "qwen3_next"])
def test_tiny_model_logits_cuda_match_cpu(family, tmp_path) -> None:
    """Varlen prefill (1, 17, 80, 150 tokens) then 8 teacher-forced decode steps through
    `SequenceRunner` (shuffled state slots, NaN-poisoned caches) on CPU and on CUDA."""
    from hyla.models.loader import load_model
    from hyla.models.runner import SequenceRunner
    from tests.hf_tiny import save_tiny_hf_model

    save_tiny_hf_model(family, tmp_path, seed=0)
    models = [
        load_model(tmp_path, dtype="float32", device=d, progress=False) for d in ("cpu", "cuda")
    ]
    gen = torch.Generator().manual_seed(5)
    vocab = models[0].config.vocab_size
    prompts = [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in (1, 17, 80, 150)]
    runners = [SequenceRunner(m, len(prompts), 200) for m in models]
    steps = [dict(enumerate(prompts))]
    ref, got = ([r.step(steps[0], all_logits=True)] for r in runners)
    for _ in range(8):
        nxt = {i: [int(ref[-1][i][-1].argmax())] for i in range(len(prompts))}
        ref.append(runners[0].step(nxt, all_logits=True))
        got.append(runners[1].step(nxt, all_logits=True))
    a = torch.cat([s[i].reshape(-1, vocab) for s in ref for i in s])
    b = torch.cat([s[i].reshape(-1, vocab).cpu() for s in got for i in s])
    err = (a - b).abs()
    agree = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    print(f"{family} CUDA vs CPU logits: max {err.max():.2e} mean {err.mean():.2e} agree {agree}")
    assert torch.isfinite(b).all()
    assert err.mean() <= 2e-3 and err.max() <= 0.25 and agree >= 0.95
