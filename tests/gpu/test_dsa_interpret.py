"""The DSA Triton kernels on CPU tensors under TRITON_INTERPRET=1 (tiny shapes, a few seconds):
the checks of `test_dsa_gpu.py` without a GPU.

Skipped when triton is missing (CI), when CUDA is present (the GPU tests run the compiled
kernels; the interpreter flag would turn them into interpreted ones), and when triton was
imported before this module without the flag (it is read when `@triton.jit` decorates, triton's
own `tl.max` & co. included): in a full-suite run another module usually imports triton first,
so run this file on its own:

    python3 -m pytest -q tests/gpu/test_dsa_interpret.py -p no:cacheprovider
"""

from __future__ import annotations

import pytest
import torch

from tests.gpu import interpreter  # first: sets TRITON_INTERPRET before triton loads
from tests.gpu.test_dsa_gpu import (
    TINY,
    check_dense_selection,
    check_indexer,
    check_mla_paged,
    check_sparse_mla,
)

pytestmark = interpreter.marks("test_dsa_gpu.py")

SEQ_LENS, QUERY_LENS = [1, 5, 40, 70, 33], [1, 5, 6, 1, 2]


@pytest.mark.parametrize("key_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_indexer(key_dtype: torch.dtype) -> None:
    assert check_indexer(SEQ_LENS, QUERY_LENS, 16, key_dtype, "cpu") >= 13


def test_indexer_ties_and_fp8() -> None:
    check_indexer(SEQ_LENS, QUERY_LENS, 16, torch.float32, "cpu", ties=True, head_dim=8)
    check_indexer(SEQ_LENS, QUERY_LENS, 16, torch.float8_e4m3fn, "cpu", seed=2)


def test_indexer_decode_rows_and_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    from hyla.ops.dsa_indexer import kernels

    monkeypatch.setattr(kernels, "MAX_KEY_ELEMENTS", 2 * 70)
    check_indexer(SEQ_LENS, [1] * 5, 16, torch.float32, "cpu", seed=3)
    check_indexer(SEQ_LENS, QUERY_LENS, 16, torch.float32, "cpu", seed=3)


@pytest.mark.parametrize("topk", [8, 64])
def test_sparse_mla(topk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from hyla.ops.sparse_attention import kernels

    monkeypatch.setattr(kernels, "MIN_IDX_PER_SPLIT", 8)
    assert check_sparse_mla(SEQ_LENS, QUERY_LENS, topk, TINY, torch.float32, "cpu") <= 1e-5
    assert check_sparse_mla(SEQ_LENS, [1] * 5, topk, TINY, torch.float32, "cpu") <= 1e-5  # splits


def test_mla_paged(monkeypatch: pytest.MonkeyPatch) -> None:
    from hyla.ops.sparse_attention import kernels

    monkeypatch.setattr(kernels, "MIN_IDX_PER_SPLIT", 8)
    assert check_mla_paged(SEQ_LENS, QUERY_LENS, 80, TINY, torch.float32, "cpu") <= 1e-5
    assert check_mla_paged(SEQ_LENS, [1] * 5, 96, TINY, torch.float32, "cpu") <= 1e-5  # splits


def test_dense_selection() -> None:
    check_dense_selection([1, 7, 60, 64, 30], [1, 7, 6, 1, 2], 64, "cpu")


def test_layer_attend_selected_matches_cpu_path() -> None:
    """The CUDA branch's `attend_selected` (run on CPU: reference ops) equals the CPU path."""
    from hyla.forward_batch import allocate_caches, build_forward_batch
    from hyla.ops.paged import write_paged
    from tests.gpu.test_dsa_gpu import dsa_layer

    config, layer = dsa_layer("cpu")
    lens = [3, 20, 8]
    tables = [list(range(1 + 5 * i, 6 + 5 * i)) for i in range(3)]
    caches = allocate_caches(config, 16, 4, 4)
    caches[0]["latent"].fill_(float("nan"))
    caches[0]["index_keys"].fill_(float("nan"))
    batch = build_forward_batch(lens, [0, 0, 0], tables, [1, 2, 3], 4, caches)
    x = torch.randn(sum(lens), 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = layer(x, batch.positions, batch)
        proj = layer.project(x, batch.positions)
        iq, iw, ik = layer.indexer(x, proj.q_resid, proj.cos_sin)
        write_paged(caches[0]["index_keys"], batch.slot_mapping, ik)
        out = layer.attend_selected(proj, iq, iw, batch)
        assert out.shape == (sum(lens), 4, 12)
        torch.testing.assert_close(layer.o_proj(out.flatten(1)), want, rtol=1e-5, atol=1e-5)
