"""The one-pass greedy kernel (`hyla.ops.greedy.kernels`) against `reference.greedy_logprobs`
(torch.argmax + log_softmax) on the same device: tokens equal, logprobs within a few ulp (the
fp32 sum of exponentials in another order), NaN where the reference gives NaN. `check_greedy`
takes a device: test_greedy_interpret.py runs it on CPU tensors under TRITON_INTERPRET=1."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def greedy_cases(vocab: int) -> torch.Tensor:
    """[8, vocab] float32 rows: random; ties everywhere (first maximum wins); the maximum in the
    last block; a tie between blocks; a NaN; every entry -inf; some -inf; large magnitudes."""
    gen = torch.Generator().manual_seed(vocab)
    x = torch.randn(8, vocab, generator=gen) * 3
    x[1] = torch.tensor([0.0, 1.0])[torch.randint(0, 2, (vocab,), generator=gen)]
    x[2, -1] = 100.0
    x[3, min(1, vocab - 1)] = 50.0
    x[3, max(0, vocab - 2)] = 50.0
    x[4, vocab // 2] = float("nan")
    x[5] = float("-inf")
    x[6, ::3] = float("-inf")
    x[7] *= 1e4
    return x


def check_greedy(vocab: int, device) -> None:
    from hyla.ops.greedy import kernels, reference

    x = greedy_cases(vocab).to(device)
    want_tok, want_lp = reference.greedy_logprobs(x)
    got_tok, got_lp = kernels.greedy_logprobs(x)
    assert got_tok.dtype == torch.int64 and got_lp.dtype == torch.float32
    assert torch.equal(got_tok, want_tok), (got_tok, want_tok)
    torch.testing.assert_close(got_lp, want_lp, rtol=1e-5, atol=1e-5, equal_nan=True)
    strided = greedy_cases(vocab).to(device)[::2]  # rows apart in memory
    assert torch.equal(kernels.greedy_logprobs(strided)[0], reference.greedy_logprobs(strided)[0])


@pytest.mark.parametrize("vocab", [1, 7, 4096, 32000, 151936])
def test_greedy_matches_reference(vocab: int) -> None:
    check_greedy(vocab, "cuda")


def test_greedy_rejects_bad_logits() -> None:
    from hyla.ops.greedy import kernels

    cuda = {"device": "cuda"}
    bad = [torch.zeros(2, 3, **cuda).half(), torch.zeros(3, **cuda), torch.zeros(2, 0, **cuda),
           torch.zeros(3, 2, **cuda).t()]  # fmt: skip
    for x in bad:
        with pytest.raises(ValueError, match="logits"):
            kernels.greedy_logprobs(x)
