"""`hyla.ops.greedy.reference.greedy_logprobs` (what every plain greedy row reports) against the
definition written out: the first maximum, and log_softmax at it."""

from __future__ import annotations

import pytest
import torch

from hyla.ops.greedy import greedy_logprobs
from tests.gpu.test_greedy_gpu import greedy_cases


def test_greedy_is_first_argmax_and_its_log_softmax() -> None:
    x = greedy_cases(300).double()
    tokens, logprobs = greedy_logprobs(x.float())
    for row, (t, lp) in enumerate(zip(tokens.tolist(), logprobs.tolist(), strict=True)):
        r = x[row]
        if torch.isnan(r).any():
            assert t == int(torch.isnan(r).nonzero()[0]) and lp != lp
            continue
        assert t == int((r == r.max()).nonzero()[0])
        want = float(r[t] - torch.logsumexp(r, 0)) if r.max() > float("-inf") else float("nan")
        assert (lp != lp and want != want) or abs(lp - want) <= 1e-5 * max(1.0, abs(want))


def test_bad_logits_name_the_argument() -> None:
    for bad in (torch.zeros(2, 3, dtype=torch.float64), torch.zeros(3), torch.zeros(2, 0)):
        with pytest.raises(ValueError, match="logits"):
            greedy_logprobs(bad)
