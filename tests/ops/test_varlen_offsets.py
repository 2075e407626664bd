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
