"""`corral usage`: GPU-hours, jobs and queueing per user or VC over a period (the server's
GET /api/v1/usage), like Slurm's `sreport`."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any

import typer

from corral.cli.client import DURATION_UNITS, Output, OutputOption, connected, print_json
from corral.cli.common import console, fail


class By(StrEnum):
    user = "user"
    vc = "vc"


def parse_instant(option: str, text: str, now: float) -> float:
    """A duration back from `now` (30m, 12h, 7d, 1w, 90s) or an ISO date or time (UTC unless it
    names its offset), in epoch seconds; a usage error (one line, exit 2) otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text.lower())
    if match:
        return now - float(match.group(1)) * DURATION_UNITS[match.group(2)]
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        shown = text if len(text) <= 40 else text[:40] + "..."
        fail(
            f"{option}: expected a duration back from now (30m, 12h, 7d, 1w) or an ISO date "
            f"(2026-11-01, 2026-11-01T08:00), got {shown!r}"
        )
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return at.timestamp()


def usage(
    since: Annotated[
        str, typer.Option(help="the period's start: 7d, 12h, 30m back from now, or an ISO date")
    ],
    until: Annotated[
        str | None, typer.Option(help="the period's end (excluded), as --since; default: now")
    ] = None,
    by: Annotated[By, typer.Option(help="one row per user or per VC")] = By.user,
    output: OutputOption = Output.table,
) -> None:
    """GPU-hours, jobs submitted and ended, and queueing per user or VC over a period."""
    now = time.time()
    start = parse_instant("--since", since, now)
    end = now if until is None else parse_instant("--until", until, now)
    if end <= start:
        fail(f"--until: must be after --since ({_stamp(end)} is not after {_stamp(start)})")
    with connected() as client:
        report = client.usage(start, end, by.value)
    if output is Output.json:
        print_json(report)
        return
    from rich.table import Table

    table = Table(
        box=None,
        header_style="bold",
        pad_edge=False,
        title=f"usage {_stamp(start)} to {_stamp(end)} (UTC)",
    )
    for column in (
        by.value.upper(),
        "GPU-HOURS",
        "SUBMITTED",
        "SUCCEEDED",
        "FAILED",
        "CANCELLED",
        "STARTED",
        "MEAN WAIT",
        "P95 WAIT",
    ):
        table.add_column(column, justify="left" if column == by.value.upper() else "right")
    rows: list[dict[str, Any]] = report["rows"]
    for row in [*rows, report["total"]]:
        ended = row["finished"]
        table.add_row(
            _escape(row["key"]) if row is not report["total"] else "[bold]total[/]",
            f"{row['gpu_hours']:.2f}",
            str(row["submitted"]),
            str(ended.get("SUCCEEDED", 0)),
            str(ended.get("FAILED", 0)),
            str(ended.get("CANCELLED", 0)),
            str(row["started"]),
            _wait(row["mean_wait_s"]),
            _wait(row["p95_wait_s"]),
        )
    console.print(table, highlight=False)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _stamp(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M")


def _wait(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"
