"""Each rank reads only its slices of the checkpoint, and they are the right ones.

Oracle: the full model loaded by the single-device loader (`load_model`). For every rank of
TP=2 and TP=4 (and EP), every sharded tensor's local ranges equal the same ranges of the full
tensor and every replicated tensor equals it whole; the elements read from the safetensors
files (counted at `get_slice(...)[...]`) are exactly the rank's own, fewer than the model's.
No process group is needed: loading runs no collective.
"""

from __future__ import annotations

import pytest
import torch

from hyla.distributed.groups import TPGroup
from hyla.distributed.loader import load_rank_model
from hyla.distributed.sharding import shard_of
from hyla.models.checkpoint import targets_of
from hyla.models.loader import load_config, load_model
from tests.hf_tiny import save_tiny_hf_model

CASES = [("kimi_linear", 2, False), ("deepseek_v32", 4, True), ("qwen3_next", 2, True)]


class CountingSlices:
    """Wraps safetensors' `safe_open` and counts the elements read through slices."""

    def __init__(self, real) -> None:
        self.real, self.read, self.whole_reads = real, 0, 0

    def __call__(self, *args, **kwargs):
        handle = self.real(*args, **kwargs)
        counter = self

        class Handle:
            def __enter__(self):
                handle.__enter__()
                return self

            def __exit__(self, *exc):
                return handle.__exit__(*exc)

            def get_slice(self, name):
                sl = handle.get_slice(name)

                class Slice:
                    def __getitem__(self, index):
                        t = sl[index]
                        counter.read += t.numel()
                        return t

                return Slice()

            def get_tensor(self, name):
                counter.whole_reads += 1
                return handle.get_tensor(name)

        return Handle()


@pytest.mark.parametrize("family,tp,ep", CASES, ids=[f"{f}-tp{n}-ep{e}" for f, n, e in CASES])
def test_each_rank_holds_and_reads_only_its_slices(tmp_path, monkeypatch, family, tp, ep):
    save_tiny_hf_model(family, tmp_path)
    config = load_config(tmp_path).replace(dtype="float32")
    full, _ = targets_of(load_model(str(tmp_path), dtype="float32", progress=False))
    import hyla.distributed.loader as loader

    for rank in range(tp):
        counting = CountingSlices(loader.safe_open)
        monkeypatch.setattr(loader, "safe_open", counting)
        local, _ = targets_of(load_rank_model(tmp_path, config, TPGroup(rank, tp), ep))
        monkeypatch.undo()
        assert counting.whole_reads == 0
        assert (
            counting.read
            == sum(t.numel() for t in local.values())
            < sum(t.numel() for t in full.values())
        )
        for name, tensor in local.items():
            shard = shard_of(name, config, rank, tp, ep)
            if shard is None:
                assert torch.equal(tensor, full[name]), name
                continue
            pos = 0
            for (lo, hi), size in zip(shard.ranges(), shard.local_sizes(), strict=True):
                got = tensor.narrow(shard.dim, pos, hi - lo)
                assert torch.equal(got, full[name].narrow(shard.dim, lo, hi - lo)), name
                pos += size
