"""What a request constrains its output to (vLLM's `StructuredOutputsParams` fields)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hyla.errors import InvalidRequestError


class StructuredOutputsError(InvalidRequestError):
    """A grammar, schema or regex that cannot be compiled; `field` names the input."""


@dataclass(frozen=True)
class StructuredOutputsParams:
    """Exactly one of `json` (a schema, dict or text), `json_object`, `regex`, `choice`.
    `strict`: no properties or items beyond those declared (OpenAI's `strict: true`); `field`:
    the request field, for errors. Raises StructuredOutputsError."""

    json: str | dict[str, Any] | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    strict: bool = True
    field: str = "structured_outputs"

    def __post_init__(self) -> None:
        given = [
            self.json is not None,
            self.json_object,
            self.regex is not None,
            self.choice is not None,
        ]
        if sum(given) != 1:
            raise StructuredOutputsError(
                self.field, "set exactly one of json, json_object, regex, choice"
            )
        if self.json is not None and not isinstance(self.json, (str, dict)):
            raise StructuredOutputsError(self.field, "json must be a schema (dict or JSON text)")
        if self.choice is not None:
            choice = tuple(self.choice)
            if not choice or not all(isinstance(c, str) and c for c in choice):
                raise StructuredOutputsError(self.field, "choice must be non-empty strings")
            object.__setattr__(self, "choice", choice)

    @property
    def schema_text(self) -> str | None:
        if self.json is None:
            return None
        return self.json if isinstance(self.json, str) else json.dumps(self.json)

    def key(self) -> tuple[Any, ...]:
        """A hashable identity (the compiled-grammar cache key)."""
        return (self.schema_text, self.json_object, self.regex, self.choice, self.strict)
