"""Precision prompts: document QA, code, chat with a tokenizer; seeded random ids otherwise."""

from __future__ import annotations

import random
from typing import Any

_DOC = (
    "The lighthouse at Karst Point was built in {year} by the engineer {name}. It stands "
    "{height} metres tall and its lamp can be seen {range} kilometres out to sea. "
)
_CODE = '''def merge_intervals(intervals):
    """Merge overlapping [start, end] intervals and return them sorted."""
    intervals = sorted(intervals)
    merged = []
    for start, end in intervals:
        if merged and start <= merged[-1][1]:
'''
_CHAT = [
    ("user", "I am planning a trip to Lisbon in May. What should I pack?"),
    ("assistant", "Light layers, a rain jacket, and comfortable shoes for the hills."),
    ("user", "And which neighbourhood is best to stay in for a first visit?"),
]


def _document(num_facts: int) -> str:
    rng = random.Random(7)
    facts = [_DOC.format(year=1800 + rng.randrange(200), name=f"Engineer {i}",
                         height=20 + rng.randrange(60), range=10 + rng.randrange(40))
             for i in range(num_facts)]  # fmt: skip
    return "".join(facts) + "Question: how tall is the lighthouse at Karst Point? Answer:"


def _chat(tokenizer: Any) -> list[int]:
    messages = [{"role": r, "content": c} for r, c in _CHAT]
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    text = "".join(f"{r}: {c}\n" for r, c in _CHAT) + "assistant:"
    return tokenizer.encode(text)


def precision_samples(tokenizer: Any, vocab_size: int, max_tokens: int) -> list[tuple[str, list]]:
    """(name, token ids) of each sample, cut to its last `max_tokens` tokens."""
    if tokenizer is None:
        rng = random.Random(1234)
        lens = (max_tokens, max_tokens // 2 + 1, 7)
        return [(f"random-ids-{n}", [rng.randrange(3, vocab_size) for _ in range(n)])
                for n in lens]  # fmt: skip
    items = [
        ("long-document QA", tokenizer.encode(_document(max(2, max_tokens // 24)))),
        ("code completion", tokenizer.encode(_CODE)),
        ("multi-turn chat", _chat(tokenizer)),
    ]
    return [(name, ids[-max_tokens:]) for name, ids in items]
