"""Typer options from the config dataclasses' scalar fields, helped by the docstring clause naming
each field; unset options are omitted, so dataclass defaults stay the single source of truth."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import typer

_SCALARS = (int, float, str, bool)


@dataclass(frozen=True)
class OptionSpec:
    name: str
    type: type
    default: Any
    help: str

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def _scalar_type(hint: Any) -> type | None:
    """`int`, `int | None`, `Optional[int]` -> int; anything else -> None."""
    if hint in _SCALARS:
        return hint
    args = typing.get_args(hint)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and rest[0] in _SCALARS:
            return rest[0]
    return None


def _field_help(cls: type, name: str) -> str:
    """`metadata["help"]`, else the class docstring clause naming `name` in backticks."""
    meta = {f.name: f.metadata for f in dataclasses.fields(cls)}.get(name, {})
    if "help" in meta:
        return meta["help"]
    doc = inspect.cleandoc(cls.__doc__ or "")
    clauses = re.split(r"(?<=[.;])\s+", " ".join(doc.split()))
    for clause in clauses:
        if f"`{name}`" in clause:
            return clause.replace("`", "").rstrip(".;") + "."
    return name.replace("_", " ").capitalize() + "."


def _default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def config_options(*classes: type, exclude: tuple[str, ...] = ()) -> list[OptionSpec]:
    """Option specs for the scalar fields of `classes` (first class wins on a repeated name)."""
    specs: dict[str, OptionSpec] = {}
    for cls in classes:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            kind = f.metadata.get("cli_type") or _scalar_type(hints[f.name])
            if kind is None or f.name in specs or f.name in exclude:
                continue
            default = _default_of(f)
            help_text = _field_help(cls, f.name)
            if "default" not in help_text:
                help_text += f" (default: {default})"
            specs[f.name] = OptionSpec(f.name, kind, default, help_text)
    return list(specs.values())


def _parameter(spec: OptionSpec) -> inspect.Parameter:
    decls = [f"{spec.flag}/--no-{spec.flag[2:]}"] if spec.type is bool else [spec.flag]
    option = typer.Option(None, *decls, help=spec.help, show_default=False)
    return inspect.Parameter(
        spec.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=spec.type | None
    )


def add_options(command: Callable[..., Any], specs: list[OptionSpec]) -> Callable[..., Any]:
    """Wrap `command(..., engine_options: dict)` so typer sees one option per spec."""
    own = inspect.signature(command, eval_str=True)
    params = [p for p in own.parameters.values() if p.name != "engine_options"]
    generated = [_parameter(s) for s in specs if s.name not in own.parameters]
    names = {p.name for p in generated}

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        options = {k: kwargs.pop(k) for k in list(kwargs) if k in names}
        options = {k: v for k, v in options.items() if v is not None}
        return command(**kwargs, engine_options=options)

    wrapper.__signature__ = own.replace(parameters=params + generated)  # type: ignore[attr-defined]
    annotations = {p.name: p.annotation for p in params + generated}
    wrapper.__annotations__ = annotations
    del wrapper.__wrapped__  # typer must read the new signature, not the original's
    return wrapper
