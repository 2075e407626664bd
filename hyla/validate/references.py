"""Precision references: `transformers` on the same checkpoint, or for hyla's own layout the
one-shot float32 `SequenceRunner` forward (no chunking, prefix cache or batching)."""

from __future__ import annotations

from pathlib import Path

import torch

from hyla.validate.ties import IndexerTieProbe, Tie

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def transformers_class(path: str | Path):  # noqa: ANN201 - a transformers model class
    """The class `architectures` names (Auto misses e.g. GLM-5.3), else AutoModelForCausalLM."""
    import transformers

    from hyla.multimodal.inputs import read_config

    for name in read_config(path).get("architectures") or ():
        cls = getattr(transformers, name, None) if isinstance(name, str) else None
        if cls is not None and hasattr(cls, "from_pretrained"):
            return cls
    return transformers.AutoModelForCausalLM


class HFReference:
    def __init__(self, path: str | Path, dtype: str, device: str) -> None:
        self.name = f"transformers ({dtype})"
        self.device = device
        self.model = transformers_class(path).from_pretrained(
            str(path), dtype=DTYPES[dtype], attn_implementation="eager"
        ).to(device).eval()  # fmt: skip
        self.probe = IndexerTieProbe(self.model)
        self.last_tie: Tie | None = None

    @torch.no_grad()
    def logprobs(self, ids: list[int]) -> torch.Tensor:
        """log-softmax float32 `[T, V]` (row j: token j + 1); sets `last_tie` (`ties.py`)."""
        self.probe.reset()
        logits = self.model(torch.tensor([ids], device=self.device)).logits[0]
        self.last_tie = self.probe.first()
        return torch.log_softmax(logits.float(), dim=-1).cpu()

    @torch.no_grad()
    def greedy(self, ids: list[int], num_tokens: int) -> list[int]:
        out = list(ids)
        for _ in range(num_tokens):  # no EOS stop, like hyla's ignore_eos
            out.append(int(self.logprobs(out)[-1].argmax()))
        return out[len(ids) :]


class NativeReference:
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
    from hyla.models.loader import load_config

    if load_config(path).architecture == "hyla":
        return NativeReference(path, dtype, device)
    return HFReference(path, dtype, device)


class HFImageReference:
    """`transformers`' image-text model fed by the checkpoint's own AutoImageProcessor; `prepare`
    expands image tokens from the processor's grid (not hyla's code)."""

    def __init__(self, path: str | Path, dtype: str, device: str) -> None:
        from transformers import AutoModelForImageTextToText

        from hyla.multimodal.inputs import VisionSpec, load_image_processor, read_config

        self.name = f"transformers image-text model ({dtype})"
        self.device = device
        self.spec = VisionSpec.from_hf(read_config(path))
        self.processor = load_image_processor(path)
        self.model = AutoModelForImageTextToText.from_pretrained(
            str(path), dtype=DTYPES[dtype], attn_implementation="eager"
        ).to(device).eval()  # fmt: skip

    def prepare(self, ids: list[int], images: list) -> tuple[list[int], dict[str, torch.Tensor]]:
        inputs = self.processor(images=[i.convert("RGB") for i in images], return_tensors="pt")
        grid = inputs["image_grid_thw"]
        counts = iter((grid.prod(-1) // self.spec.merge_size**2).tolist())
        image = self.spec.image_token_id
        full = [t for i in ids for t in ([image] * next(counts) if i == image else [i])]
        return full, {"pixel_values": inputs["pixel_values"], "image_grid_thw": grid}

    @torch.no_grad()
    def logprobs(self, ids: list[int], images: dict[str, torch.Tensor]) -> torch.Tensor:
        """log-softmax float32 `[T, V]` of expanded `ids` with `images` from `prepare`."""
        types = torch.tensor([[int(t == self.spec.image_token_id) for t in ids]])
        kw = {k: v.to(self.device) for k, v in images.items()}
        logits = self.model(torch.tensor([ids], device=self.device),
                            mm_token_type_ids=types.to(self.device), **kw).logits[0]  # fmt: skip
        return torch.log_softmax(logits.float(), dim=-1).cpu()

    def greedy(self, ids: list[int], images: dict[str, torch.Tensor], num_tokens: int) -> list:
        """Greedy continuation without EOS stop, ended before an image token (no image for it)."""
        out = list(ids)
        for _ in range(num_tokens):
            token = int(self.logprobs(out, images)[-1].argmax())
            if token == self.spec.image_token_id:
                break
            out.append(token)
        return out[len(ids) :]
