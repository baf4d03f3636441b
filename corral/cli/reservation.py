"""`corral reservation create`, `ls` and `delete`: GPUs claimed over a time window for some
users or VCs (docs/server.md, "Reservations").

Plain click commands (the group is listed in corral.cli.main.COMMANDS); the client is imported
when one runs."""

from __future__ import annotations

import re
import time
from datetime import datetime

import click

from corral.cli.client import connected
from corral.cli.output import JSON, TABLE, YAML, Column, emit, output_option, print_data

UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def seconds(text: str, what: str) -> float:
    """`90`, `90s`, `30m`, `4h`, `2d` as seconds; a one-line error naming the option."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([smhd]?)\s*", text)
    if match is None:
        raise click.BadParameter(
            f"{text!r}: seconds, or a number with s, m, h or d", param_hint=what
        )
    return float(match.group(1)) * UNITS[match.group(2) or "s"]


def instant(text: str, now: float) -> float:
    """`now`, `+DURATION` (from now), seconds since the epoch, or a local date and time
    (`2026-12-03T14:00`, `2026-12-03 14:00`)."""
    text = text.strip()
    if text == "now":
        return now
    if text.startswith("+"):
        return now + seconds(text[1:], "--start")
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise click.BadParameter(
            f"{text!r}: now, +DURATION, seconds since the epoch or YYYY-MM-DDTHH:MM",
            param_hint="--start",
        ) from None


def _names(values: tuple[str, ...]) -> list[str]:
    return [name for value in values for name in value.split(",") if name]


def _when(at: object) -> str:
    if not isinstance(at, (int, float)):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


RESERVATION_COLUMNS = (
    Column("NAME", lambda r: r["name"]),
    Column("STATE", lambda r: r["state"]),
    Column("START", lambda r: _when(r["start"])),
    Column("END", lambda r: _when(r["end"])),
    Column("GPUS", lambda r: r["gpu_count"], right=True),
    Column("FOR", lambda r: ",".join([*r["users"], *(f"vc:{v}" for v in r["vcs"])]) or "-"),
    Column("NODES/GPUS", lambda r: ",".join(r["gpus"]), width=40, wide_only=True),
    Column("BY", lambda r: r["by"], wide_only=True),
)


@click.group("reservation")
def reservation_group() -> None:
    """Reservations: GPUs kept for some users or VCs over a time window (admins)."""


@reservation_group.command("create")
@click.argument("name")
@click.option(
    "--gpus",
    type=int,
    help="how many GPUs: those free when the window opens first (idle now, then whose jobs end "
    "by their time limits before it), whole nodes first, from the last node",
)
@click.option("--nodes", "nodes", multiple=True, help="these nodes' GPUs (comma-separated)")
@click.option(
    "--start", required=True, help="now, +DURATION (+2h), seconds since the epoch, or a date"
)
@click.option("--duration", required=True, help="seconds, or with s, m, h, d (4h)")
@click.option("--users", "users", multiple=True, help="users it serves (comma-separated)")
@click.option("--vc", "vcs", multiple=True, help="VCs it serves (comma-separated)")
@output_option(formats=(TABLE, JSON, YAML))
def reservation_create(
    name: str,
    gpus: int | None,
    nodes: tuple[str, ...],
    start: str,
    duration: str,
    users: tuple[str, ...],
    vcs: tuple[str, ...],
    output: str,
) -> None:
    """Keep --gpus N or --nodes LIST for --users or --vc from --start for --duration: within the
    window only they start there; before it another job does only if its time_limit ends by
    the window's start. No users or VCs: a maintenance window (admins only)."""
    if (gpus is None) == (not nodes):
        raise click.UsageError("give --gpus N or --nodes LIST (one of them)")
    length = seconds(duration, "--duration")
    with connected() as client:
        answer = client.create_reservation(
            name,
            start=instant(start, time.time()),
            duration=length,
            gpus=gpus,
            nodes=_names(nodes) or None,
            users=_names(users),
            vcs=_names(vcs),
        )
    if output == TABLE:
        click.echo(
            f"reservation {name}: {answer['summary']}, {_when(answer['start'])} to "
            f"{_when(answer['end'])} ({', '.join(answer['gpus'])})"
        )
    else:
        print_data(answer, output)


@reservation_group.command("ls")
@output_option()
def reservation_ls(output: str) -> None:
    """Every reservation: its window, state (waiting, active, ended), GPUs and whom it serves."""
    with connected() as client:
        reservations = client.reservations()
    emit(reservations, RESERVATION_COLUMNS, output)


@reservation_group.command("delete")
@click.argument("name")
@output_option(formats=(TABLE, JSON, YAML))
def reservation_delete(name: str, output: str) -> None:
    """Delete a reservation: its GPUs serve everyone again (admins only)."""
    with connected() as client:
        answer = client.delete_reservation(name)
    if output == TABLE:
        click.echo(f"reservation {name} deleted")
    else:
        print_data(answer, output)
