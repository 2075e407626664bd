"""Token data for the default model: tokenized stdlib splits, packed windows, retrieval documents.

Documents are `<|endoftext|> + module source`, concatenated into one uint16 stream per split with
the start offset of each document. Training draws windows of L + 1 tokens from the train stream
(`sample_windows`) and mixes in synthetic long-range retrieval documents
(`RetrievalDocs.make`): a few constants defined near the top of a long file of real stdlib code,
asked for by `assert NAME == VALUE` lines in its second half. Everything is seeded.
"""

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
    """Tokenize every module of `split` ("train" | "heldout").

    Args:
        tokenizer: a `tokenizers.Tokenizer` whose post-processor prepends `<|endoftext|>`.
    Returns: (tokens [total] uint16, [(module name, start offset, length in tokens, bytes)]).
    """
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
    """`tokens[s : s + length]` for each of `starts` [n]. Returns [n, length] int64."""
    return tokens[starts[:, None] + np.arange(length)].astype(np.int64)


def sample_windows(tokens: np.ndarray, n: int, length: int, rng: np.random.Generator) -> np.ndarray:
    """`n` random windows of `length` tokens from the stream. Returns [n, length] int64."""
    return _windows(tokens, rng.integers(0, len(tokens) - length, size=n), length)


def doc_start_windows(
    tokens: np.ndarray, docs: list, n: int, length: int, rng: np.random.Generator
) -> np.ndarray:
    """`n` windows of `length` tokens that each start at a random document's leading <eos>
    (docs: the split's [name, start, size, ...] rows). Returns [n, length] int64."""
    picks = rng.integers(0, len(docs), size=n)
    starts = [min(int(docs[i][1]), len(tokens) - length) for i in picks]
    return _windows(tokens, np.asarray(starts, dtype=np.int64), length)


@dataclass
class RetrievalDoc:
    """A synthetic document: `ids` plus where each asked value starts and ends (token indices)."""

    ids: list[int]
    answer_spans: list[tuple[int, int]]


class RetrievalDocs:
    """Builds key-value retrieval documents over real code.

    Layout (token level, `length` tokens in all):

        <eos> [a few lines of code] NAME_A = 48213\\n NAME_B = 907\\n ... <code ... code>
              \\nassert NAME_B == 907\\n <code> \\nassert NAME_A == 48213\\n <code ...>

    The definitions sit within the first ~64 tokens; the asserts fall in the second half, so
    the answer is always hundreds of tokens back, past any local pattern.
    """

    def __init__(self, tokenizer, tokens: np.ndarray, docs: list, eos_id: int) -> None:
        self.tokenizer = tokenizer
        self.tokens = tokens
        self.docs = [d for d in docs if d[2] > 64]
        self.eos_id = eos_id

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def _code(self, rng: random.Random, n: int) -> list[int]:
        """About `n` tokens of real code: whole modules (their leading <eos> dropped)."""
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
        """One document of exactly `length` tokens with `num_keys` constants, each asked once.

        Asks fall in the second half of the document, or with `spread` anywhere after the
        definitions (short and long distances alike)."""
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
        """A prompt of about `length` tokens: one constant at the top, real code, then
        `assert NAME ==` at the end. Returns (prompt ids, the expected value text)."""
        name, value = self.random_pair(rng)
        head = [self.eos_id] + self._encode(f"{name} = {value}\n\n")
        tail = self._encode(f"\nassert {name} ==")
        body = self._code(rng, max(0, length - len(head) - len(tail)))
        return head + body + tail, value
