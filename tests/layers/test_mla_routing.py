"""The routing of an MLA layer on a step with host and device lengths (an eager CUDA step):
prefill sequences go to `mla_prefill`, decode rows to `mla_paged` over the decode sequences,
a pure-decode step keeps one `mla_paged` call over every row. Forced on the CPU
(`lengths_on_device` set on the step's metadata: both ops then run their references); the
output equals the CPU path's (`attend_dense`), which tests/layers/test_attention.py holds
against transformers. `run_mixed_steps` takes a device: the GPU and interpreter tests reuse it.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hyla.forward_batch import allocate_caches, build_forward_batch
from tests.layers.test_attention import BLOCK, D, _build

# (cached tokens before the mixed step, its new tokens): a decode, a chunk after a partial
# block, a chunk after several blocks, a fresh prompt, another decode
MIXED = [(20, 1), (6, 9), (12, 5), (0, 17), (9, 1)]


def run_mixed_steps(
    case_id: str, device, dtype: torch.dtype, split: bool, mixed=MIXED
) -> list[torch.Tensor]:
    """Prefill every sequence's cached part in one step, then the mixed step; both outputs
    ([T, D] each, on the CPU in float32). `split` forces `lengths_on_device` (the CUDA routing)
    on the CPU; on CUDA it is set anyway."""
    case, layer = _build(case_id)
    layer = layer.to(device, dtype)
    per_seq = -(-max(c + n for c, n in mixed) // BLOCK)
    tables = [list(range(1 + i * per_seq, 1 + (i + 1) * per_seq))[::-1] for i in range(len(mixed))]
    caches = allocate_caches(case.config, len(mixed) * per_seq + 1, BLOCK, len(mixed) + 1, device)
    caches = [{k: t.to(dtype).fill_(float("nan")) for k, t in c.items()} for c in caches]
    gen = torch.Generator().manual_seed(11)
    outs = []
    for query_lens, context_lens in (([c for c, _ in mixed], [0] * len(mixed)),
                                     ([n for _, n in mixed], [c for c, _ in mixed])):  # fmt: skip
        ids = [i for i, q in enumerate(query_lens) if q]
        batch = build_forward_batch([query_lens[i] for i in ids], [context_lens[i] for i in ids],
                                    [tables[i] for i in ids], [i + 1 for i in ids], BLOCK, caches,
                                    device)  # fmt: skip
        if split:
            batch.attn = dataclasses.replace(batch.attn, lengths_on_device=True)
        x = torch.randn(batch.num_tokens, D, generator=gen).to(device, dtype)
        with torch.no_grad():
            outs.append(layer(x, batch.positions, batch).float().cpu())
    return outs


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    import hyla.layers.attention as attn

    calls: list[tuple[str, int]] = []
    for name in ("mla_paged", "mla_prefill", "mla_absorbed_batched", "mla_expanded"):
        fn = getattr(attn, name)

        def spy(q_nope, *a, _f=fn, _n=name, **kw):
            calls.append((_n, q_nope.shape[0]))
            return _f(q_nope, *a, **kw)

        monkeypatch.setattr(attn, name, spy)
    return calls


@pytest.mark.parametrize("case_id", ["kimi-nope", "deepseek-interleave-qlora"])
def test_mixed_step_splits_prefill_and_decode(case_id, monkeypatch) -> None:
    want = run_mixed_steps(case_id, "cpu", torch.float32, split=False)
    calls = _spy(monkeypatch)
    got = run_mixed_steps(case_id, "cpu", torch.float32, split=True)
    assert calls == [("mla_prefill", 47), ("mla_paged", 2), ("mla_prefill", 31)]
    for g, w in zip(got, want, strict=True):
        assert not g.isnan().any()
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_pure_decode_step_is_one_paged_call(monkeypatch) -> None:
    mixed = [(5, 1), (9, 1)]
    want = run_mixed_steps("kimi-nope", "cpu", torch.float32, split=False, mixed=mixed)
    calls = _spy(monkeypatch)
    got = run_mixed_steps("kimi-nope", "cpu", torch.float32, split=True, mixed=mixed)
    assert calls == [("mla_prefill", 14), ("mla_paged", 2)]
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)


def test_dsa_short_prefill_sequences_take_the_expanded_path(monkeypatch) -> None:
    """DSA on a forced CUDA-style step: the prefill sequence no longer than k (6 tokens, k = 8)
    goes to `mla_prefill`, the decode row of a short sequence and the long prefill chunk to one
    `sparse_mla` call; the output equals the CPU branch (attend_dense + attend_sparse)."""
    import hyla.layers.attention as attn
    import hyla.layers.sparse_attention as dsa
    from hyla.attention_metadata import AttentionMetadata
    from tests.layers.test_sparse_attention import CONFIG, _layers, _x
    from tests.paged_steps import PagedSteps

    layer, _ = _layers()
    xs = [_x(n, 300 + n) for n in (6, 21, 14, 8)]
    first = {1: xs[1][:20], 2: xs[2][:5], 3: xs[3][:7]}
    second = {3: xs[3][7:], 1: xs[1][20:], 0: xs[0], 2: xs[2][5:]}
    eager = AttentionMetadata.eager
    outputs, calls = [], []
    for name, module in (("mla_prefill", attn), ("sparse_mla", dsa)):
        fn = getattr(module, name)

        def spy(q_nope, *a, _f=fn, _n=name, **kw):
            calls.append((_n, q_nope.shape[0]))
            return _f(q_nope, *a, **kw)

        monkeypatch.setattr(module, name, spy)
    for on_device in (False, True):

        def forced(*a, on=on_device):
            return dataclasses.replace(eager(*a), lengths_on_device=on)

        monkeypatch.setattr(AttentionMetadata, "eager", forced)
        steps = PagedSteps(CONFIG, 4, 40, BLOCK, seed=5)
        calls.clear()
        outputs.append([steps.step(layer, first), steps.step(layer, second)])
    # forced: step 1 prompts of 5 and 7 (<= k) expanded, of 20 sparse; step 2: seq 0 (6 <= k)
    # expanded; the decode of seq 3 (8 <= k), seq 1's decode and seq 2's chunk -> sparse_mla
    assert calls == [("mla_prefill", 12), ("sparse_mla", 20), ("mla_prefill", 6),
                     ("sparse_mla", 11)]  # fmt: skip
    for cpu_step, gpu_step in zip(*outputs, strict=True):
        for i in cpu_step:
            torch.testing.assert_close(gpu_step[i], cpu_step[i], rtol=1e-5, atol=1e-5)
