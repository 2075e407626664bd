"""Incremental detokenization and stop strings. Oracle: one full `tokenizer.decode` of prompt +
output, minus the decoded prompt."""

from __future__ import annotations

import pytest

from hyla.engine.detokenizer import IncrementalDetokenizer
from hyla.request import SamplingParams
from tests.engine.tiny_tokenizer import build_tokenizer

TEXTS = ["héllo wörld 世界 🙂 the quick fox", "naïve café: こんにちは, hello hyla ###"]


@pytest.fixture(scope="module", params=[False, True], ids=["metaspace", "byte_level"])
def tok(request):
    return build_tokenizer(byte_level=request.param)


def oracle(tok, prompt, output, skip=True):
    full = tok.decode(prompt + output, skip_special_tokens=skip)
    head = tok.decode(prompt, skip_special_tokens=skip)
    assert full.startswith(head)
    return full[len(head) :]


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_equals_full_decode(tok, text):
    prompt = tok.encode("the lazy dog")
    output = tok.encode(text)
    d = IncrementalDetokenizer(tok, prompt, SamplingParams())
    for i, t in enumerate(output):
        d.update([t])
        partial = oracle(tok, prompt, output[: i + 1])
        assert partial.startswith(d.text) or "\ufffd" in partial
        assert "\ufffd" not in d.text
    assert d.text == oracle(tok, prompt, output)


def test_special_tokens_skipped_or_kept(tok):
    prompt = tok.encode("hello")
    output = tok.encode(" world") + [tok.eos_token_id]
    d = IncrementalDetokenizer(tok, prompt, SamplingParams())
    d.update(output)
    assert "</s>" not in d.text
    keep = IncrementalDetokenizer(tok, prompt, SamplingParams(skip_special_tokens=False))
    keep.update(output)
    assert keep.text.endswith("</s>")


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_cuts_text(tok, include):
    prompt = tok.encode("hello")
    output = tok.encode(" the quick brown fox jumps over")
    params = SamplingParams(stop=["fox", "zebra"], include_stop_str_in_output=include)
    d = IncrementalDetokenizer(tok, prompt, params)
    full = oracle(tok, prompt, output)
    cut = full.index("fox") + (3 if include else 0)
    visible = []
    matched = None
    for t in output:
        matched = d.update([t])
        visible.append(d.visible_text(finished=matched is not None))
        if matched:
            break
    assert matched == "fox"
    assert d.text == full[:cut]
    for v in visible[:-1]:
        assert d.text.startswith(v) and "fox" not in v  # hold-back: never shows the stop string
    assert d.update(tok.encode(" more")) is None and d.text == full[:cut]


def test_stop_string_spanning_tokens(tok):
    prompt = tok.encode("x")
    output = tok.encode(" STOP there!")
    d = IncrementalDetokenizer(tok, prompt, SamplingParams(stop=["P th"]))
    stops = [d.update([t]) for t in output]
    assert "P th" in stops
    assert d.text == oracle(tok, prompt, output).split("P th")[0]


def test_no_tokenizer_is_silent():
    d = IncrementalDetokenizer(None, [1, 2], SamplingParams())
    assert d.update([3, 4]) is None and d.text == "" and d.visible_text(True) == ""
