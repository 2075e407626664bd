"""The fla wrapper hands every layer of a step the same int64 cu_seqlens tensors (fla memoizes its
chunk plan by tensor identity), and never a stale copy for a new step's tensor."""

import gc

import torch

from hyla.ops.kda.kernels import _VarlenOffsets


def test_same_step_tensor_gives_the_same_objects():
    offsets = _VarlenOffsets()
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    first = offsets(cu)
    assert first[0].dtype == first[1].dtype == torch.int64
    assert first[0].tolist() == first[1].tolist() == [0, 3, 7]
    second = offsets(cu)
    assert second[0] is first[0] and second[1] is first[1]


def test_a_new_step_tensor_is_converted_again():
    offsets = _VarlenOffsets()
    old = torch.tensor([0, 3, 7], dtype=torch.int32)
    first = offsets(old)
    del old
    gc.collect()
    new = torch.tensor([0, 5, 6], dtype=torch.int32)  # may reuse the freed tensor's id
    second = offsets(new)
    assert second[0] is not first[0]
    assert second[0].tolist() == second[1].tolist() == [0, 5, 6]
