"""A registry of plugins by name, each plugin's module imported when the plugin is first read.

`POLICIES`, `PLACEMENTS`, `ADMISSIONS` and `STAGES` are `Registry` objects: mappings from a name
to a plugin class, as a dict. An entry is the class itself (a plugin registered by the user,
`POLICIES["lifo"] = Lifo`), or a `Lazy` that says where the class is ("module:Class") and where
its options class is ("module:Options", or None for a plugin that declares none). Reading the
entry (`POLICIES["las"]`, `.items()`, `.values()`) imports the class; its name (`in`, iteration,
`", ".join(POLICIES)`) and its options (`options(name)`: what a `SchedulerConfig`'s sections and
the CLI flags need) do not. A start of `corral simulate --policy las` so imports the plugins it
runs, not the 17 other plugin modules (docs/simulator.md, "Start-up before the first event").

A `Lazy` entry's options must be the class's own `Options`: tests/core/test_registry.py checks
every entry of every registry against its class.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any, TypeVar

from corral.core.options import NoOptions

T = TypeVar("T")


def load(where: str) -> Any:
    """The attribute "module:attribute" names, its module imported."""
    module, _, attribute = where.partition(":")
    return getattr(importlib.import_module(module), attribute)


class Lazy:
    """Where a plugin class is ("module:Class"), and where its options class is
    ("module:Options"; None: it declares no options)."""

    __slots__ = ("options", "where")

    def __init__(self, where: str, options: str | None = None) -> None:
        self.where = where
        self.options = options

    def __repr__(self) -> str:
        return f"Lazy({self.where!r}, {self.options!r})"


class Registry(MutableMapping[str, T]):
    """Plugins by name, in the order given; a `Lazy` entry is imported when first read."""

    __slots__ = ("_declared", "_entries")

    def __init__(self, entries: Mapping[str, Lazy | T]) -> None:
        self._entries: dict[str, Lazy | T] = dict(entries)
        self._declared = {name: e for name, e in entries.items() if isinstance(e, Lazy)}

    def __getitem__(self, name: str) -> T:
        entry = self._entries[name]
        if isinstance(entry, Lazy):
            loaded: T = load(entry.where)
            self._entries[name] = loaded
            return loaded
        return entry

    def __setitem__(self, name: str, plugin: T) -> None:
        self._entries[name] = plugin
        self._declared.pop(name, None)

    def __delitem__(self, name: str) -> None:
        del self._entries[name]
        self._declared.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __repr__(self) -> str:
        return f"Registry({self._entries!r})"

    def options(self, name: str) -> type[Any]:
        """The options class of the plugin `name` (`NoOptions` if it declares none), without
        importing a plugin not yet read."""
        entry = self._entries[name]
        if isinstance(entry, Lazy):
            return NoOptions if entry.options is None else load(entry.options)
        options: type[Any] = getattr(entry, "Options", NoOptions)
        return options

    def declared(self, name: str) -> Lazy | None:
        """The entry's `Lazy` declaration, read or not (None: a class registered as itself)."""
        return self._declared.get(name)


__all__ = ["Lazy", "Registry", "load"]
