"""The plain parts of the image path, without a model: prefix-cache keys of image blocks,
the encoder budget, the encoder cache's references, data-URL decoding and its limits."""

from __future__ import annotations

import base64
import io

import pytest
import torch

from hyla.cache.mm_spans import ImageSpan
from hyla.cache.prefix import request_block_hashes
from hyla.multimodal.budget import EncoderBudget
from hyla.multimodal.encoder_cache import EncoderCache
from hyla.multimodal.media import MediaOptions, MediaTooLargeError, load_image_url
from hyla.request import InvalidRequestError, Request, SamplingParams

IDS = [7] * 4 + [250] * 8 + [9] * 6  # text 0-3, image 4-11, text 12-17


def _request(spans, rid="r", ids=IDS) -> Request:
    return Request(rid, ids, SamplingParams(), mm_spans=tuple(spans))


def test_block_keys_carry_the_image_hash_of_the_blocks_it_covers():
    """Blocks of 4: block 0 is text (equal keys), blocks 1-2 hold the image (keys differ by
    image), block 3 follows it (differs through the chain)."""
    a = request_block_hashes([], _request([ImageSpan(4, 8, "x")]), 4)
    b = request_block_hashes([], _request([ImageSpan(4, 8, "y")]), 4)
    same = request_block_hashes([], _request([ImageSpan(4, 8, "x")], "other"), 4)
    plain = request_block_hashes([], _request([]), 4)
    assert a == same
    assert a[0] == b[0] == plain[0]
    assert all(x != y for x, y in zip(a[1:], b[1:], strict=True))
    assert all(x != y for x, y in zip(a[1:], plain[1:], strict=True))


def test_encoder_budget_pays_each_image_once_per_step_and_cuts_before_the_unpaid():
    cached: set[str] = set()
    budget = EncoderBudget(10, cached.__contains__)
    two = _request([ImageSpan(4, 8, "x"), ImageSpan(13, 3, "y")], ids=[1] * 20)
    assert budget.fit(two, 20) == 13  # x paid (8), y (3) does not fit: stop before it
    assert budget.fit(_request([ImageSpan(4, 8, "x")], "s"), 18) == 18  # x already planned
    budget.reset()
    cached.add("x")
    assert budget.fit(two, 20) == 20  # x cached, y paid
    mid = _request([ImageSpan(4, 12, "z")], ids=[1] * 20)
    mid.num_computed_tokens = 8  # a prefix hit inside z, which the budget cannot pay
    assert budget.fit(mid, 10) == 0


def test_encoder_cache_keeps_an_entry_while_a_request_holds_it():
    cache = EncoderCache()
    rows = torch.zeros(3, 4)
    cache.put("x", "a", rows)
    assert cache.get("x", "b") is rows and cache.stats.num_hits == 1
    cache.release("a", "x")
    assert "x" in cache
    cache.release("b")
    assert "x" not in cache and cache.num_entries == 0 and not cache._held
    cache.release("nobody")


def _png(size=(8, 8)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, (10, 20, 30)).save(buf, format="PNG")
    return buf.getvalue()


def _url(raw: bytes, media="image/png") -> str:
    return f"data:{media};base64," + base64.b64encode(raw).decode()


def test_data_urls_decode_and_limits_name_the_field(tmp_path):
    opts = MediaOptions(max_image_bytes=1000, max_image_pixels=100)
    assert load_image_url(_url(_png()), "f", opts).size == (8, 8)
    with pytest.raises(MediaTooLargeError, match="max_image_bytes"):
        load_image_url(_url(b"x" * 2000), "f", opts)
    with pytest.raises(InvalidRequestError, match="max_image_pixels"):
        load_image_url(_url(_png((20, 20))), "f", opts)
    with pytest.raises(InvalidRequestError, match="undecodable"):
        load_image_url(_url(b"\x89PNG garbage"), "f", opts)
    with pytest.raises(InvalidRequestError, match="remote image fetch is disabled"):
        load_image_url("http://example.com/a.png", "f", opts)
    path = tmp_path / "a.png"
    path.write_bytes(_png())
    with pytest.raises(InvalidRequestError, match="allowed-local-media-path"):
        load_image_url(path.as_uri(), "f", opts)
    allowed = MediaOptions(1000, 100, str(tmp_path))
    assert load_image_url(path.as_uri(), "f", allowed).size == (8, 8)
    with pytest.raises(InvalidRequestError, match="not a file under"):
        load_image_url((tmp_path / ".." / "x.png").resolve().as_uri(), "f", allowed)
