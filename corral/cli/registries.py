"""Every list of plugins a user sees, generated from the registries: `corral config plugins`,
the help of `--policy`, `--trace` and the generated flags (corral.cli.schedflags), and the docs'
tables (scripts/plugin_tables.py, which the tests run with `--check`).

A kind of plugin is one entry of KINDS: its name and a function that reads its registry when
asked and gives one `Row` per entry (name, one-line summary, options or usage). A registry is
imported only when its rows are asked for, so importing this module costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    #: One line: what it does.
    summary: str
    #: A plugin's options, by name ("thresholds_gpu_s, starvation_factor"); a trace format's
    #: usage on the command line ("synthetic:jobs=N,load=L,gpus=G").
    use: str


def plugin_rows(registry: Mapping[str, Any]) -> list[Row]:
    """The rows of a registry of plugin classes: each declares `summary` and, if it has options,
    `Options` (corral.core.plugin)."""
    from corral.core.options import NoOptions, describe

    rows = []
    for name, plugin in registry.items():
        options = getattr(plugin, "Options", NoOptions)
        use = ", ".join(info.name for info in describe(options))
        rows.append(Row(name, str(plugin.summary), use))
    return rows


def policies() -> list[Row]:
    from corral.core.policy import POLICIES

    return plugin_rows(POLICIES)


def placements() -> list[Row]:
    from corral.core.placement import PLACEMENTS

    return plugin_rows(PLACEMENTS)


def admissions() -> list[Row]:
    from corral.core.admission import ADMISSIONS

    return plugin_rows(ADMISSIONS)


def stages() -> list[Row]:
    from corral.core.framework import STAGES

    return plugin_rows(STAGES)


def trace_formats() -> list[Row]:
    from corral.sim.traces import FORMATS

    return [Row(name, entry.summary, entry.usage) for name, entry in FORMATS.items()]


def presets() -> list[Row]:
    from corral.core.presets import PRESETS

    return [Row(name, preset.summary, "") for name, preset in PRESETS.items()]


def executors() -> list[Row]:
    from corral.server.executors import EXECUTORS

    return plugin_rows(EXECUTORS)


#: Every kind of plugin, in the order `corral config plugins` lists them: (kind, its rows). A
#: new kind is one line here, with a function like `policies` that gives `plugin_rows` of its
#: registry.
KINDS: list[tuple[str, Callable[[], list[Row]]]] = [
    ("policy", policies),
    ("placement", placements),
    ("admission", admissions),
    ("stage", stages),
    ("trace format", trace_formats),
    ("executor", executors),
    ("preset", presets),
]


def rows_of(kind: str) -> list[Row]:
    for name, rows in KINDS:
        if name == kind:
            return rows()
    raise KeyError(f"no kind of plugin named {kind!r}")


def names_text(kind: str) -> str:
    """The names of a kind's entries, "fifo, sjf, ..." (for help texts)."""
    return ", ".join(row.name for row in rows_of(kind))


def policy_help() -> str:
    """The help of the `--policy` that `corral simulate`, `up` and `config show` declare."""
    from rich.markup import escape

    from corral.core.framework import CoreOptions

    return escape(
        f"the ordering policy, one of: {names_text('policy')} [default: the scheduler config's, "
        f"{CoreOptions().policy}]"
    )


def preset_help() -> str:
    """The help of the `--preset` that `corral simulate` and `config show` declare."""
    from rich.markup import escape

    return escape(
        f"start from a named configuration, one of: {names_text('preset')} (docs/policies.md); "
        "the file and flags override it"
    )
