"""How the client commands print what they list: one `-o` option and one printer for all.

    @click.command()
    @output_option(default="table")
    def things(output: str) -> None:
        rows = client.things()
        emit(rows, THING_COLUMNS, output)

`-o table` is a plain aligned text table (as squeue prints: it draws 10,000 rows in a few
tens of milliseconds, where rich took seconds); `-o wide` adds the columns marked wide and never
shortens a cell; `-o json` prints the server's records unchanged (scripts read them: keep them
backward compatible); `-o yaml` the same as YAML. The module imports only click; yaml is
imported when asked for.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import click

TABLE, WIDE, JSON, YAML = "table", "wide", "json", "yaml"
FORMATS = (TABLE, WIDE, JSON, YAML)
GAP = "  "  # between columns
_OUTPUT_HELP = "table for people, wide for more columns, json or yaml for scripts"


@dataclass(frozen=True, slots=True)
class Column:
    """A column of a table: its header, the cell of a record, and where it is shown."""

    header: str
    cell: Callable[[dict[str, Any]], object]
    wide_only: bool = False  # only with -o wide
    right: bool = False  # numbers: aligned right
    width: int | None = None  # -o table shortens a longer cell to this (wide never does)


def output_option(default: str = TABLE, formats: Sequence[str] = FORMATS) -> Any:
    """The `-o/--output` option of a listing command."""
    return click.option(
        "--output",
        "-o",
        type=click.Choice(list(formats), case_sensitive=False),
        default=default,
        show_default=True,
        help=_OUTPUT_HELP if WIDE in formats else "table for people, json or yaml for scripts",
    )


def print_data(value: object, fmt: str) -> None:
    """The records as JSON (indented, as corral always printed them) or YAML."""
    if fmt == YAML:
        import yaml

        sys.stdout.write(yaml.safe_dump(value, sort_keys=False, allow_unicode=True))
    else:
        sys.stdout.write(json.dumps(value, indent=2) + "\n")


def emit(
    records: Sequence[dict[str, Any]],
    columns: Sequence[Column],
    fmt: str,
    *,
    data: object | None = None,
    empty: str | None = None,
) -> None:
    """Print `records` as `fmt` asks: a table of `columns`, or `data` (default: the records)
    as JSON/YAML. `empty` goes to stderr when a table has no rows."""
    if fmt in (JSON, YAML):
        print_data(records if data is None else data, fmt)
        return
    if not records and empty is not None:
        click.echo(empty, err=True)
        return
    wide = fmt == WIDE
    shown = [column for column in columns if wide or not column.wide_only]
    rows = ([_cell(column, record, wide) for column in shown] for record in records)
    sys.stdout.write(table_text([column.header for column in shown], rows, shown))


def table_text(
    headers: Sequence[str],
    rows: Iterable[Sequence[str]],
    columns: Sequence[Column] | None = None,
) -> str:
    """An aligned plain-text table: columns two spaces apart, the last one not padded (a long
    last cell, such as a reason, runs on rather than being cut)."""
    body = [list(row) for row in rows]
    widths = [len(header) for header in headers]
    for row in body:
        for i, cell in enumerate(row):
            if len(cell) > widths[i]:
                widths[i] = len(cell)
    right = [bool(columns and columns[i].right) for i in range(len(headers))]
    last = len(headers) - 1
    lines = []
    for row in [list(headers), *body]:
        parts = []
        for i, cell in enumerate(row):
            if i == last:
                parts.append(cell.rjust(widths[i]) if right[i] else cell)
            else:
                parts.append(cell.rjust(widths[i]) if right[i] else cell.ljust(widths[i]))
        lines.append(GAP.join(parts).rstrip())
    return "\n".join(lines) + "\n"


def shorten(text: str, width: int) -> str:
    """One line, at most `width` characters: a longer text ends with an ellipsis."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def plural(count: int, noun: str, many: str | None = None) -> str:
    """`1 node`, `2 nodes` (`many` where adding an s is wrong)."""
    return f"{count} {noun if count == 1 else many or noun + 's'}"


def _cell(column: Column, record: dict[str, Any], wide: bool) -> str:
    value = column.cell(record)
    text = "" if value is None else " ".join(str(value).split())
    if column.width is not None and not wide:
        text = shorten(text, column.width)
    return text
