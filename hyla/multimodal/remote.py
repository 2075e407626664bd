"""http(s) image URLs, only from `--allowed-media-domains` hosts (exact; each redirect checked),
cut at `max_image_bytes` and at `media_fetch_timeout` for the whole fetch (per-read timeouts let
a server drip bytes for ever); fetched uncompressed (nested gzip bombs)."""

from __future__ import annotations

import socket
import threading
import time
from urllib.parse import urljoin, urlparse

from hyla.request import InvalidRequestError

MAX_REDIRECTS = 3


class MediaTooLargeError(InvalidRequestError):
    """An encoded image is larger than `max_image_bytes`."""


class _Limits:
    def __init__(self, field: str, max_bytes: int, timeout: float) -> None:
        self.field, self.max_bytes, self.timeout = field, max_bytes, timeout
        self.deadline = time.monotonic() + timeout

    def left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise InvalidRequestError(
                self.field, f"image fetch took longer than {self.timeout:g} s (media_fetch_timeout)"
            )
        return left


def check_host(url: str, field: str, allowed: tuple[str, ...]) -> None:
    """Raise InvalidRequestError(field) unless `url` is http(s) to a host in `allowed`."""
    try:
        parsed = urlparse(url)
        host = (parsed.hostname or "").lower()
    except ValueError:  # e.g. a bracketed host that is no IP address: "http://[::1/"
        parsed, host = None, ""
    if parsed is None or parsed.scheme not in ("http", "https") or not host:
        raise InvalidRequestError(field, f"not an http(s) URL with a host: {url[:200]!r}")
    if not allowed:
        raise InvalidRequestError(
            field,
            "remote image fetch is disabled on this server (no --allowed-media-domains); send "
            "the image inline as a data:image/...;base64 URL",
        )
    if host not in allowed:
        raise InvalidRequestError(
            field, f"host {host!r} is not in the allowed media domains {list(allowed)}"
        )


def fetch_image_bytes(
    url: str, field: str, allowed: tuple[str, ...], max_bytes: int, timeout: float
) -> bytes:
    """The body at `url` (at most `max_bytes`), following at most MAX_REDIRECTS redirects to
    allowed hosts. Raises InvalidRequestError / MediaTooLargeError naming `field`."""
    import httpx

    limits = _Limits(field, max_bytes, timeout)
    for _ in range(MAX_REDIRECTS + 1):
        check_host(url, field, allowed)
        try:
            with httpx.Client(follow_redirects=False, trust_env=False) as client:
                with client.stream(
                    "GET", url, timeout=limits.left(), headers={"Accept-Encoding": "identity"}
                ) as response:
                    if response.is_redirect and "location" in response.headers:
                        url = urljoin(url, response.headers["location"])
                        continue
                    if response.status_code != 200:
                        raise InvalidRequestError(
                            field, f"image fetch failed: HTTP {response.status_code}"
                        )
                    return _read_body(response, limits)
        except httpx.TimeoutException:
            limits.left()  # names the limit when the deadline passed
            raise InvalidRequestError(field, "image fetch timed out") from None
        except (httpx.HTTPError, httpx.InvalidURL) as e:
            limits.left()  # a body cut at the deadline (`_read_body`) fails as a timeout
            raise InvalidRequestError(field, f"image fetch failed: {type(e).__name__}") from None
    raise InvalidRequestError(field, f"more than {MAX_REDIRECTS} redirects")


def _read_body(response, limits: _Limits) -> bytes:

    encoding = response.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        raise InvalidRequestError(
            limits.field, f"image fetch failed: a compressed response (Content-Encoding: "
            f"{encoding[:40]}); the server must send the image as it is",
        )  # fmt: skip
    declared = response.headers.get("content-length")
    over = f"the image is over the limit of {limits.max_bytes} bytes (max_image_bytes)"
    if declared is not None and declared.isdigit() and int(declared) > limits.max_bytes:
        raise MediaTooLargeError(limits.field, over)
    body = bytearray()
    watchdog = threading.Timer(limits.left(), _cut, (response,))
    watchdog.start()
    try:
        for chunk in response.iter_raw():
            body += chunk
            if len(body) > limits.max_bytes:
                raise MediaTooLargeError(limits.field, over)
            limits.left()
    finally:
        watchdog.cancel()
    return bytes(body)


def _cut(response) -> None:
    """End the read waiting on `response`'s socket (the deadline passed): shutdown wakes a
    blocked read, close would not; the socket base class's, so TLS state is left alone."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is not None:
        try:
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
        except OSError:  # already closed: the read has ended anyway
            pass
