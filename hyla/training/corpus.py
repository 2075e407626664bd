"""Token data for the default model: tokenized stdlib splits (`<|endoftext|>` + module source, one
uint16 stream per split), random windows, and seeded synthetic retrieval documents."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hyla.training.stdlib_data import iter_modules, read_source

NAME_WORDS = (
    "SECRET", "KEY", "MAGIC", "TOKEN", "PORT", "LIMIT", "OFFSET", "SEED", "BUFFER", "MAX", "MIN",
    "DEFAULT", "TIMEOUT", "CODE", "HASH", "VALUE", "SIZE", "COUNT", "FLAG", "MODE", "LEVEL",
    "RETRY", "BASE", "CACHE", "BLOCK", "INDEX", "PAGE", "USER", "GROUP", "MASK",
)  # fmt: skip


def tokenize_split(tokenizer, split: str, root: Path | None = None) -> tuple[np.ndarray, list]:
    """Tokenize `split`. Returns (tokens [total] uint16, [(name, start, tokens, bytes)])."""
    names, texts = [], []
    for name, path in iter_modules(root, split=split):
        text = read_source(path)
        if text and text.strip():
            names.append(name)
            texts.append(text)
    encodings = tokenizer.encode_batch(texts)
    docs, parts, offset = [], [], 0
    for name, text, enc in zip(names, texts, encodings, strict=True):
        ids = np.asarray(enc.ids, dtype=np.uint16)
        docs.append((name, offset, len(ids), len(text.encode("utf-8"))))
        parts.append(ids)
        offset += len(ids)
    return np.concatenate(parts), docs


def save_split(out_dir: Path, split: str, tokens: np.ndarray, docs: list) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    np.save(out_dir / f"{split}_tokens.npy", tokens)
    (out_dir / f"{split}_docs.json").write_text(json.dumps(docs))


def load_split(data_dir: Path, split: str) -> tuple[np.ndarray, list]:
    tokens = np.load(data_dir / f"{split}_tokens.npy")
    docs = json.loads((data_dir / f"{split}_docs.json").read_text())
    return tokens, docs


def _windows(tokens: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
    return tokens[starts[:, None] + np.arange(length)].astype(np.int64)


def sample_windows(tokens: np.ndarray, n: int, length: int, rng: np.random.Generator) -> np.ndarray:
    """`n` random windows of `length` tokens. Returns [n, length] int64."""
    return _windows(tokens, rng.integers(0, len(tokens) - length, size=n), length)


def doc_start_windows(
    tokens: np.ndarray, docs: list, n: int, length: int, rng: np.random.Generator
) -> np.ndarray:
    """`n` windows [n, length] int64, each starting at a random document's leading <eos>."""
    picks = rng.integers(0, len(docs), size=n)
    starts = [min(int(docs[i][1]), len(tokens) - length) for i in picks]
    return _windows(tokens, np.asarray(starts, dtype=np.int64), length)


@dataclass
class RetrievalDoc:
    ids: list[int]
    answer_spans: list[tuple[int, int]]


class RetrievalDocs:
    """Key-value retrieval documents over real code: `NAME = 48213` within the first ~64 tokens,
    `assert NAME == 48213` in the second half."""

    def __init__(self, tokenizer, tokens: np.ndarray, docs: list, eos_id: int) -> None:
        self.tokenizer = tokenizer
        self.tokens = tokens
        self.docs = [d for d in docs if d[2] > 64]
        self.eos_id = eos_id

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def _code(self, rng: random.Random, n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            _, start, size, _ = self.docs[rng.randrange(len(self.docs))]
            take = min(size - 1, n - len(out))
            out.extend(self.tokens[start + 1 : start + 1 + take].tolist())
            out.extend(self._encode("\n\n"))
        return out[:n]

    @staticmethod
    def random_pair(rng: random.Random) -> tuple[str, str]:
        words = rng.sample(NAME_WORDS, rng.randint(1, 2))
        name = "_".join(words) + f"_{rng.randrange(100)}"
        return name, str(rng.randrange(100_000))

    def make(
        self, rng: random.Random, length: int, num_keys: int, spread: bool = False
    ) -> RetrievalDoc:
        """`length` tokens asking each of `num_keys` constants once (`spread`: anywhere after)."""
        pairs: dict[str, str] = {}
        while len(pairs) < num_keys:
            name, value = self.random_pair(rng)
            pairs[name] = value
        lead = self._code(rng, rng.randrange(0, 32))
        lead = lead[: max(0, len(lead) - 1)]
        header = "".join(f"{k} = {v}\n" for k, v in pairs.items())
        ids = [self.eos_id] + lead + self._encode("\n" + header + "\n")
        asks = list(pairs.items())
        rng.shuffle(asks)
        spans = []
        if spread:
            lo = min(len(ids) + 2, length - 25)
            targets = sorted(rng.randrange(lo, length - 24) for _ in asks)
        for i, (name, value) in enumerate(asks):
            target = targets[i] if spread else rng.randrange(length // 2, length - 24)
            if target > len(ids):
                ids += self._code(rng, target - len(ids))
            prefix = self._encode(f"\nassert {name} ==")
            answer = self._encode(f" {value}")
            ids += prefix
            spans.append((len(ids), len(ids) + len(answer)))
            ids += answer + self._encode("\n")
        if len(ids) < length:
            ids += self._code(rng, length - len(ids))
        spans = [s for s in spans if s[1] <= length]
        return RetrievalDoc(ids[:length], spans)

    def eval_prompt(self, rng: random.Random, length: int) -> tuple[list[int], str]:
        """A ~`length`-token prompt: constant, code, `assert NAME ==`. Returns (ids, value)."""
        name, value = self.random_pair(rng)
        head = [self.eos_id] + self._encode(f"{name} = {value}\n\n")
        tail = self._encode(f"\nassert {name} ==")
        body = self._code(rng, max(0, length - len(head) - len(tail)))
        return head + body + tail, value
