"""Typed reads of Hugging Face `config.json` fields, raising ConfigError naming the field.
Aliases: the first present wins; defaults are the family's transformers defaults."""

from __future__ import annotations

from typing import Any

from hyla.config import ConfigError, RopeConfig

_MISSING = object()


class HFFields:
    """A view on one HF config dict. `names` is one field name or a tuple of aliases."""

    def __init__(self, data: dict[str, Any]) -> None:
        if not isinstance(data, dict):
            raise ConfigError(f"config: expected a JSON object, got {type(data).__name__}")
        self.data = data

    def raw(self, names: str | tuple[str, ...], default: Any = _MISSING) -> Any:
        """The first alias present (null counts as absent), else `default`. Raises ConfigError
        when present aliases disagree or a required field is absent."""
        aliases = (names,) if isinstance(names, str) else names
        present = [n for n in aliases if self.data.get(n) is not None]
        if len({repr(self.data[n]) for n in present}) > 1:
            given = ", ".join(f"{n}={self.data[n]!r}" for n in present)
            raise ConfigError(f"{aliases[0]}: conflicting values for one field: {given}")
        if present:
            return self.data[present[0]]
        if default is _MISSING:
            raise ConfigError(f"{aliases[0]}: required field missing from config.json")
        return default

    def integer(
        self, names: str | tuple[str, ...], default: Any = _MISSING, minimum: int = 1
    ) -> int:
        """An integer >= `minimum` (None passes through)."""
        value = self.raw(names, default)
        name = names if isinstance(names, str) else names[0]
        if value is None:
            return value
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ConfigError(f"{name}: expected an integer >= {minimum}, got {value!r}")
        return value

    def number(self, names: str | tuple[str, ...], default: Any = _MISSING) -> float:
        value = self.raw(names, default)
        name = names if isinstance(names, str) else names[0]
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ConfigError(f"{name}: expected a number, got {value!r}")
        return float(value)

    def flag(self, names: str | tuple[str, ...], default: Any = _MISSING) -> bool:
        value = self.raw(names, default)
        name = names if isinstance(names, str) else names[0]
        if not isinstance(value, bool):
            raise ConfigError(f"{name}: expected true/false, got {value!r}")
        return value

    def sequence(self, names: str | tuple[str, ...], default: Any = _MISSING) -> list:
        value = self.raw(names, default)
        name = names if isinstance(names, str) else names[0]
        if value is not None and not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name}: expected a list, got {type(value).__name__}")
        return value

    def string(self, names: str | tuple[str, ...], default: Any = _MISSING) -> str:
        value = self.raw(names, default)
        name = names if isinstance(names, str) else names[0]
        if not isinstance(value, str):
            raise ConfigError(f"{name}: expected a string, got {value!r}")
        return value


def layer_list(fields: HFFields, name: str, num_layers: int, kinds: dict[str, str]) -> list[str]:
    """Map a per-layer type list (e.g. `layer_types`) to hyla kinds; ConfigError names `name[i]`."""
    values = fields.sequence(name)
    if len(values) != num_layers:
        raise ConfigError(f"{name}: length {len(values)} != num_hidden_layers={num_layers}")
    out = []
    for i, value in enumerate(values):
        if value not in kinds:
            raise ConfigError(f"{name}[{i}]: {value!r} not in {sorted(kinds)}")
        out.append(kinds[value])
    return out


def eos_ids(fields: HFFields) -> tuple[int, ...]:
    value = fields.raw("eos_token_id", None)
    if value is None:
        return ()
    values = value if isinstance(value, (list, tuple)) else [value]
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool):
            raise ConfigError(f"eos_token_id: expected an integer or a list of them, got {value!r}")
    return tuple(values)


def model_dtype(fields: HFFields) -> str:
    """The checkpoint dtype (`dtype` in transformers 5, `torch_dtype` before); float32 if absent."""
    value = fields.raw(("dtype", "torch_dtype"), "float32")
    value = str(value).removeprefix("torch.")
    if value not in ("float32", "bfloat16", "float16"):
        raise ConfigError(f"dtype: expected float32|bfloat16|float16, got {value!r}")
    return value


_ROPE_KEYS = {"rope_theta", "rope_type", "type", "partial_rotary_factor"}


def rope_config(
    fields: HFFields,
    head_dim: int,
    style: str,
    default_theta: float,
    default_partial: float = 1.0,
) -> RopeConfig:
    """RoPE from `rope_parameters` or `rope_theta` + `rope_scaling`; rotary_dim = head_dim *
    partial_rotary_factor (else `default_partial`); extras go to `RopeConfig.scaling`."""
    params = fields.raw("rope_parameters", None)
    if params is None:
        params = dict(fields.raw("rope_scaling", None) or {})
        params.setdefault("rope_theta", fields.raw("rope_theta", default_theta))
    if not isinstance(params, dict):
        raise ConfigError(f"rope_parameters: expected an object, got {type(params).__name__}")
    sub = HFFields(params)
    theta = sub.number("rope_theta", default_theta)
    factor = sub.number(
        "partial_rotary_factor", fields.number("partial_rotary_factor", default_partial)
    )
    scaling_type = sub.string(("rope_type", "type"), "default")
    extras = tuple(sorted((k, v) for k, v in params.items() if k not in _ROPE_KEYS))
    return RopeConfig(
        theta=theta,
        rotary_dim=int(head_dim * factor),
        style=style,
        scaling_type=scaling_type,
        scaling=extras,
    )


def require_silu(fields: HFFields) -> None:
    """Raises ConfigError naming `hidden_act` unless it is silu (hyla's only MLP activation)."""
    act = fields.string("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"hidden_act: only 'silu' is supported, got {act!r}")
