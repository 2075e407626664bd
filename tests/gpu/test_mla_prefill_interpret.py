"""Expanded MLA prefill through the tiled GQA kernel on CPU tensors under TRITON_INTERPRET=1
(small lengths): the checks of `test_mla_prefill_gpu.py` without a GPU, against
`reference.mla_expanded` (fp32), and the MLA layer of a forced CUDA-style step with the kernel
path against the CPU layer. Skipped as the other interpreter tests are (run this file alone)."""

from __future__ import annotations

import pytest
import torch

from tests.gpu import interpreter  # first: sets TRITON_INTERPRET before triton loads
from tests.gpu.test_mla_prefill_gpu import KIMI_1_5B, TINY, check_mla_prefill

pytestmark = interpreter.marks("test_mla_prefill_gpu.py")

# cached prefixes 0, a partial block, several blocks; chunks of 1 (a one-token prompt is a
# prefill sequence of its own here), 2, a few and a whole prompt
SEQ_LENS, QUERY_LENS = [70, 13, 40, 3, 1], [70, 7, 2, 3, 1]


@pytest.mark.parametrize("page", [4, 16])
def test_tiny_shapes(page: int) -> None:
    assert check_mla_prefill(SEQ_LENS, QUERY_LENS, TINY, torch.float32, "cpu", page) <= 1e-5


def test_1_5b_shapes() -> None:
    err = check_mla_prefill([40, 21], [40, 9], KIMI_1_5B, torch.float32, "cpu", page=16)
    assert err <= 1e-5


def test_key_blocks_and_the_one_padded_dot(monkeypatch: pytest.MonkeyPatch) -> None:
    """192 = 128 + 64 as two dots (and TINY's 24 = 16 + 16); powers of two stay one dot; with
    the split off (one dot padded to 256) the result is the same."""
    from hyla.ops.gqa import kernels

    assert [kernels.key_blocks(d) for d in (192, 24, 256, 128, 8)] == [
        (128, 64), (16, 16), (256, 0), (128, 0), (16, 0)
    ]  # fmt: skip
    assert kernels.key_blocks(192, split=False) == (256, 0)
    monkeypatch.setattr(kernels, "SPLIT_KEYS", False)
    err = check_mla_prefill([40, 21], [40, 9], KIMI_1_5B, torch.float32, "cpu", page=16)
    assert err <= 1e-5


def test_fp8_cache_and_workspace_groups() -> None:
    """An fp8 latent cache; a cap of 43 tokens (whole pages of 4): [70] alone over it
    (mla_paged), [13, 40] in two groups, [3, 1] in one."""
    from hyla.ops.mla.prefill import plan_groups, workspace_token_bytes

    token = workspace_token_bytes(TINY[4] + TINY[2], TINY[4], TINY[0], TINY[1], TINY[3], 4)
    assert plan_groups(SEQ_LENS, 4, token, 43 * token) == [
        (0, 1, False), (1, 2, True), (2, 3, True), (3, 5, True)
    ]  # fmt: skip
    err = check_mla_prefill(SEQ_LENS, QUERY_LENS, TINY, torch.float32, "cpu", 4, fp8=True,
                            workspace_bytes=43 * token)  # fmt: skip
    assert err <= 1e-5


@pytest.mark.parametrize("case_id", ["kimi-nope", "deepseek-interleave-qlora"])
def test_layer_with_the_kernel_path(case_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import hyla.layers.attention as attn
    from hyla.ops.mla.prefill import mla_prefill_flash
    from tests.layers.test_mla_routing import run_mixed_steps

    want = run_mixed_steps(case_id, "cpu", torch.float32, split=False)
    monkeypatch.setattr(attn, "mla_prefill", mla_prefill_flash)
    got = run_mixed_steps(case_id, "cpu", torch.float32, split=True)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_dense_dsa_sequences_equal_the_sparse_reference() -> None:
    """DSA's routing premise with the kernel path: sequences no longer than k through
    `mla_prefill_flash` equal the sparse reference over every visible token."""
    from hyla.ops.dsa_indexer.rows import dense_topk_indices
    from hyla.ops.mla.prefill import mla_prefill_flash
    from hyla.ops.sparse_attention import reference as sparse_ref
    from tests.ops.test_mla import _batch

    seq_lens, query_lens = [9, 14, 5], [3, 14, 2]
    cache, tables, _, cu, q_nope, q_rope, kv_b = _batch(8, seq_lens, query_lens)
    indices = dense_topk_indices(cu, seq_lens, 16, sum(query_lens))
    want = sparse_ref.sparse_mla(q_nope, q_rope, cache, tables, cu, indices, kv_b, 0.3)
    got = mla_prefill_flash(q_nope, q_rope, cache, tables, cu, seq_lens, kv_b, 0.3)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
