"""`corral usage`: GPU-hours, jobs and queueing per user or VC over a period (the server's
GET /api/v1/usage), like Slurm's `sreport`. A plain click command (corral.cli.main.COMMANDS)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import click

from corral.cli.client import connected, duration_seconds, usage_error
from corral.cli.output import JSON, TABLE, WIDE, YAML, Column, emit, output_option


def parse_instant(option: str, text: str, now: float) -> float:
    """A duration back from `now` (30m, 12h, 7d, 1w, 90s) or an ISO date or time (UTC unless it
    names its offset), in epoch seconds; a usage error (one line, exit 2) otherwise."""
    back = duration_seconds(text)
    if back is not None:
        return now - back
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        shown = text if len(text) <= 40 else text[:40] + "..."
        usage_error(
            f"{option}: expected a duration back from now (30m, 12h, 7d, 1w) or an ISO date "
            f"(2026-11-01, 2026-11-01T08:00), got {shown!r}"
        )
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return at.timestamp()


def _columns(by: str, refused: bool = False) -> tuple[Column, ...]:
    """The table's columns; REFUSED (ElasticFlow's admission) only where some job was."""

    def ended(status: str) -> Column:
        return Column(status, lambda row: row["finished"].get(status, 0), right=True)

    return (
        Column(by.upper(), lambda row: row["key"]),
        Column("GPU-HOURS", lambda row: f"{row['gpu_hours']:.2f}", right=True),
        Column("SUBMITTED", lambda row: row["submitted"], right=True),
        ended("SUCCEEDED"),
        ended("FAILED"),
        ended("CANCELLED"),
        *([ended("REFUSED")] if refused else []),
        Column("STARTED", lambda row: row["started"], right=True),
        Column("MEAN WAIT", lambda row: _wait(row["mean_wait_s"]), right=True),
        Column("P95 WAIT", lambda row: _wait(row["p95_wait_s"]), right=True),
    )


@click.command()
@click.option(
    "--since", required=True, help="the period's start: 7d, 12h, 30m back from now, or an ISO date"
)
@click.option("--until", help="the period's end (excluded), as --since; default: now")
@click.option(
    "--by",
    type=click.Choice(["user", "vc"]),
    default="user",
    show_default=True,
    help="one row per user or per VC",
)
@output_option(formats=(TABLE, WIDE, JSON, YAML))
def usage(since: str, until: str | None, by: str, output: str) -> None:
    """GPU-hours, jobs submitted and ended, and queueing per user or VC over a period."""
    now = time.time()
    start = parse_instant("--since", since, now)
    end = now if until is None else parse_instant("--until", until, now)
    if end <= start:
        usage_error(f"--until: must be after --since ({_stamp(end)} is not after {_stamp(start)})")
    with connected() as client:
        report = client.usage(start, end, by)
    if output in (JSON, YAML):
        emit([], (), output, data=report)
        return
    click.echo(f"usage {_stamp(start)} to {_stamp(end)} (UTC)")
    total: dict[str, Any] = {**report["total"], "key": "total"}
    refused = bool(total["finished"].get("REFUSED"))
    emit([*report["rows"], total], _columns(by, refused), output)


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
