"""Evaluation measures of the default model: bits per byte and key-value retrieval."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F


def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars, n = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def token_byte_lengths(tokenizer_json: Path) -> torch.Tensor:
    """UTF-8 bytes of each token id ([V] int64; 0 for special tokens)."""
    data = json.loads(Path(tokenizer_json).read_text())
    decoder = _byte_decoder()
    vocab: dict[str, int] = data["model"]["vocab"]
    special = {t["content"] for t in data.get("added_tokens", [])}
    lengths = torch.zeros(max(vocab.values()) + 1, dtype=torch.long)
    for token, idx in vocab.items():
        lengths[idx] = 0 if token in special else sum(1 for ch in token if ch in decoder)
    return lengths


def bits_per_byte(
    logits: torch.Tensor, targets: torch.Tensor, byte_lengths: torch.Tensor
) -> tuple[float, int]:
    """(bits, bytes) of CE over text targets; logits [T, V], targets [T], byte_lengths [V]."""
    nbytes = byte_lengths.to(targets.device)[targets]
    keep = nbytes > 0
    nats = F.cross_entropy(logits.float()[keep], targets[keep], reduction="sum")
    return float(nats) / math.log(2), int(nbytes[keep].sum())


def answer_correct(logits: torch.Tensor, answer_ids: list[int]) -> bool:
    """Greedy decoding reproduces `answer_ids`, given teacher-forced logits [len(answer_ids), V]."""
    predicted = logits.argmax(dim=-1).tolist()
    return predicted == list(answer_ids)
