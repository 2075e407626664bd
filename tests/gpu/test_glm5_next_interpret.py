"""A tiny GLM-5.3-Flash (`tests.glm_tiny`: 3 hyper-connection streams, pools of 4, a shared
indexer layer, clamped MoE) with its hyper-connection, pooled-indexer and clamped-MoE kernels
(GEMVs with the shared expert for decode rows, `combine` after the dense form) forced on CPU
tensors under
TRITON_INTERPRET=1, against transformers (fp32): prefill logits within the CPU parity tests'
1e-4 and greedy tokens equal to `generate`'s. Skipped as `test_dsa_interpret.py` is."""

from __future__ import annotations

import pytest
import torch

from tests.gpu import interpreter  # first: sets TRITON_INTERPRET before triton loads

pytestmark = [
    *interpreter.marks("test_glm5_next_gpu.py"),
    # numpy warns about the masked lanes of softmaxes (-inf - -inf) that tl.where discards
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from hyla.models.loader import load_model
    from tests.glm_tiny import save_tiny_glm

    path = tmp_path_factory.mktemp("glm5_next_interpret")
    hf = save_tiny_glm(path, seed=0)
    return hf, load_model(path, dtype="float32")


@pytest.fixture
def kernel_calls(monkeypatch) -> list[str]:
    import hyla.layers.moe
    import hyla.ops.hyper_connection
    import hyla.ops.kpool_indexer
    import hyla.ops.moe_clamped
    from hyla.ops.hyper_connection import kernels as hc_kernels
    from hyla.ops.kpool_indexer import kernels as pool_kernels
    from hyla.ops.moe import gemv as moe_gemv

    calls: list[str] = []
    for module in (hc_kernels, pool_kernels):
        for name in ("hc_pre_norm", "hc_expand", "write_pool_keys", "kpool_indexer_topk"):
            fn = getattr(module, name, None)
            if fn is not None:
                wrapped = lambda *a, fn=fn, name=name, **k: calls.append(name) or fn(*a, **k)  # noqa: E731
                monkeypatch.setattr(module, name, wrapped)
    real_gemv = moe_gemv.moe_gemv
    monkeypatch.setattr(moe_gemv, "moe_gemv",
                        lambda *a, **k: calls.append("moe_gemv") or real_gemv(*a, **k))  # fmt: skip
    for module in (hyla.ops.hyper_connection, hyla.ops.kpool_indexer, hyla.ops.moe,
                   hyla.ops.moe.kernels, hyla.ops.moe_clamped, hyla.layers.moe):  # fmt: skip
        monkeypatch.setattr(module, "use_triton", lambda x: True)
    return calls


def _prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(1234)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in (5, 18)]


def test_prefill_logits_match_transformers(pair, kernel_calls) -> None:
    from tests.models.parity import assert_prefill_matches

    hf, model = pair
    assert_prefill_matches(hf, model, _prompts(hf.config.text_config.vocab_size), 1e-4,
                           "glm5_next interpreted kernels")  # fmt: skip
    assert set(kernel_calls) == {"hc_pre_norm", "hc_expand", "write_pool_keys",
                                 "kpool_indexer_topk"}  # fmt: skip


def test_greedy_decode_matches_transformers_generate(pair, kernel_calls) -> None:
    from tests.models.parity import assert_greedy_matches_generate

    hf, model = pair
    prompts = _prompts(hf.config.text_config.vocab_size)[:1]
    assert_greedy_matches_generate(hf, model, prompts, 3, "glm5_next interpreted kernels")
    assert {"kpool_indexer_topk", "moe_gemv"} <= set(kernel_calls)  # decode rows: T k <= E
