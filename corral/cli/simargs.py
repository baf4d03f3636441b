"""`corral simulate`'s command line read without typer, where that is sure to read it as typer
does: a run's start does not pay for typer, which parses every option through pydantic (some
200 ms of CPU with pydantic's import, of a start that is under 300 ms without them).

`read(args)` gives the keyword arguments typer would call `corral.cli.simulate.simulate` with, or
None wherever the line holds anything else than options it knows written plainly: `--help`, an
unknown option, a positional argument, `--`, a missing `--trace`, a value that begins with `-`, an
empty value, a number not written plainly (`1e3` is plain, `0x10` and `1_000` are not), a flag
given a value. Typer then reads the line as ever, so help, usage errors and every corner of its
parsing are its own. The options are the ones `simulate`'s signature declares (its annotations
are read with a stand-in for `typer.Option` that records the names) and the scheduler flags
generated from the registries (corral.cli.schedflags); tests/cli/test_simargs.py checks both
against the command typer builds, and that typer reads each line `read` accepts the same.
"""

from __future__ import annotations

import inspect
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import NoneType, UnionType
from typing import Annotated, Any, Union, get_args, get_origin

#: A number as typer's parsing (pydantic's) and Python's agree on it.
INTEGER = re.compile(r"-?(0|[1-9][0-9]*)")
FLOAT = re.compile(r"-?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?")
#: The environment variable that asks typer for shell completion (`corral` as its program name).
COMPLETE_VAR = "_CORRAL_COMPLETE"


@dataclass(frozen=True, slots=True)
class Declared:
    """What the stand-in for `typer.Option` records: the option's names as written."""

    decls: tuple[str, ...]


class _Typer:
    """Stands in for the typer module while `simulate`'s annotations are read."""

    @staticmethod
    def Option(*decls: str, **_: Any) -> Declared:  # noqa: N802 - typer's name
        return Declared(decls)


def _no_help() -> str:
    return ""


@dataclass(frozen=True, slots=True)
class Param:
    """One option: its parameter name, its names on the command line (`off`: the name of a
    flag's False, if any), the type of its value (bool: a flag) and its default."""

    name: str
    on: str
    off: str | None
    kind: type
    default: Any
    required: bool


def _base(annotation: Any) -> tuple[Any, tuple[Any, ...]]:
    """An annotation's type (`X | None` read as X) and its Annotated metadata."""
    metadata: tuple[Any, ...] = ()
    if get_origin(annotation) is Annotated:
        annotation, *rest = get_args(annotation)
        metadata = tuple(rest)
    if get_origin(annotation) in (Union, UnionType):
        kept = [arg for arg in get_args(annotation) if arg is not NoneType]
        if len(kept) == 1:
            annotation = kept[0]
    return annotation, metadata


def _names(name: str, kind: Any, declared: Declared | None) -> tuple[str, str | None]:
    """The option's names as typer makes them: those declared, else `--name` (a bool:
    `--name/--no-name`)."""
    if declared is not None and declared.decls:
        on, _, off = declared.decls[0].partition("/")
        return on.strip(), off.strip() or None
    flag = "--" + name.replace("_", "-")
    return (flag, "--no-" + flag[2:]) if kind is bool else (flag, None)


def simulate_params() -> list[Param]:
    """`simulate`'s own options, from its signature (the scheduler flags apart)."""
    from corral.cli import simulate as module

    stand_ins = {
        "typer": _Typer,
        "trace_help": _no_help,
        "stream_help": _no_help,
        "policy_help": _no_help,
        "preset_help": _no_help,
    }
    signature = inspect.signature(
        module.simulate, eval_str=True, globals={**vars(module), **stand_ins}
    )
    params = []
    for parameter in signature.parameters.values():
        if parameter.name == "scheduler":
            continue
        kind, metadata = _base(parameter.annotation)
        declared = next((m for m in metadata if isinstance(m, Declared)), None)
        on, off = _names(parameter.name, kind, declared)
        required = parameter.default is inspect.Parameter.empty
        default = None if required else parameter.default
        params.append(Param(parameter.name, on, off, kind, default, required))
    return params


def scheduler_params(known: list[tuple[str, str | None, Any, str]]) -> list[Param]:
    """The generated scheduler flags (`corral.cli.schedflags.flags()`): bool ones `--x/--no-x`,
    the others a value read as text; None when not given."""
    from corral.cli.schedflags import flag_name

    params = []
    for name, section, info, _ in known:
        flag = flag_name(section, info.name)
        if info.base is bool:
            params.append(Param(name, flag, "--no-" + flag[2:], bool, None, False))
        else:
            params.append(Param(name, flag, None, str, None, False))
    return params


def _value(kind: type, text: str) -> tuple[bool, Any]:
    """(True, the value) where typer would read `text` as this value; (False, None) where that
    is not sure."""
    if text == "":
        return False, None
    if kind is str:
        return True, text
    if kind is int:
        return (True, int(text)) if INTEGER.fullmatch(text) else (False, None)
    if kind is float:
        return (True, float(text)) if FLOAT.fullmatch(text) else (False, None)
    if kind is Path:
        return True, Path(text)
    return False, None


def read(args: list[str]) -> dict[str, Any] | None:
    """The keyword arguments of `simulate` for this command line (`scheduler` the mapping of the
    scheduler flags given), or None: let typer read it."""
    if COMPLETE_VAR in os.environ:
        return None
    from corral.cli.schedflags import bare_values, expand_bare, flags, overrides

    known = flags()
    own = simulate_params()
    generated = scheduler_params(known)
    by_flag: dict[str, tuple[Param, bool]] = {}
    for param in [*own, *generated]:
        by_flag[param.on] = (param, True)
        if param.off is not None:
            by_flag[param.off] = (param, False)
    values: dict[str, Any] = {}
    line = expand_bare(list(args), bare_values(known))
    position = 0
    while position < len(line):
        arg = line[position]
        position += 1
        flag, equals, text = arg.partition("=")
        if not flag.startswith("--") or flag not in by_flag:
            return None  # a positional argument, `--`, `--help`, an unknown or short option
        param, on = by_flag[flag]
        if param.kind is bool:
            if equals:
                return None  # a flag given a value: typer's error
            values[param.name] = on
            continue
        if not equals:
            if position == len(line):
                return None  # an option without its value: typer's error
            text = line[position]
            position += 1
        if text.startswith("-") and not (param.kind in (int, float) and text[1:2].isdigit()):
            return None
        sure, value = _value(param.kind, text)
        if not sure:
            return None
        values[param.name] = value
    kwargs: dict[str, Any] = {}
    for param in own:
        if param.name in values:
            kwargs[param.name] = values[param.name]
        elif param.required:
            return None  # typer's "Missing option"
        else:
            kwargs[param.name] = param.default
    kwargs["scheduler"] = overrides({name: values.get(name) for name, *_ in known}, known)
    return kwargs


def run(args: list[str]) -> bool:
    """Run `corral simulate ARGS` if `read` reads the line (False: it did not, nothing ran), as
    typer's main would: its exit status, 130 when interrupted."""
    kwargs = read(args)
    if kwargs is None:
        return False
    from corral.cli.simulate import simulate

    try:
        simulate(**kwargs)
    except KeyboardInterrupt:
        sys.exit(130)  # (typer's main: click's would print "Aborted!" and exit 1)
    except Exception as error:
        typer = sys.modules.get("typer")  # `fail` raises typer's Exit, having imported it
        if typer is not None and isinstance(error, typer.Exit):
            sys.exit(error.exit_code)
        raise
    return True
