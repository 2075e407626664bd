"""The images of a chat conversation (OpenAI `image_url` content parts) for the server and
`LLM.chat`: each decoded and replaced by its placeholder text, expanded into rows by `prepare`."""

from __future__ import annotations

import re
from typing import Any

from hyla.multimodal.inputs import IMAGE_FIELD
from hyla.multimodal.media import MediaOptions, load_image_url
from hyla.multimodal.runtime import MultimodalRuntime, PreparedPrompt
from hyla.request import InvalidRequestError

_IMAGE_URL_KEYS = {"url", "detail"}


class ChatImages:
    """Collects a conversation's images while its messages are rendered."""

    def __init__(self, runtime: MultimodalRuntime, tokenizer: Any, options: MediaOptions) -> None:
        self.runtime = runtime
        self.options = options
        self.marker = runtime.placeholder_text(tokenizer)
        self.images: list[Any] = []
        self.fields: list[str] = []

    def add(self, part: dict[str, Any], field: str) -> str:
        """Decode `part`'s image (at `field`); returns its placeholder text."""
        spec = part.get("image_url")
        if not isinstance(spec, dict) or "url" not in spec:
            raise InvalidRequestError(f"{field}.image_url", 'expected {"url": "data:..."}')
        extra = sorted(set(spec) - _IMAGE_URL_KEYS) + sorted(set(part) - {"type", "image_url"})
        if extra:
            raise InvalidRequestError(f"{field}.{extra[0]}", "not supported")
        if spec.get("detail", "auto") != "auto":
            raise InvalidRequestError(f"{field}.image_url.detail", "only 'auto' is supported")
        self._check_count(field)
        self.images.append(load_image_url(spec["url"], f"{field}.image_url", self.options))
        self.fields.append(field)
        return self.marker

    def add_pil(self, part: dict[str, Any], field: str) -> str:
        """`LLM.chat`'s {"type": "image_pil", "image_pil": image} part."""
        self._check_count(field)
        self.images.append(part.get("image_pil"))  # type and size checked by `prepare`
        self.fields.append(field)
        return self.marker

    def _check_count(self, field: str) -> None:
        limit = self.runtime.limits.max_images
        if len(self.images) >= limit:
            raise InvalidRequestError(
                field, f"more than {limit} images in one request (limit_mm_per_prompt)"
            )

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
    """A collector for one conversation to `engine`, or None when the model takes no images."""
    runtime = getattr(engine, "multimodal", None)
    if runtime is None or tokenizer is None:
        return None
    config = engine.config
    options = MediaOptions(
        config.max_image_bytes, config.max_image_pixels, config.allowed_local_media_path,
        config.allowed_media_domains, config.media_fetch_timeout,
    )  # fmt: skip
    return ChatImages(runtime, tokenizer, options)


def _part_text(part: Any, field: str, images: ChatImages | None) -> str:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "text" and isinstance(part.get("text"), str):
        return part["text"]
    if kind not in ("image_url", "image_pil"):
        raise InvalidRequestError(field, "expected a text, image_url or image_pil part")
    if images is None:
        raise InvalidRequestError(field, "this model takes no images (no vision tower loaded)")
    return images.add(part, field) if kind == "image_url" else images.add_pil(part, field)


def _message(i: int, message: Any, images: ChatImages | None) -> dict[str, str]:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise InvalidRequestError(f"messages[{i}]", 'expected {"role": str, "content": ...}')
    content = message.get("content") or ""
    if not isinstance(content, str):
        parts = content if isinstance(content, list) else [content]
        field = f"messages[{i}].content"
        content = "".join(_part_text(p, f"{field}[{j}]", images) for j, p in enumerate(parts))
    return {"role": message["role"], "content": content}


def chat_prompt(
    engine: Any, messages: list[dict[str, Any]], add_generation_prompt: bool = True
) -> list[int] | PreparedPrompt:
    """`LLM.chat`'s prompt: `messages` through the chat template (without one, `Role: content`
    lines then `Assistant:`), images processed. Raises InvalidRequestError naming the field."""
    tokenizer = engine.tokenizer
    if tokenizer is None:
        raise InvalidRequestError("messages", "this model has no tokenizer; use token ids")
    images = chat_images(engine, tokenizer)
    conversation = [_message(i, m, images) for i, m in enumerate(messages)]
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=add_generation_prompt
        )
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    else:
        lines = [f"{m['role'].capitalize()}: {m['content']}" for m in conversation]
        lines += ["Assistant:"] if add_generation_prompt else []
        ids = list(tokenizer("\n".join(lines))["input_ids"])
    return ids if images is None or not images.images else images.prepare(ids)
