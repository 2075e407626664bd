"""Reference implementations the precision check compares hyla's engine against.

`transformers` on the same checkpoint for a supported Hugging Face family; for hyla's own
layout (no `transformers` twin) the model's one-shot full-sequence forward in float32
(`SequenceRunner`, no chunking, no prefix cache, no batching), which checks the serving path
(chunked prefill, paged cache, state slots, batching) against the plain forward.
"""

from __future__ import annotations

from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HFReference:
    """`transformers` AutoModelForCausalLM of a checkpoint, eager attention."""

    def __init__(self, path: str | Path, dtype: str, device: str) -> None:
        from transformers import AutoModelForCausalLM

        self.name = f"transformers ({dtype})"
        self.device = device
        self.model = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=DTYPES[dtype], attn_implementation="eager"
        ).to(device).eval()  # fmt: skip

    @torch.no_grad()
    def logprobs(self, ids: list[int]) -> torch.Tensor:
        """log-softmax float32 `[T, V]`: row j is the distribution of token j + 1."""
        logits = self.model(torch.tensor([ids], device=self.device)).logits[0]
        return torch.log_softmax(logits.float(), dim=-1).cpu()

    @torch.no_grad()
    def greedy(self, ids: list[int], num_tokens: int) -> list[int]:
        out = list(ids)
        for _ in range(num_tokens):  # no EOS stop, like hyla's ignore_eos
            out.append(int(self.logprobs(out)[-1].argmax()))
        return out[len(ids) :]


class NativeReference:
    """hyla's model of a native-layout checkpoint, one packed forward over the whole sequence."""

    def __init__(self, path: str | Path, dtype: str, device: str) -> None:
        from hyla.models.loader import load_model

        self.name = f"hyla one-shot forward ({dtype}; no transformers twin for this layout)"
        self.model = load_model(path, dtype=dtype, device=device, progress=False)

    def logprobs(self, ids: list[int]) -> torch.Tensor:
        from hyla.models.runner import SequenceRunner

        runner = SequenceRunner(self.model, num_seqs=1, max_len=len(ids), poison=False)
        logits = runner.step({0: ids}, all_logits=True)[0]
        return torch.log_softmax(logits.float(), dim=-1).cpu()

    def greedy(self, ids: list[int], num_tokens: int) -> list[int]:
        out = list(ids)
        for _ in range(num_tokens):
            out.append(int(self.logprobs(out)[-1].argmax()))
        return out[len(ids) :]


def load_reference(path: str | Path, dtype: str, device: str) -> HFReference | NativeReference:
    """The reference of the checkpoint at `path` (see the module docstring)."""
    from hyla.models.loader import load_config

    if load_config(path).architecture == "hyla":
        return NativeReference(path, dtype, device)
    return HFReference(path, dtype, device)
