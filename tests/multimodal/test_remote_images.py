"""http(s) image URLs under `allowed_media_domains`, against a local HTTP server (127.0.0.1; no
outside network): fetched from a listed host only, redirects checked hop by hop, the body cut
at max_image_bytes (413), the whole fetch bounded by media_fetch_timeout, failures a 400 naming
the field. Oracle: the same PNG decoded from its bytes directly."""

from __future__ import annotations

import gzip
import io
import threading
import time
import tracemalloc
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from hyla.config import ConfigError, EngineConfig
from hyla.multimodal.media import MediaOptions, MediaTooLargeError, load_image_url
from hyla.request import InvalidRequestError


def _png(size=(8, 6), seed=0) -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


PNG, BIG = _png(), _png((64, 64), seed=1)
BOMB = gzip.compress(gzip.compress(bytes(100 << 20), 1), 9)  # ~2 KB on the wire, 100 MiB decoded


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:  # keep the test output clean
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        routes = {
            "/cat.png": lambda: self._send(200, PNG),
            "/big.png": lambda: self._send(200, BIG),
            "/chunked-big": lambda: self._send(200, BIG, length=False),
            "/missing.png": lambda: self._send(404, b"no"),
            "/hop": lambda: self._redirect("/cat.png"),
            "/away": lambda: self._redirect("http://localhost:1/cat.png"),
            "/loop": lambda: self._redirect("/loop"),
            "/slow": self._slow,
            "/bomb": lambda: self._send(200, BOMB, encoding="gzip, gzip"),
            "/identity": lambda: self._send(200, PNG, encoding="Identity"),
            "/blank-encoding": lambda: self._send(200, PNG, encoding=" "),
            "/drip": self._drip,
            "/bad-location": lambda: self._redirect("http://[::1/cat.png"),
            "/bad-host-location": lambda: self._redirect("http://[zzz]/cat.png"),
            "/to-data": lambda: self._redirect("data:image/png;base64,AAAA"),
            "/to-file": lambda: self._redirect("file:///etc/hostname"),
        }
        routes.get(self.path, lambda: self._send(404, b""))()

    def _send(self, status: int, body: bytes, length: bool = True, encoding: str = "") -> None:
        self.send_response(status)
        if encoding:
            self.send_header("Content-Encoding", encoding)
        if length:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _redirect(self, where: str) -> None:
        self.send_response(302)
        self.send_header("Location", where)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _slow(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(PNG)))
        self.end_headers()
        try:
            for i in range(0, len(PNG), 16):  # trickles for ~2 s
                self.wfile.write(PNG[i : i + 16])
                self.wfile.flush()
                time.sleep(2.0 * 16 / len(PNG))
        except (BrokenPipeError, ConnectionResetError):  # the client gave up: expected
            pass

    def _drip(self) -> None:  # a byte every 0.95 s: each read is within a 1 s timeout
        self.send_response(200)
        self.send_header("Content-Length", str(len(PNG)))
        self.end_headers()
        try:
            for i in range(4):
                self.wfile.write(PNG[i : i + 1])
                self.wfile.flush()
                time.sleep(0.95)
        except (BrokenPipeError, ConnectionResetError, OSError):  # the client gave up: expected
            pass


@pytest.fixture(scope="module")
def base():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _opts(domains=("127.0.0.1",), max_bytes=2000, timeout=5.0) -> MediaOptions:
    return MediaOptions(max_bytes, 10_000, None, tuple(domains), timeout)


def test_an_allowed_host_is_fetched_and_decoded(base):
    from PIL import Image

    got = load_image_url(f"{base}/cat.png", "f", _opts())
    want = Image.open(io.BytesIO(PNG))
    assert got.size == want.size and np.array_equal(np.asarray(got), np.asarray(want))
    assert load_image_url(f"{base}/hop", "f", _opts()).size == want.size  # same-host redirect
    for path in ("/identity", "/blank-encoding"):  # no content coding, spelled out or blank
        assert load_image_url(f"{base}{path}", "f", _opts()).size == want.size


