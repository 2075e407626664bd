"""Batch transparency of the CPU projections (invariant I3, bit for bit): a row's result from
`prepacked_linear` does not depend on how many rows share the call, where it sits among them, or
the number of torch threads. The oracle is each row computed alone on one thread.

`F.linear` (MKL) fails this on the CPUs we run (a row rounds differently among 1, 2-3 and 4+
rows), which made a request's logprobs depend on its batch neighbours (issue 16, item 0)."""

from __future__ import annotations

import pytest
import torch

from hyla.ops.linear import Prepacked, prepacked_linear
from hyla.ops.linear.cpu import ONEDNN

pytestmark = pytest.mark.skipif(not ONEDNN, reason="torch without oneDNN's linear ops")

ROW_COUNTS = (1, 2, 3, 4, 5, 7, 16, 17, 63, 64, 65, 130, 257, 300)


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("shape", [(64, 256), (256, 64), (512, 2048), (2048, 512)], ids=str)
def test_rows_equal_solo_rows_at_any_row_count_and_thread_count(shape, threads):
    d_in, d_out = shape
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(d_out, d_in, generator=g)
    bias = torch.randn(d_out, generator=g)
    x = torch.randn(310, d_in, generator=g)
    cache = Prepacked()
    with torch.no_grad():
        threads(1)
        solo = torch.cat([prepacked_linear(x[i : i + 1], weight, cache, bias) for i in range(310)])
        for num_threads in (1, 2, 3, 4):
            threads(num_threads)
            for rows in ROW_COUNTS:
                for offset in (0, 9):
                    got = prepacked_linear(x[offset : offset + rows], weight, cache, bias)
                    assert torch.equal(got, solo[offset : offset + rows]), (num_threads, rows)


def test_solo_rows_agree_with_the_reference_within_fp32_rounding():
    g = torch.Generator().manual_seed(1)
    weight, x = torch.randn(96, 80, generator=g), torch.randn(5, 80, generator=g)
    with torch.no_grad():
        got = prepacked_linear(x, weight, Prepacked())
    torch.testing.assert_close(got, (x.double() @ weight.double().T).float(), rtol=1e-5, atol=1e-5)
