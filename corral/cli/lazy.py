"""A command group whose heavier commands are built only when they are called.

`corral simulate`, `corral up` and `corral config` take flags generated from the plugin
registries (corral.cli.schedflags), which means importing the scheduling core. Built eagerly,
every `corral submit` would pay for that; here such a command is a name and the function that
builds it, and click asks for it only when it runs it or lists it in `--help`.
"""

from __future__ import annotations

import importlib
from typing import Any, ClassVar

from typer.core import TyperGroup


class LazyGroup(TyperGroup):
    #: name -> "module:function" returning the click command; filled by corral.cli.main.
    lazy: ClassVar[dict[str, str]] = {}
    #: the order `--help` lists commands in (others follow in registration order).
    order: ClassVar[list[str]] = []

    def list_commands(self, ctx: Any) -> list[str]:
        names = [*super().list_commands(ctx), *(n for n in self.lazy if n not in self.commands)]
        ranked = {name: i for i, name in enumerate(self.order)}
        return sorted(names, key=lambda n: ranked.get(n, len(ranked)))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            module, _, function = self.lazy[cmd_name].partition(":")
            self.commands[cmd_name] = getattr(importlib.import_module(module), function)()
        return super().get_command(ctx, cmd_name)