@pytest.mark.parametrize(
    "path,opts,error,says",
    [
        ("/cat.png", _opts(domains=()), InvalidRequestError, "remote image fetch is disabled"),
        ("/cat.png", _opts(domains=("example.com",)), InvalidRequestError, "not in the allowed"),
        ("/away", _opts(), InvalidRequestError, "'localhost' is not in the allowed"),
        ("/loop", _opts(), InvalidRequestError, "more than 3 redirects"),
        ("/missing.png", _opts(), InvalidRequestError, "HTTP 404"),
        ("/big.png", _opts(), MediaTooLargeError, "max_image_bytes"),
        ("/chunked-big", _opts(), MediaTooLargeError, "max_image_bytes"),
        ("/slow", _opts(timeout=0.5), InvalidRequestError, "media_fetch_timeout|timed out"),
    ],
)
def test_refusals_name_the_field_and_the_limit(base, path, opts, error, says):
    t0 = time.monotonic()
    with pytest.raises(error, match=says) as e:
        load_image_url(f"{base}{path}", "messages[0].content[1].image_url", opts)
    assert e.value.field == "messages[0].content[1].image_url"
    assert time.monotonic() - t0 < 3.0  # the slow body is cut, not waited for


def test_domains_option_forms():
    assert EngineConfig(allowed_media_domains="A.example, b.example").allowed_media_domains == (
        "a.example", "b.example")  # fmt: skip
    assert EngineConfig(allowed_media_domains=["x.org"]).allowed_media_domains == ("x.org",)
    for bad in ("https://x.org", "x.org:8080", "*.x.org"):
        with pytest.raises(ConfigError, match="allowed_media_domains"):
            EngineConfig(allowed_media_domains=bad)
    with pytest.raises(ConfigError, match="media_fetch_timeout"):
        EngineConfig(media_fetch_timeout=0)


@pytest.mark.parametrize("bad", [float("inf"), 1e300, float("nan"), True, "5"])
def test_a_timeout_no_socket_takes_is_refused_at_startup(bad):
    """inf / 1e300 passed `> 0` and then every remote image request ended in a 500
    (OverflowError from the socket's timeout); a bool is no number of seconds."""
    with pytest.raises(ConfigError, match="media_fetch_timeout"):
        EngineConfig(media_fetch_timeout=bad)


def test_a_compression_bomb_is_not_decoded(base):
    """A 2 KB body sent with `Content-Encoding: gzip, gzip` decodes to 100 MiB: the fetch must
    refuse it without ever holding much more than max_image_bytes (oracle: tracemalloc's peak)."""
    tracemalloc.start()
    try:
        with pytest.raises((InvalidRequestError, MediaTooLargeError)) as e:
            load_image_url(f"{base}/bomb", "f", _opts())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert e.value.field == "f"
    assert peak < 16 << 20, f"peak {peak >> 20} MiB while fetching a 2 KB body"


def test_the_timeout_bounds_a_drip_fed_body(base):
    """Every read of /drip comes within the 1 s timeout, but the whole fetch may not take more."""
    t0 = time.monotonic()
    with pytest.raises(InvalidRequestError, match="media_fetch_timeout|timed out"):
        load_image_url(f"{base}/drip", "f", _opts(timeout=1.0))
    assert time.monotonic() - t0 < 1.5  # 1.9 s before: the third byte's read ended it


@pytest.mark.parametrize(
    "url",
    [
        "http://evil.example\t@127.0.0.1/cat.png",
        "http://127.0.0.1/a\x00b.png",
        "http://[::1/cat.png",
        "http://[zzz]/cat.png",
        "{base}/bad-location",
        "{base}/bad-host-location",
        "{base}/to-data",
        "{base}/to-file",
    ],
)
@pytest.mark.parametrize("domains", [("127.0.0.1",), ()])
def test_a_malformed_url_is_a_400(base, url, domains):
    """URLs that urllib or httpx cannot parse, given or in a redirect's Location (500 before),
    and redirects to data: (500 before: httpx's InvalidURL) or file: URLs."""
    with pytest.raises(InvalidRequestError) as e:
        load_image_url(url.format(base=base), "f", _opts(domains=domains))
    assert e.value.field == "f"
