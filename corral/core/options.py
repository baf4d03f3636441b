"""Plugin options: each plugin declares its options once, as a frozen dataclass.

A field is declared with `option(default, help=..., low=..., high=...)`; the declaration is the
only place an option's name, type, default, range and help live. From it follow the YAML section
(`scheduler: {las: {thresholds_gpu_s: [...]}}`), the CLI flags (`--las-thresholds-gpu-s`) and
their help, `corral config show`, and the one-line error for a bad value. Pure: no I/O.

Supported field types: bool, int, float, str, a `Literal[...]` of strings, `tuple[float, ...]`,
`tuple[str, ...]` and any of these `| None`.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, get_args, get_origin

T = TypeVar("T")


class OptionError(ValueError):
    """A bad option value; the message is one line naming the option (`las.thresholds_gpu_s`)."""


def option(
    default: Any,
    *,
    help: str,  # noqa: A002 - the word every CLI library uses
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    choices: Callable[[], Iterable[str]] | None = None,
    aliases: Mapping[str, str] | None = None,
    bare: str | None = None,
) -> Any:
    """A dataclass field with its help and range (`low` <= value <= `high`; `low_open`: >).
    `choices`: the names a value is chosen from, asked each time they are shown (a registry's
    keys, so that a plugin registered later is listed too). `aliases`: older spellings of a
    string option's values (a boolean it once was: `{"true": "greedy"}`), read as the value
    they name. `bare`: the value of its CLI flag given without one (`--backfill`)."""
    metadata = {
        "help": help,
        "low": low,
        "high": high,
        "low_open": low_open,
        "choices": choices,
        "aliases": aliases,
        "bare": bare,
    }
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True, slots=True)
class OptionInfo:
    name: str
    kind: Any  # the field's resolved type
    default: Any
    help: str
    low: float | None
    high: float | None
    low_open: bool
    choices: Callable[[], Iterable[str]] | None = None
    aliases: Mapping[str, str] | None = None
    bare: str | None = None

    def choices_text(self) -> str:
        """The names it is chosen from, "a, b, c" ("" when it is not chosen from names)."""
        return "" if self.choices is None else ", ".join(self.choices())

    @property
    def optional(self) -> bool:
        return _is_optional(self.kind)

    @property
    def base(self) -> Any:
        """The type without `| None`."""
        return _strip_none(self.kind)

    def range_text(self) -> str:
        if self.low is None and self.high is None:
            return ""
        if self.high is None:
            return f"> {self.low:g}" if self.low_open else f">= {self.low:g}"
        if self.low is None:
            return f"<= {self.high:g}"
        return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"


@dataclass(frozen=True, slots=True)
class NoOptions:
    """For a plugin without options."""


#: describe's answers by class: a run reads each plugin's options some 10 times (its flags, each
#: config built and checked), and the type hints are resolved once.
_DESCRIBED: dict[type, tuple[OptionInfo, ...]] = {}


def describe(cls: type) -> list[OptionInfo]:
    """The options a dataclass declares, in declaration order."""
    known = _DESCRIBED.get(cls)
    if known is None:
        known = _DESCRIBED[cls] = tuple(_describe(cls))
    return list(known)


def _describe(cls: type) -> list[OptionInfo]:
    hints = typing.get_type_hints(cls)
    infos = []
    for spec in dataclasses.fields(cls):
        meta = spec.metadata
        infos.append(
            OptionInfo(
                name=spec.name,
                kind=hints[spec.name],
                default=spec.default,
                help=str(meta.get("help", "")),
                low=meta.get("low"),
                high=meta.get("high"),
                low_open=bool(meta.get("low_open", False)),
                choices=meta.get("choices"),
                aliases=meta.get("aliases"),
                bare=meta.get("bare"),
            )
        )
    return infos


def build(cls: type[T], values: object, where: str) -> T:
    """An instance of `cls` from a mapping (YAML or CLI), every value checked; unknown keys and
    bad values raise OptionError naming `where.key`."""
    if values is None:
        values = {}
    if not isinstance(values, Mapping):
        raise OptionError(f"{where}: must be a mapping, got {_show(values)}")
    infos = {info.name: info for info in describe(cls)}
    for key in values:
        if key not in infos:
            expected = ", ".join(infos) or "none"
            raise OptionError(f"{where}.{key}: unknown option (expected one of: {expected})")
    kwargs = {name: coerce(infos[name], value, f"{where}.{name}") for name, value in values.items()}
    instance = cls(**kwargs)
    check(instance, where)
    return instance


def check(instance: object, where: str) -> None:
    """Check every field of an options instance against its declared range."""
    for info in describe(type(instance)):
        value = getattr(instance, info.name)
        coerce(info, value, f"{where}.{info.name}")
    validate = getattr(instance, "validate", None)
    if validate is not None:
        problem = validate()
        if problem:
            raise OptionError(f"{where}: {problem}")


def to_dict(instance: object) -> dict[str, object]:
    """Plain values (lists for tuples), as YAML and JSON write them."""
    out: dict[str, object] = {}
    for info in describe(type(instance)):
        value = getattr(instance, info.name)
        out[info.name] = list(value) if isinstance(value, tuple) else value
    return out


def replace(instance: T, values: Mapping[str, object], where: str) -> T:
    """A copy with some options changed, checked like `build`."""
    merged = to_dict(instance) | dict(values)
    return build(type(instance), merged, where)


def coerce(info: OptionInfo, value: object, where: str) -> Any:
    """The value as the option's type (a YAML int for a float is fine; a string is parsed, as a
    CLI flag gives it), or OptionError."""
    kind = info.base
    if info.aliases and isinstance(value, bool | str):
        value = info.aliases.get(str(value).strip().lower(), value)
    spelled_none = isinstance(value, str) and value.strip().lower() in ("none", "null")
    if value is None or (spelled_none and info.optional and kind is not str):
        if info.optional:
            return None
        raise OptionError(f"{where}: must be set (no 'none')")
    result = _coerce_to(kind, value, where)
    _check_range(info, result, where)
    return result


def _coerce_to(kind: Any, value: object, where: str) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "yes", "on", "1"):
            return True
        if isinstance(value, str) and value.strip().lower() in ("false", "no", "off", "0"):
            return False
        raise OptionError(f"{where}: must be true or false, got {_show(value)}")
    if kind is int:
        if isinstance(value, bool):
            raise OptionError(f"{where}: must be an integer, got {_show(value)}")
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise OptionError(f"{where}: must be an integer, got {_show(value)}")
    if kind is float:
        if isinstance(value, bool):
            raise OptionError(f"{where}: must be a number, got {_show(value)}")
        try:
            number = float(value) if isinstance(value, int | float | str) else math.nan
        except ValueError:
            number = math.nan
        if math.isnan(number) or math.isinf(number):
            raise OptionError(f"{where}: must be a finite number, got {_show(value)}")
        return number
    if kind is str:
        if not isinstance(value, str) or not value.strip():
            raise OptionError(f"{where}: must be a non-empty string, got {_show(value)}")
        return value
    if get_origin(kind) is Literal:
        choices = get_args(kind)
        if value not in choices:
            raise OptionError(
                f"{where}: must be one of {', '.join(map(str, choices))}, got {_show(value)}"
            )
        return value
    if get_origin(kind) is tuple:
        item = get_args(kind)[0]
        if isinstance(value, str):
            parts: list[object] = [p for p in value.replace(" ", "").split(",") if p]
        elif isinstance(value, list | tuple):
            parts = list(value)
        else:
            raise OptionError(f"{where}: must be a list, got {_show(value)}")
        return tuple(_coerce_to(item, part, f"{where}[{i}]") for i, part in enumerate(parts))
    raise TypeError(f"{where}: options of type {kind!r} are not supported")


def _check_range(info: OptionInfo, value: Any, where: str) -> None:
    if info.low is None and info.high is None:
        return
    numbers = value if isinstance(value, tuple) else (value,)
    for number in numbers:
        if not isinstance(number, int | float) or isinstance(number, bool):
            continue
        too_low = info.low is not None and (
            number <= info.low if info.low_open else number < info.low
        )
        too_high = info.high is not None and number > info.high
        if too_low or too_high:
            raise OptionError(f"{where}: must be {info.range_text()}, got {_show(value)}")


def _is_optional(kind: Any) -> bool:
    return get_origin(kind) in (typing.Union, types.UnionType) and type(None) in get_args(kind)


def _strip_none(kind: Any) -> Any:
    if not _is_optional(kind):
        return kind
    rest = [arg for arg in get_args(kind) if arg is not type(None)]
    return rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]  # noqa: UP007


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
