"""N-gram prompt lookup against a brute-force oracle: every earlier occurrence of every
suffix length, the longest suffix and the latest occurrence winning."""

from __future__ import annotations

import random

import pytest

from hyla.spec.ngram import propose_ngram


def brute_force(tokens: list[int], k: int, lo: int, hi: int) -> list[int]:
    for n in range(hi, lo - 1, -1):
        if n >= len(tokens):
            continue
        tail = tokens[-n:]
        starts = [s for s in range(len(tokens) - n) if tokens[s : s + n] == tail]
        if starts:
            s = max(starts)
            return tokens[s + n : s + n + k]
    return []


@pytest.mark.parametrize(
    ("tokens", "k", "lo", "hi", "want"),
    [
        ([1, 2, 3, 4, 5, 1, 2, 3], 2, 1, 3, [4, 5]),  # trigram found: what followed it
        ([1, 2, 3, 4, 5, 1, 2, 3], 9, 1, 3, [4, 5, 1, 2, 3]),  # fewer than k left
        ([9, 1, 2, 3, 4, 1, 2, 3], 2, 3, 3, [4, 1]),
        ([1, 2, 3], 2, 1, 3, []),  # no earlier occurrence
        ([5, 5, 5], 3, 1, 2, [5]),  # overlapping occurrence
        ([7, 1, 8, 1], 2, 2, 3, []),  # the unigram would match, below prompt_lookup_min
        ([7, 1, 8, 1], 2, 1, 3, [8, 1]),
        ([4], 3, 1, 3, []),
        ([1, 2, 1, 2], 0, 1, 2, []),
    ],
    ids=[
        "trigram",
        "short-tail",
        "exact-n",
        "none",
        "overlap",
        "below-min",
        "unigram",
        "one",
        "k0",
    ],  # fmt: skip
)
def test_cases(tokens, k, lo, hi, want):
    assert propose_ngram(tokens, k, lo, hi) == want


def test_latest_longest_match_equals_brute_force():
    rng = random.Random(0)
    for _ in range(400):
        tokens = [rng.randrange(4) for _ in range(rng.randrange(1, 30))]
        lo = rng.randrange(1, 4)
        hi = rng.randrange(lo, 6)
        k = rng.randrange(0, 5)
        want = brute_force(tokens, k, lo, hi) if k else []
        assert propose_ngram(tokens, k, lo, hi) == want, (tokens, k, lo, hi)
