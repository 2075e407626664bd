"""A tiny GLM-5.3-Flash (`tests.glm_tiny`: 3 hyper-connection streams, pools of 4, a shared
indexer layer, clamped MoE) with its hyper-connection, pooled-indexer and clamped-MoE kernels
(GEMVs with the shared expert for decode rows, `combine` after the dense form) forced on CPU
tensors under
TRITON_INTERPRET=1, against transformers (fp32): prefill and decode logits within the CPU
parity tests' 1e-4. Skipped as `test_dsa_interpret.py` is."""

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


@torch.no_grad()
def test_prefill_and_decode_logits_match_transformers(pair, kernel_calls) -> None:
    """Two sequences (3 and 9 tokens) prefilled in one packed step, then 2 decode steps of
    their greedy tokens: every step's logits within 1e-4 of transformers' on the whole
    sequence so far (the decode rows take the GEMV and one-kernel top-k forms)."""
    from hyla.models.runner import SequenceRunner

    hf, model = pair
    gen = torch.Generator().manual_seed(1234)
    vocab = hf.config.text_config.vocab_size
    seqs = {i: torch.randint(3, vocab, (n,), generator=gen).tolist() for i, n in enumerate((3, 9))}
    runner = SequenceRunner(model, num_seqs=2, max_len=16)
    got = runner.step(seqs, all_logits=True)
    for step in range(3):
        for i, ids in seqs.items():
            want = hf(torch.tensor([ids])).logits[0].float()
            logits = got[i] if step == 0 else got[i][None]
            err = (logits - want[-logits.shape[0] :]).abs().max().item()
            assert err <= 1e-4, (step, i, err)
        if step == 2:
            break
        nxt = {i: int((got[i] if step else got[i][-1]).argmax()) for i in seqs}
        for i, t in nxt.items():
            seqs[i] = seqs[i] + [t]
        got = runner.step({i: [t] for i, t in nxt.items()})
    assert set(kernel_calls) == {"hc_pre_norm", "hc_expand", "write_pool_keys",
                                 "kpool_indexer_topk", "moe_gemv"}  # fmt: skip
