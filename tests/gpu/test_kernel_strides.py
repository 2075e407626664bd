"""The GPU fast paths on strided inputs and large offsets, against the CPU references.

The references accept any strides; the Triton kernels read some arguments with an assumed unit
stride, so the wrappers must make those contiguous: `write_paged`'s slot_mapping, the norm
weight, `sparse_mla`'s topk_indices and block_tables, the indexer's weights. fla's recurrent
KDA must also honour `inplace_state` for a float32 state whose rows are not contiguous (fla
writes a copy, which has to be copied back). All results here are exact or within fp32 rounding.

Each check runs on CUDA (the GPU tests) and on CPU tensors under TRITON_INTERPRET=1 in a
subprocess (skipped without triton, or where CUDA is present; the fla check also needs fla).
`test_sparse_mla_head_stride_past_int32_cuda` (CUDA only, ~4.3 GB) covers the q_lat head
stride T * R that passes 2^31 elements in a long prefill (int32 overflow before the fix).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def check_paged_strided_slots(device: str) -> None:
    from hyla.ops.paged import kernels, reference

    values = torch.randn(3, 8, generator=_gen()).to(device)
    slots = torch.tensor([5, 0, 9, 0, 2, 0], device=device)[::2]  # stride 2
    cache, want = torch.zeros(4, 4, 8, device=device), torch.zeros(4, 4, 8, device=device)
    kernels.write_paged(cache, slots, values)
    reference.write_paged(want, slots, values)
    assert torch.equal(cache, want)


def check_norm_strided_weight(device: str) -> None:
    from hyla.ops.norm import kernels, reference

    x = torch.randn(3, 16, generator=_gen()).to(device)
    weight = torch.randn(32, generator=_gen(1)).to(device)[::2]  # stride 2
    got = kernels.rms_norm(x, weight, 1e-6)
    torch.testing.assert_close(got, reference.rms_norm(x, weight, 1e-6), rtol=1e-5, atol=1e-6)


def check_sparse_mla_strided_indices(device: str) -> None:
    from hyla.ops.sparse_attention import kernels

    T, H, R, Dr = 2, 2, 16, 16
    q_lat, q_rope = (torch.randn(T, H, d, generator=_gen(d)).to(device) for d in (R, Dr))
    cache = torch.randn(4, 4, R + Dr, generator=_gen(2)).to(device)
    wide_tables = torch.tensor([[0, 9, 1, 9, 2, 9, 3, 9]], dtype=torch.int32, device=device)
    row_seq = torch.zeros(T, dtype=torch.int32, device=device)
    wide_idx = torch.full((T, 8), -1, dtype=torch.int32, device=device)
    wide_idx[:, ::2] = torch.tensor([[0, 5, 6, 13], [1, 2, 3, 4]], dtype=torch.int32)
    tables, idx = wide_tables[:, ::2], wide_idx[:, ::2]  # strided views
    got = kernels.sparse_latent_attention(q_lat, q_rope, cache, tables, row_seq, idx, 0.1)
    want = kernels.sparse_latent_attention(
        q_lat, q_rope, cache, tables.contiguous(), row_seq, idx.contiguous(), 0.1
    )
    assert torch.equal(got, want)


def check_indexer_strided_weights(device: str) -> None:
    from hyla.ops.dsa_indexer import kernels, reference

    T, Hi, Di = 3, 4, 16
    q = torch.randn(T, Hi, Di, generator=_gen()).to(device)
    weights = torch.randn(Hi, T, generator=_gen(1)).to(device).t()  # [T, Hi], stride (1, T)
    keys = torch.randn(2, 4, Di, generator=_gen(2)).to(device)
    tables = torch.tensor([[0, 1]], dtype=torch.int32, device=device)
    cu = torch.tensor([0, T], dtype=torch.int32, device=device)
    got = kernels.lightning_indexer_topk(q, weights, keys, tables, cu, [8], 4, Di**-0.5)
    want = reference.lightning_indexer_topk(
        q.cpu(), weights.cpu(), keys.cpu(), tables.cpu(), cu.cpu(), [8], 4, Di**-0.5
    )
    assert torch.equal(got.cpu(), want)


def check_fla_recurrent_inplace_strided_state(device: str) -> None:
    from hyla.ops.kda import cpu, kernels

    T, H, K = 2, 1, 16
    q, k, v = (torch.randn(T, H, K, generator=_gen(s)).to(device) for s in range(3))
    g = -torch.rand(T, H, K, generator=_gen(3)).to(device)
    beta = torch.rand(T, H, generator=_gen(4)).to(device)
    cu = torch.tensor([0, 1, 2], dtype=torch.int32, device=device)
    state = torch.randn(2, H, K, 2 * K, generator=_gen(5)).to(device)[..., ::2]  # fp32, strided
    want_state = state.cpu().clone()
    want_o, _ = cpu.recurrent_kda(
        q.cpu(), k.cpu(), v.cpu(), g.cpu(), beta.cpu(), cu.cpu(), want_state, None, True,
        inplace_state=True,
    )  # fmt: skip
    o, final = kernels.recurrent_kda(q, k, v, g, beta, cu, state, None, True, inplace_state=True)
    assert final is state  # updated in place, as cpu.recurrent_kda does
    torch.testing.assert_close(state.cpu(), want_state, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(o.cpu(), want_o, rtol=1e-5, atol=1e-5)


TRITON_CHECKS = [
    check_paged_strided_slots,
    check_norm_strided_weight,
    check_sparse_mla_strided_indices,
    check_indexer_strided_weights,
]


@needs_cuda
@pytest.mark.parametrize("check", TRITON_CHECKS, ids=lambda c: c.__name__)
def test_strided_inputs_cuda(check) -> None:
    check("cuda")


@needs_cuda
def test_fla_recurrent_inplace_strided_state_cuda() -> None:
    from hyla.ops.kda.kernels import fla_available

    if not fla_available():
        pytest.skip("needs fla")
    check_fla_recurrent_inplace_strided_state("cuda")


@needs_cuda
def test_sparse_mla_head_stride_past_int32_cuda() -> None:
    """q_lat [T, H, R] with head stride 2^30 + 16: head 2 starts past 2^31 elements."""
    from hyla.ops.sparse_attention import kernels

    T, H, R, Dr, head_stride = 1, 3, 16, 16, (1 << 30) + 16
    storage = torch.empty(2 * head_stride + R, dtype=torch.float16, device="cuda")
    q_lat = storage.as_strided((T, H, R), (R, head_stride, 1))
    q_lat.copy_(torch.randn(T, H, R, generator=_gen()).half())
    q_rope = torch.randn(T, H, Dr, generator=_gen(1)).half().cuda()
    cache = torch.randn(2, 4, R + Dr, generator=_gen(2)).half().cuda()
    tables = torch.tensor([[0, 1]], dtype=torch.int32, device="cuda")
    row_seq = torch.zeros(T, dtype=torch.int32, device="cuda")
    idx = torch.tensor([[0, 1, 2, 3, 4]], dtype=torch.int32, device="cuda")
    got = kernels.sparse_latent_attention(q_lat, q_rope, cache, tables, row_seq, idx, 0.1)
    want = kernels.sparse_latent_attention(
        q_lat.contiguous(), q_rope, cache, tables, row_seq, idx, 0.1
    )
    del storage, q_lat
    assert torch.equal(got, want)


def _run_interpreted(code: str) -> subprocess.CompletedProcess:
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
        timeout=240,
    )  # fmt: skip


def _skip_unless_interpreter() -> None:
    if importlib.util.find_spec("triton") is None:
        pytest.skip("needs triton")
    if HAS_CUDA:
        pytest.skip("CUDA present: the GPU tests above run these kernels")


def test_strided_inputs_under_triton_interpreter() -> None:
    _skip_unless_interpreter()
    names = ", ".join(c.__name__ for c in TRITON_CHECKS)
    code = (
        f"from tests.gpu.test_kernel_strides import {names}\nfor check in ({names},): check('cpu')"
    )
    done = _run_interpreted(code)
    assert done.returncode == 0, done.stderr[-3000:]


def test_fla_recurrent_inplace_strided_state_under_triton_interpreter() -> None:
    _skip_unless_interpreter()
    code = (
        "import sys\n"
        "from hyla.ops.kda.kernels import fla_available\n"
        "if not fla_available(): sys.exit(77)\n"
        "from tests.gpu.test_kernel_strides import check_fla_recurrent_inplace_strided_state\n"
        "check_fla_recurrent_inplace_strided_state('cpu')"
    )
    done = _run_interpreted(code)
    if done.returncode == 77:
        pytest.skip("fla does not import here")
    assert done.returncode == 0, done.stderr[-3000:]
