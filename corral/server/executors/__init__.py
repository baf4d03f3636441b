"""Executors, chosen by name (`corral up --executor NAME`). A new executor is its class (anything
with the `Executor` protocol's methods, corral.server.state) and one module with its entry
(an `ExecutorEntry`: name, summary, options, refusals, `start`), plus one line here; see
docs/architecture.md#executors for a worked example. Nothing else names an executor: the CLI's
`--executor` choices, help and flags and boot's checks come from this registry."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from corral.core.options import OptionError, build, check
from corral.server.executors.base import Boot, ExecutorEntry, ExecutorError, Started
from corral.server.executors.inert import InertEntry
from corral.server.executors.local import LocalEntry
from corral.server.executors.ray import RayEntry

EXECUTORS: dict[str, type[ExecutorEntry]] = {
    "local": LocalEntry,
    "ray": RayEntry,  # imports Ray only when it starts
    "inert": InertEntry,
}

DEFAULT_EXECUTOR = "local"


def executor_entry(name: str) -> type[ExecutorEntry]:
    """The registered executor `name`; ExecutorError (one line listing them) for another."""
    try:
        return EXECUTORS[name]
    except KeyError:
        raise ExecutorError(
            f"--executor: unknown {name!r}; choose one of: {', '.join(EXECUTORS)}"
        ) from None


def executor_summaries() -> list[tuple[str, str]]:
    """(name, one-line summary) of every registered executor, in registry order."""
    return [(name, entry.summary) for name, entry in EXECUTORS.items()]


def flag(executor: str, option: str) -> str:
    """The `corral up` flag of an executor's option: `--ray-address`."""
    return f"--{executor}-{option}".replace("_", "-")


def executor_options(entry: type[ExecutorEntry], given: object) -> Any:
    """The entry's options from what was given: an instance of its `Options` (checked), a
    mapping of them by name (its flags' values: strings are parsed) or None (its defaults);
    ExecutorError naming the flag for a bad one."""
    try:
        if isinstance(given, entry.Options):
            check(given, entry.name)
            return given
        if given is None:
            given = {}
        if not isinstance(given, Mapping):
            raise ExecutorError(
                f"--executor {entry.name}: its options must be a mapping or its "
                f"{entry.Options.__name__}, got {type(given).__name__}"
            )
        return build(entry.Options, given, entry.name)
    except OptionError as error:
        raise ExecutorError(_flag_message(entry.name, str(error))) from None


def _flag_message(executor: str, message: str) -> str:
    """An OptionError about `executor`'s options naming the flag (`--ray-address: ...`)."""
    match = re.match(rf"{re.escape(executor)}\.([a-z0-9_]+)(\[\d+\])?: (.*)", message)
    if match is not None:
        return f"{flag(executor, match.group(1))}: {match.group(3)}"
    return message.replace(f"{executor}: ", f"--executor {executor}: ", 1)


__all__ = [
    "DEFAULT_EXECUTOR",
    "EXECUTORS",
    "Boot",
    "ExecutorEntry",
    "ExecutorError",
    "Started",
    "executor_entry",
    "executor_options",
    "executor_summaries",
    "flag",
]
