"""`TierIO`'s copies bring blocks (bf16 and fp8 per-token tensors) and state rows back bit for
bit from the host tier (tensors) and the disk tier (sealed bytes), into other rows."""

from __future__ import annotations

import pytest
import torch

from hyla.cache.tiers import DiskTier, HostTier, Transfers
from hyla.engine.kv_offload import TierIO


def round_trip(device: torch.device, kind: str, tmp_path) -> None:
    tokens = [torch.randn(9, 16, 64, device=device, dtype=torch.bfloat16) for _ in range(3)]
    tokens.append(torch.randn(9, 16, 8, device=device).to(torch.float8_e4m3fn))
    states = [torch.randn(6, 4, 8, 8, device=device) for _ in range(2)]
    tier = HostTier(1 << 30) if kind == "host" else DiskTier(tmp_path, 1 << 30)
    io = TierIO(tokens, states, 2, [tier])
    keys = [bytes([k]) * 4 for k in range(5)]
    io(Transfers(spill_blocks=[(1, keys[0]), (2, keys[1]), (3, keys[2])],
                 spill_checkpoints=[(0, keys[3]), (1, keys[4])]))  # fmt: skip
    io(Transfers())  # the byte tiers are written from the last call's copies
    want = [t[1:4].clone() for t in tokens], [s[2:4].clone() for s in states]
    for t in tokens + states:
        t.view(torch.uint8).zero_()
    b = tier.holds_bytes
    io(Transfers(
        load_blocks=[(r, tier.get(k), b) for r, k in zip((4, 5, 6), keys[:3], strict=True)],
        load_checkpoints=[(c, tier.get(k), b) for c, k in zip((2, 3), keys[3:], strict=True)],
    ))  # fmt: skip
    if device.type == "cuda":
        torch.cuda.synchronize()
    for t, w in zip(tokens, want[0], strict=True):
        assert torch.equal(t[4:7].view(torch.uint8), w.view(torch.uint8))
    for s, w in zip(states, want[1], strict=True):
        assert torch.equal(s[4:6], w)


@pytest.mark.parametrize("kind", ["host", "disk"])
def test_round_trip_is_bit_exact(kind, tmp_path):
    round_trip(torch.device("cpu"), kind, tmp_path)
