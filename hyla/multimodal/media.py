"""Image URLs of OpenAI content parts -> PIL images: data: URLs; file:// only under
`allowed_local_media_path`, http(s) only from `allowed_media_domains` (both off by default)."""

from __future__ import annotations

import base64
import binascii
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from hyla.multimodal.remote import MediaTooLargeError, fetch_image_bytes
from hyla.request import InvalidRequestError


@dataclass(frozen=True)
class MediaOptions:
    max_image_bytes: int = 20 * 2**20
    max_image_pixels: int = 4096 * 4096
    allowed_local_media_path: str | None = None
    allowed_media_domains: tuple[str, ...] = ()
    media_fetch_timeout: float = 5.0


def load_image_url(url: str, field: str, options: MediaOptions) -> Any:
    """The PIL image at `url`, decoded and checked (InvalidRequestError, MediaTooLargeError)."""
    if not isinstance(url, str):
        raise InvalidRequestError(field, "url: expected a string")
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        raw = _data_url_bytes(url, field, options.max_image_bytes)
    elif scheme == "file":
        raw = _local_file_bytes(url, field, options)
    elif scheme in ("http", "https"):
        raw = fetch_image_bytes(url, field, options.allowed_media_domains,
                                options.max_image_bytes, options.media_fetch_timeout)  # fmt: skip
    else:
        raise InvalidRequestError(
            field, f"unsupported URL scheme {scheme!r}; expected a data:image/...;base64 URL"
        )
    return decode_image(raw, field, options.max_image_pixels)


def _data_url_bytes(url: str, field: str, max_bytes: int) -> bytes:
    header, sep, payload = url.partition(",")
    media = header[len("data:") :].lower()
    if not sep or not media.startswith("image/") or not media.endswith(";base64"):
        raise InvalidRequestError(field, "expected data:image/<png|jpeg|...>;base64,<data>")
    if len(payload) // 4 * 3 > max_bytes + 2:
        raise MediaTooLargeError(
            field,
            f"the image is about {len(payload) // 4 * 3} bytes, "
            f"over the limit of {max_bytes} (max_image_bytes)",
        )
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise InvalidRequestError(field, f"invalid base64 data: {e}") from e
    if len(raw) > max_bytes:
        raise MediaTooLargeError(
            field, f"the image is {len(raw)} bytes, over the limit of {max_bytes} (max_image_bytes)"
        )
    return raw


def _local_file_bytes(url: str, field: str, options: MediaOptions) -> bytes:
    root = options.allowed_local_media_path
    if root is None:
        raise InvalidRequestError(
            field,
            "file:// image URLs are disabled; start the server "
            "with --allowed-local-media-path to allow a directory",
        )
    path = Path(unquote(urlparse(url).path)).resolve()
    if not path.is_relative_to(Path(root).resolve()) or not path.is_file():
        raise InvalidRequestError(field, f"not a file under the allowed local media path {root}")
    size = path.stat().st_size
    if size > options.max_image_bytes:
        raise MediaTooLargeError(
            field,
            f"the image is {size} bytes, over the limit of "
            f"{options.max_image_bytes} (max_image_bytes)",
        )
    return path.read_bytes()


def decode_image(raw: bytes, field: str, max_pixels: int) -> Any:
    """PIL image of encoded bytes; the size is checked from the header before decoding."""
    from PIL import Image

    try:
        image = Image.open(io.BytesIO(raw))
        w, h = image.size
        if w * h > max_pixels:
            raise InvalidRequestError(
                field,
                f"{w} x {h} = {w * h} pixels, over the limit of {max_pixels} (max_image_pixels)",
            )
        image.load()
    except InvalidRequestError:
        raise
    except Exception as e:  # noqa: BLE001 - PIL raises many types for corrupt data
        raise InvalidRequestError(field, f"undecodable image: {type(e).__name__}: {e}") from e
    return image
