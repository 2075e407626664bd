"""The fla wrappers' host side: every layer of a step gets the same int64 cu_seqlens tensors
(fla memoizes its chunk plan by tensor identity), never a stale copy for a new step's tensor,
and the chunk wrapper's plumbing reproduces the reference."""

import gc

import torch

from hyla.ops.kda.kernels import _VarlenOffsets


def test_same_step_tensor_gives_the_same_objects():
    offsets = _VarlenOffsets()
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    first = offsets(cu)
    assert first[0].dtype == first[1].dtype == torch.int64
    assert first[0].tolist() == first[1].tolist() == [0, 3, 7]
    second = offsets(cu)
    assert second[0] is first[0] and second[1] is first[1]


def test_a_new_step_tensor_is_converted_again():
    offsets = _VarlenOffsets()
    old = torch.tensor([0, 3, 7], dtype=torch.int32)
    first = offsets(old)
    del old
    gc.collect()
    new = torch.tensor([0, 5, 6], dtype=torch.int32)  # may reuse the freed tensor's id
    second = offsets(new)
    assert second[0] is not first[0]
    assert second[0].tolist() == second[1].tolist() == [0, 5, 6]


def test_fla_chunk_wrapper_plumbing_matches_the_reference():
    """`run_fla_chunk` with a stand-in for fla (fla's layout in, the reference's math inside):
    the wrapper's reshapes, offsets, state handling and output dtype reproduce the reference."""
    from hyla.ops.kda import reference
    from hyla.ops.kda.kernels import run_fla_chunk

    calls = []

    def fake_fla(q, k, v, g, beta, *, scale, initial_state, output_final_state,
                 use_qk_l2norm_in_kernel, cu_seqlens, cu_seqlens_cpu, chunk_size):  # fmt: skip
        assert q.shape[0] == 1 and cu_seqlens.dtype == cu_seqlens_cpu.dtype == torch.int64
        assert output_final_state and initial_state.dtype == torch.float32
        calls.append(chunk_size)
        o, final = reference.chunk_kda(
            q[0], k[0], v[0], g[0], beta[0], cu_seqlens.to(torch.int32), initial_state,
            scale, use_qk_l2norm_in_kernel,
        )  # fmt: skip
        return o[None], final

    gen = torch.Generator().manual_seed(0)
    T, N, H, K, V = 9, 2, 2, 4, 4
    q, k = torch.randn(T, H, K, generator=gen), torch.randn(T, H, K, generator=gen)
    v = torch.randn(T, H, V, generator=gen)
    g = -torch.rand(T, H, K, generator=gen)
    beta = torch.rand(T, H, generator=gen)
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    state = torch.randn(N, H, K, V, generator=gen)
    want_o, want_state = reference.chunk_kda(q, k, v, g, beta, cu, state.clone(), None, True)
    pool = state.clone()
    o, final = run_fla_chunk(
        fake_fla, (q, k, v, g, beta, cu, pool), 3, None, True, 16, 64, inplace_state=True
    )
    assert calls == [64] and final is pool  # updated in place, as asked
    torch.testing.assert_close(o, want_o)
    torch.testing.assert_close(final, want_state)


def test_given_host_offsets_are_used_without_a_read_back(monkeypatch):
    """With `cu_seqlens_cpu` the device tensor is never copied to the host (that copy is the
    device sync the engine avoids); the host offsets must be a CPU tensor."""
    import pytest

    offsets = _VarlenOffsets()
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    host = torch.tensor([0, 3, 7], dtype=torch.int32)
    real_to = torch.Tensor.to

    def no_host_copy(self, *args, **kwargs):
        assert not (self is cu and args and args[0] == "cpu"), "cu_seqlens was read back"
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", no_host_copy)
    cu_long, cu_host = offsets(cu, host)
    assert cu_long.dtype == cu_host.dtype == torch.int64 and cu_host.tolist() == [0, 3, 7]
    monkeypatch.undo()
    with pytest.raises(ValueError, match="cu_seqlens_cpu"):
        _VarlenOffsets()(cu, torch.empty(3, dtype=torch.int64, device="meta"))


def test_the_layer_step_hands_its_host_offsets_to_the_chunk_op():
    """`delta_rule_step` passes `batch.cu_seqlens_host` as `cu_seqlens_cpu` to the chunk op
    (a whole-prefill step and the prefill part of a mixed step), equal to the offsets it gets."""
    from hyla.forward_batch import build_forward_batch
    from hyla.layers.state_slots import delta_rule_step
    from hyla.ops import kda

    seen = []

    def chunk_spy(*args, cu_seqlens_cpu=None, **kwargs):
        host = None if cu_seqlens_cpu is None else cu_seqlens_cpu.tolist()
        seen.append((args[5].tolist(), host))
        return kda.chunk_kda(*args, **kwargs)

    H, K = 2, 4
    for lens in ([3, 2], [1, 4]):  # all prefill; decode + prefill (the prefill part alone)
        T = sum(lens)
        gen = torch.Generator().manual_seed(T)
        q, k, v = (torch.randn(T, H, K, generator=gen) for _ in range(3))
        g, beta = -torch.rand(T, H, K, generator=gen), torch.rand(T, H, generator=gen)
        cache = {"recurrent_state": torch.zeros(4, H, K, K)}
        n = len(lens)
        batch = build_forward_batch(lens, [0] * n, [[0]] * n, [0, 2][:n], 16, [cache])
        seen.clear()
        delta_rule_step(chunk_spy, kda.recurrent_kda, q, k, v, g, beta, cache, batch)
        assert seen and all(dev == host for dev, host in seen), seen


def test_a_mixed_step_hands_both_ops_int32_offsets():
    """In a decode + prefill step each op gets its sub-batch's offsets as int32 (the dtype of
    `batch.cu_seqlens` and the ops' documented `cu_seqlens`), on the device and on the host."""
    from hyla.forward_batch import build_forward_batch
    from hyla.layers.state_slots import delta_rule_step
    from hyla.ops import kda

    seen = []

    def spy(op):
        def fn(*args, cu_seqlens_cpu=None, **kwargs):
            host = None if cu_seqlens_cpu is None else cu_seqlens_cpu.dtype
            seen.append((args[5].dtype, host))
            return op(*args, **kwargs)

        return fn

    H, K, lens = 2, 4, [1, 4, 1, 3]
    T, n = sum(lens), len(lens)
    gen = torch.Generator().manual_seed(T)
    q, k, v = (torch.randn(T, H, K, generator=gen) for _ in range(3))
    g, beta = -torch.rand(T, H, K, generator=gen), torch.rand(T, H, generator=gen)
    cache = {"recurrent_state": torch.zeros(n, H, K, K)}
    batch = build_forward_batch(lens, [0] * n, [[0]] * n, list(range(n)), 16, [cache])
    delta_rule_step(spy(kda.chunk_kda), spy(kda.recurrent_kda), q, k, v, g, beta, cache, batch)
    assert seen == [(torch.int32, None), (torch.int32, torch.int32)], seen
