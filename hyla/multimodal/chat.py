"""The images of a chat conversation (OpenAI content parts) for the server and `LLM.chat`.

{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}
    -> the image decoded (`media`), and its placeholder text in the message where the part
       was (`<|vision_start|><|image_pad|><|vision_end|>` for Qwen3.5), which the
       tokenizer turns into the family's image tokens; `prepare` then expands each into
       the image's rows.
"""

from __future__ import annotations

import base64
import io
import re
from typing import Any

from hyla.multimodal.inputs import IMAGE_FIELD
from hyla.multimodal.media import MediaOptions, load_image_url
from hyla.multimodal.runtime import MultimodalRuntime, PreparedPrompt
from hyla.request import InvalidRequestError

_IMAGE_URL_KEYS = {"url", "detail"}


class ChatImages:
    """Collects a conversation's images while its messages are rendered.

    Args:
        runtime: the engine's image side (processor, limits, placeholder tokens).
        tokenizer: the model's tokenizer (the placeholder text).
        options: URL and size limits.
    """

    def __init__(self, runtime: MultimodalRuntime, tokenizer: Any, options: MediaOptions) -> None:
        self.runtime = runtime
        self.options = options
        self.marker = runtime.placeholder_text(tokenizer)
        self.images: list[Any] = []
        self.fields: list[str] = []

    def add(self, part: dict[str, Any], field: str) -> str:
        """Decode the image of content part `part` (at `field`); returns its placeholder text.

        Raises: InvalidRequestError naming the field and the limit."""
        spec = part.get("image_url")
        if not isinstance(spec, dict) or "url" not in spec:
            raise InvalidRequestError(f"{field}.image_url", 'expected {"url": "data:..."}')
        extra = sorted(set(spec) - _IMAGE_URL_KEYS) + sorted(set(part) - {"type", "image_url"})
        if extra:
            raise InvalidRequestError(f"{field}.{extra[0]}", "not supported")
        if spec.get("detail", "auto") != "auto":
            raise InvalidRequestError(f"{field}.image_url.detail", "only 'auto' is supported")
        limit = self.runtime.limits.max_images
        if len(self.images) >= limit:
            raise InvalidRequestError(
                field, f"more than {limit} images in one request (limit_mm_per_prompt)"
            )
        self.images.append(load_image_url(spec["url"], f"{field}.image_url", self.options))
        self.fields.append(field)
        return self.marker

    def prepare(self, ids: list[int]) -> PreparedPrompt:
        """Process the images and expand their placeholders in the rendered `ids`; an image's
        error names its content part, a placeholder mismatch names `messages`."""
        try:
            return self.runtime.prepare(ids, self.images)
        except InvalidRequestError as e:
            found = re.fullmatch(re.escape(IMAGE_FIELD) + r"\[(\d+)\]", e.field)
            if found is not None:
                raise InvalidRequestError(self.fields[int(found[1])], e.message) from e
            if e.field == "prompt":
                raise InvalidRequestError("messages", f"(as rendered) {e.message}") from e
            raise


def chat_images(engine: Any, tokenizer: Any) -> ChatImages | None:
    """A collector for one conversation to `engine` (an `LLMEngine`), or None when the model
    takes no images (or has no tokenizer to render them)."""
    runtime = getattr(engine, "multimodal", None)
    if runtime is None or tokenizer is None:
        return None
    config = engine.config
    options = MediaOptions(
        config.max_image_bytes, config.max_image_pixels, config.allowed_local_media_path
    )
    return ChatImages(runtime, tokenizer, options)


def _inline_pil(message: dict[str, Any]) -> dict[str, Any]:
    """`image_pil` parts as PNG data URLs (lossless): one decoding path for every image."""
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list):
        return message
    parts = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "image_pil":
            buf = io.BytesIO()
            part["image_pil"].save(buf, format="PNG")
            url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
            part = {"type": "image_url", "image_url": {"url": url}}
        parts.append(part)
    return {**message, "content": parts}


def chat_prompt(
    engine: Any, messages: list[dict[str, Any]], add_generation_prompt: bool = True
) -> list[int] | PreparedPrompt:
    """`LLM.chat`'s prompt: `messages` rendered exactly as the server renders a chat request
    (its template code, imported here), images processed.

    Raises: InvalidRequestError naming the field."""
    from pydantic import ValidationError

    from hyla.server.convert import chat_prompt_ids
    from hyla.server.errors import APIError
    from hyla.server.protocol import ChatCompletionRequest

    try:
        req = ChatCompletionRequest(
            messages=[_inline_pil(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
        )
    except ValidationError as e:
        raise InvalidRequestError("messages", str(e)) from e
    images = chat_images(engine, engine.tokenizer)
    try:
        ids = chat_prompt_ids(engine.tokenizer, req, images)
    except APIError as e:
        raise InvalidRequestError(e.param or "messages", e.message) from e
    return ids if images is None or not images.images else images.prepare(ids)
