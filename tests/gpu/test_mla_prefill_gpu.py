"""Expanded MLA prefill through the tiled GQA kernel (`hyla.ops.mla.prefill.mla_prefill_flash`)
against its definition, `hyla.ops.mla.reference.mla_expanded`, run on fp32 copies of the same
inputs; the MLA layer of an eager CUDA step (prefill sequences on the new path, decode rows
on `mla_paged`) against the CPU layer; and the greedy output of a tiny Kimi-Linear engine on CUDA
against the CPU engine.

Caches are paged under shuffled block tables with NaN in every slot no sequence owns and 1e30 in
the spare block that padded table entries point at (`test_dsa_gpu.paged_cache`). Bounds:
max|got - want| / max|want| <= 1e-4 for fp32 inputs, <= 2e-2 for bf16 (one bf16 rounding of
the expanded keys and values and of the probabilities). `check_mla_prefill` takes a device:
test_mla_prefill_interpret.py runs it on CPU tensors under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import pytest
import torch

from hyla.ops.fp8.reference import quantize_per_token
from hyla.ops.mla.reference import mla_expanded
from tests.gpu.test_dsa_gpu import cu_seqlens, paged_cache

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

TINY = (4, 16, 8, 12, 16)  # H, Dn, Dr, Dv, R: tests/layers/test_attention.py's MLA
KIMI_1_5B = (16, 128, 64, 128, 512)  # bench/gpu_e2e.py's model


def check_mla_prefill(
    seq_lens: list[int],
    query_lens: list[int],
    dims: tuple[int, int, int, int, int],
    dtype: torch.dtype,
    device,
    page: int = 16,
    fp8: bool = False,
    workspace_bytes: int | None = None,
    seed: int = 0,
) -> float:
    """`mla_prefill_flash` vs `mla_expanded` on fp32 copies (same device; on CUDA the
    reference's matmuls run in full fp32, TF32 off by default); returns the relative error.
    With `fp8` the latent cache is e4m3 with per-token scales (both read the same bytes)."""
    from hyla.ops.mla.prefill import mla_prefill_flash

    num_heads, dn, dr, dv, rank = dims
    gen = torch.Generator().manual_seed(seed)
    cache, tables, _ = paged_cache(seq_lens, rank + dr, torch.float32, page, "cpu", gen)
    latent_scale = None
    if fp8:
        cache, latent_scale = quantize_per_token(cache)
    else:
        cache = cache.to(dtype)
    num_rows = sum(query_lens)
    q_nope = torch.randn(num_rows, num_heads, dn, generator=gen).to(dtype)
    q_rope = torch.randn(num_rows, num_heads, dr, generator=gen).to(dtype)
    kv_b = (torch.randn(num_heads * (dn + dv), rank, generator=gen) / rank**0.5).to(dtype)
    cu, scale = cu_seqlens(query_lens, "cpu"), (dn + dr) ** -0.5
    extra = {} if workspace_bytes is None else {"workspace_bytes": workspace_bytes}
    to = [t.to(device) for t in (q_nope, q_rope, cache, tables, cu)]
    got = mla_prefill_flash(
        *to, seq_lens, kv_b.to(device), scale, query_lens=query_lens,
        latent_scale=None if latent_scale is None else latent_scale.to(device), **extra,
    )  # fmt: skip
    assert got.dtype == dtype and got.shape == (num_rows, num_heads, dv)
    fp32 = [t.to(device) for t in (q_nope.float(), q_rope.float(), cache if fp8 else cache.float(),
                                   tables, cu)]  # fmt: skip
    want = mla_expanded(
        *fp32, seq_lens, kv_b.float().to(device), scale,
        latent_scale=None if latent_scale is None else latent_scale.to(device),
    ).cpu()  # fmt: skip
    got = got.cpu().float()
    assert not got.isnan().any()
    return float((got - want).abs().max() / want.abs().max())


# (seq_lens, query_lens), 16-token pages: a 1500-token prompt, a 1000-token chunk after 100
# cached tokens (a partial block), 24 tokens after 1976 cached (many blocks)
MIXED = ([1500, 1100, 2000], [1500, 1000, 24])
BOUND = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_prefill_mixed_prefixes_1_5b_shapes(dtype) -> None:
    err = check_mla_prefill(*MIXED, KIMI_1_5B, dtype, "cuda")
    print(f"mla_prefill {dtype}: rel err {err:.2e}")
    assert err <= BOUND[dtype]


@pytest.mark.parametrize(
    "seq_lens,query_lens",
    [([1024], [1024]), ([8192], [8192]), ([4096 + 8192], [4096]), ([8192 + 2048, 3000], [8192, 7])],
    ids=["1K", "8K", "4K-after-8K", "8K-after-2K+chunk"],
)
def test_prefill_long_bf16(seq_lens, query_lens) -> None:
    err = check_mla_prefill(seq_lens, query_lens, KIMI_1_5B, torch.bfloat16, "cuda", page=64)
    assert err <= 2e-2


def test_prefill_fp8_cache_and_workspace_groups() -> None:
    """An fp8 latent cache; a cap that splits the sequences into groups and sends the longest
    context to `mla_paged`."""
    from hyla.ops.mla.prefill import workspace_token_bytes

    token = workspace_token_bytes(576, 512, 16, 128, 128, 2)
    err = check_mla_prefill(*MIXED, KIMI_1_5B, torch.bfloat16, "cuda", fp8=True,
                            workspace_bytes=1600 * token)  # fmt: skip
    assert err <= 3e-2


@pytest.mark.parametrize("case_id", ["kimi-nope", "deepseek-interleave-qlora"])
def test_layer_mixed_step_matches_cpu(case_id, monkeypatch) -> None:
    """The MLA layer of an eager CUDA step (prefill sequences through `mla_prefill`, decode
    rows through `mla_paged`) vs the CPU layer (`attend_dense`), fp32 and bf16."""
    from tests.layers.test_mla_routing import _spy, run_mixed_steps

    want = run_mixed_steps(case_id, "cpu", torch.float32, split=False)
    calls = _spy(monkeypatch)
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 3e-2)):
        got = run_mixed_steps(case_id, "cuda", dtype, split=False)
        for g, w in zip(got, want, strict=True):
            assert float((g - w).abs().max() / w.abs().max()) <= tol, dtype
    assert calls[:3] == [("mla_prefill", 47), ("mla_paged", 2), ("mla_prefill", 31)]


PROMPT_LENS = (5, 70, 130, 33, 200)  # with a 48-token budget: chunks beside decoding rows


def _kimi_engine(path, device: str, **overrides):
    from hyla.ops.kda.kernels import fla_available

    if device == "cuda" and not fla_available():
        pytest.skip("needs fla-core (and einops)")
    from hyla.models.loader import load_model
    from tests.engine.engine_util import make_engine
    from tests.hf_tiny import save_tiny_hf_model

    if not (path / "config.json").exists():
        save_tiny_hf_model("kimi_linear", path, seed=0)
    model = load_model(str(path), dtype="float32", device=device, progress=False)
    return make_engine(model, device=device, **overrides)


def _run_prompts(engine) -> dict:
    from hyla.request import SamplingParams
    from tests.engine.engine_util import prompt_ids, run_all

    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=5)
    for i, n in enumerate(PROMPT_LENS):
        engine.add_request(f"r{i}", prompt_ids(n, seed=i), params)
    return run_all(engine)


def test_kimi_engine_greedy_cuda_equals_cpu(tmp_path) -> None:
    """Greedy of a tiny Kimi-Linear engine on CUDA (chunked prompts beside decoding requests:
    mixed steps through the new path) equals the CPU engine's up to the first near tie."""
    from tests.engine.engine_util import assert_close_completion

    outs = {d: _run_prompts(_kimi_engine(tmp_path, d, max_num_batched_tokens=48))
            for d in ("cpu", "cuda")}  # fmt: skip
    assert outs["cpu"].keys() == outs["cuda"].keys()
    for rid, want in outs["cpu"].items():
        assert_close_completion(outs["cuda"][rid], want, atol=2e-3)


def test_warm_up_compiles_the_prefill_kernel(tmp_path) -> None:
    """After `warm_up`, mixed steps with any number of prefill sequences and block-table widths
    compile no new variant of the tiled kernel (it does not specialize on either)."""
    from hyla.engine.warmup import warm_up
    from hyla.ops.gqa import kernels

    caches = getattr(kernels._paged_gqa_kernel, "device_caches", None)
    if caches is None:
        pytest.skip("this triton keeps no per-device kernel cache to count")

    def compiled() -> int:
        return sum(len(c[0]) for c in caches.values())

    engine = _kimi_engine(tmp_path, "cuda", max_num_batched_tokens=48)
    warm_up(engine)
    warm = compiled()
    _run_prompts(engine)
    assert warm >= 1 and compiled() == warm
