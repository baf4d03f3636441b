"""The client commands: submit, ls, describe, logs, cancel, vc ls, token create, profile ls.

They talk to a running `corral up` through corral.client (CORRAL_URL, CORRAL_TOKEN). With
`-o json` a command prints only JSON on stdout, for scripts. A refusal (the server's, or a bad
spec file) is one line on stderr and exit code 1; a usage error exits with 2.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.table import Table

from corral.cli.common import console, err_console, fail

if TYPE_CHECKING:
    from corral.client import Client

REASON_WIDTH = 60  # `ls` truncates the reason column to this many characters
DEFAULT_LS_LIMIT = 50


class Output(StrEnum):
    table = "table"
    json = "json"


class Status(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


OutputOption = Annotated[
    Output, typer.Option("--output", "-o", help="table for people, json for scripts")
]


def refuse(message: str) -> NoReturn:
    """A request that could not be done: one line on stderr, exit code 1."""
    err_console.print(f"[bold red]error:[/] {_escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(1)


@contextmanager
def connected() -> Iterator[Client]:
    """A Client from CORRAL_URL/CORRAL_TOKEN; its errors become one line and exit code 1."""
    from corral.client import Client, ClientError

    try:
        with Client() as client:
            yield client
    except ClientError as error:
        refuse(error.message)


def print_json(value: object) -> None:
    typer.echo(json.dumps(value, indent=2))


# -- submit -----------------------------------------------------------------------------------


def submit(
    file: Annotated[Path, typer.Argument(help="the job spec, YAML or JSON")],
    output: OutputOption = Output.table,
) -> None:
    """Submit a job; print its id (ID=$(corral submit job.yaml))."""
    from corral.client import load_spec_file
    from corral.server.spec import SpecError

    try:
        spec = load_spec_file(file)
    except SpecError as error:
        refuse(str(error))
    # The job runs where it was submitted from, as with sbatch, unless the file says otherwise.
    workdir = os.path.expanduser(spec.get("workdir") or ".")
    spec["workdir"] = os.path.normpath(os.path.join(os.getcwd(), workdir))
    with connected() as client:
        job = client.submit(spec, source=str(file))
    if output is Output.json:
        print_json(job)
    else:
        typer.echo(job["id"])


# -- ls ---------------------------------------------------------------------------------------


def ls(
    all_jobs: Annotated[
        bool,
        typer.Option("--all", "-a", help=f"every job (default: the {DEFAULT_LS_LIMIT} newest)"),
    ] = False,
    status: Annotated[
        Status | None, typer.Option(help="only jobs in this state", case_sensitive=False)
    ] = None,
    vc: Annotated[str | None, typer.Option(help="only this VC's jobs")] = None,
    user: Annotated[str | None, typer.Option(help="only this user's jobs")] = None,
    output: OutputOption = Output.table,
) -> None:
    """List jobs, newest first."""
    with connected() as client:
        jobs = client.jobs(
            status=status.value if status else None,
            vc=vc,
            user=user,
            limit=None if all_jobs else DEFAULT_LS_LIMIT,
        )
    if output is Output.json:
        print_json(jobs)
        return
    if not jobs:
        err_console.print("no jobs", highlight=False)
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in (
        "ID",
        "NAME",
        "USER",
        "VC",
        "STATUS",
        "GPUS",
        "AGE",
        "PROGRESS",
        "ETA",
        "REASON",
    ):
        table.add_column(column, no_wrap=column != "REASON", overflow="ellipsis")
    now = time.time()
    for job in jobs:
        progress = job.get("progress")
        table.add_row(
            job["id"],
            job["name"],
            job["user"],
            job["vc"],
            _status(job["status"]),
            str(job["gpus"]),
            _age(now - job["submitted_at"]),
            _steps(progress),
            _eta(progress),
            _escape(_truncate(job["reason"], REASON_WIDTH)),
        )
    console.print(table, highlight=False)


# -- describe ---------------------------------------------------------------------------------


def describe(
    job_id: Annotated[str, typer.Argument(metavar="JOB", help="the job id")],
    output: OutputOption = Output.table,
) -> None:
    """A job's state, placement, attempts and events, and why it is pending."""
    with connected() as client:
        job = client.job(job_id)
    if output is Output.json:
        print_json(job)
        return
    spec = job.get("spec", {})
    workers = job.get("workers", 1)
    attempts = _attempt_list(job)
    # Field values are rich markup: anything the user wrote is escaped.
    fields: list[tuple[str, str]] = [
        ("Status", _status(job["status"])),
        ("User / VC", _escape(f"{job['user']} / {job['vc']}")),
        ("Priority", job["priority"]),
        ("GPUs", f"{job['gpus']} ({workers} worker{'s' if workers != 1 else ''})"),
    ]
    if job["placement"]:
        fields.append(("Placement", _escape(", ".join(job["placement"]))))
    fields.append(("Submitted", _when(job["submitted_at"])))
    if job["started_at"]:
        fields.append(("Started", _when(job["started_at"])))
    if job["finished_at"]:
        fields.append(("Finished", _when(job["finished_at"])))
    fields.append(
        (
            "Attempts",
            f"{_attempt_count(job)} ({job['failures']} failed, {job['preemptions']} preempted)",
        )
    )
    if job["exit_code"] is not None:
        fields.append(("Exit code", str(job["exit_code"])))
    if job.get("progress"):
        fields.append(("Progress", _progress_line(job["progress"], job.get("progress_history"))))
    problems = job.get("progress_problems")
    if problems:
        fields.append(
            (
                "Reports",
                _escape(
                    f"{problems['malformed_lines']} line(s) were not progress reports "
                    f"(latest: {problems['last_error']})"
                ),
            )
        )
    for measured in job.get("throughput") or []:
        fields.append(("Throughput", _throughput_line(measured)))
    if spec.get("command"):
        command = spec["command"]
        fields.append(
            ("Command", _escape(command if isinstance(command, str) else " ".join(command)))
        )
    if spec.get("workdir"):
        fields.append(("Workdir", _escape(spec["workdir"])))
    console.print(f"[bold]Job {_escape(job['id'])}[/]  {_escape(job['name'])}", highlight=False)
    for label, value in fields:
        console.print(f"  {label + ':':<11} {value}", highlight=False, soft_wrap=True)
    if job["status"] == "PENDING":
        reason = job["reason"] or "not yet considered by the scheduler"
        console.print(f"[bold]Why pending:[/] {_escape(reason)}", highlight=False, soft_wrap=True)
    elif job["reason"]:
        label = "Reason" if job["status"] != "RUNNING" else "Note"
        console.print(
            f"[bold]{label}:[/] {_escape(job['reason'])}", highlight=False, soft_wrap=True
        )
    if attempts:
        console.print()
        table = Table(title="Attempts", title_justify="left", box=None, header_style="bold")
        for column in ("#", "GPUS", "STARTED", "ENDED", "STATE", "OUTCOME", "EXIT", "REASON"):
            table.add_column(column, overflow="fold")
        for attempt in attempts:
            table.add_row(
                str(attempt["number"]),
                _escape(",".join(attempt["gpus"])),
                _clock(attempt["started_at"]),
                _clock(attempt["ended_at"]),
                attempt["state"],
                attempt["outcome"] or "",
                "" if attempt["exit_code"] is None else str(attempt["exit_code"]),
                _escape(attempt["reason"] or ""),
            )
        console.print(table, highlight=False)
    events = sorted(job.get("events", []), key=lambda event: event["at"])
    if events:
        console.print()
        table = Table(title="Events", title_justify="left", box=None, header_style="bold")
        for column in ("TIME", "EVENT", "MESSAGE"):
            table.add_column(column, overflow="fold")
        for event in events:
            table.add_row(_clock(event["at"]), event["kind"], _escape(event["message"]))
        console.print(table, highlight=False)


# -- logs -------------------------------------------------------------------------------------


def logs(
    job_id: Annotated[str, typer.Argument(metavar="JOB", help="the job id")],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="keep printing until the job ends")
    ] = False,
    attempt: Annotated[
        int | None, typer.Option(min=1, help="this attempt (default: the latest)")
    ] = None,
    rank: Annotated[int, typer.Option(min=0, help="this worker's output")] = 0,
    stderr: Annotated[bool, typer.Option("--stderr", help="stderr instead of stdout")] = False,
    tail: Annotated[
        int | None,
        typer.Option(
            "--tail",
            "-n",
            min=0,
            max=1_000_000,
            help="only the last N lines (with -f: then follow)",
        ),
    ] = None,
) -> None:
    """Print a job's output (one worker's stdout or stderr)."""
    stream = "stderr" if stderr else "stdout"
    with connected() as client:
        if attempt is not None:
            job = client.job(job_id)
            had = _attempt_count(job)
            if attempt > had and job["status"] not in ("PENDING", "RUNNING"):
                refuse(f"job {job_id} has no attempt {attempt} (it had {had})")
        if follow:
            try:
                for text in client.follow_logs(job_id, attempt, rank, stream, tail=tail):
                    sys.stdout.write(text)
                    sys.stdout.flush()
            except KeyboardInterrupt:
                raise typer.Exit(130) from None
            return
        offset = 0
        number = attempt
        while True:  # the server sends at most 1 MiB per call
            chunk = client.log_chunk(job_id, number, rank, stream, offset, tail)
            tail = None  # the first call only: then on from its offset
            number = number or chunk.attempt or None
            if not chunk.text:
                break
            sys.stdout.write(chunk.text)
            offset = chunk.next_offset
        sys.stdout.flush()


# -- cancel -----------------------------------------------------------------------------------


def cancel(
    job_id: Annotated[str, typer.Argument(metavar="JOB", help="the job id")],
    output: OutputOption = Output.table,
    array: Annotated[
        bool, typer.Option("--array", help="JOB is an array's id: cancel each unfinished task")
    ] = False,
) -> None:
    """Cancel a pending or running job (its processes get their signal, then SIGKILL)."""
    with connected() as client:
        job = client.cancel(job_id, array=array)
    if output is Output.json:
        print_json(job)
    if array:
        if output is Output.table:
            typer.echo(f"array {job_id} cancelled")
        return
    if job["status"] != "CANCELLED":
        refuse(f"job {job_id} already ended ({job['status']}); nothing to cancel")
    if output is Output.table:
        typer.echo(f"job {job_id} cancelled")


# -- vc ---------------------------------------------------------------------------------------

vc_app = typer.Typer(no_args_is_help=True, help="Virtual clusters (teams' GPU shares).")


@vc_app.command("ls")
def vc_ls(output: OutputOption = Output.table) -> None:
    """The VCs: guaranteed GPUs, GPUs in use, pending and running jobs."""
    with connected() as client:
        vcs = client.vcs()
    if output is Output.json:
        print_json(vcs)
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("VC", "GUARANTEED", "ALLOCATED", "PENDING", "RUNNING"):
        table.add_column(column, justify="left" if column == "VC" else "right")
    for vc in vcs:
        table.add_row(
            vc["name"],
            str(vc["guaranteed_gpus"]),
            str(vc["allocated_gpus"]),
            str(vc["pending"]),
            str(vc["running"]),
        )
    console.print(table, highlight=False)


# -- token ------------------------------------------------------------------------------------

token_app = typer.Typer(no_args_is_help=True, help="API tokens (admins only).")


@token_app.command("create")
def token_create(
    user: Annotated[str, typer.Argument(help="the user the token acts as")],
    vc: Annotated[
        str | None, typer.Option(help="the user's VC: they submit there and read its jobs")
    ] = None,
    admin: Annotated[bool, typer.Option("--admin", help="an admin token")] = False,
    expires: Annotated[
        str | None,
        typer.Option(
            metavar="DURATION", help="it stops working after this long: 90s, 30m, 12h, 7d, 1w"
        ),
    ] = None,
    unix_user: Annotated[
        str | None,
        typer.Option(
            metavar="ACCOUNT",
            help="the Unix account the user's jobs run as (default: the one named like USER)",
        ),
    ] = None,
    output: OutputOption = Output.table,
) -> None:
    """Create a token and print it (the only time it is shown)."""
    expires_in = None if expires is None else parse_duration("--expires", expires)
    with connected() as client:
        created = client.create_token(
            user, vc=vc, admin=admin, unix_user=unix_user, expires_in=expires_in
        )
    if output is Output.json:
        print_json(created)
    else:
        typer.echo(created["token"])


@token_app.command("ls")
def token_ls(output: OutputOption = Output.table) -> None:
    """Every token: id, user, VC, admin, Unix account, created, expires, revoked (never the
    secret)."""
    with connected() as client:
        tokens = client.tokens()
    if output is Output.json:
        print_json(tokens)
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("ID", "USER", "VC", "ADMIN", "UNIX USER", "CREATED", "EXPIRES", "REVOKED"):
        table.add_column(column, overflow="fold")
    for token in tokens:
        expires = token["expires_at"]
        table.add_row(
            token["id"],
            _escape(token["user"]),
            _escape(token["vc"] or "-"),
            "yes" if token["admin"] else "",
            _escape(token["unix_user"] or "-"),
            _date(token["created_at"]),
            ""
            if expires is None
            else _date(expires) + (" (expired)" if token["state"] == "expired" else ""),
            _date(token["revoked_at"]),
        )
    console.print(table, highlight=False)


@token_app.command("revoke")
def token_revoke(
    who: Annotated[
        str,
        typer.Argument(
            metavar="USER|ID", help="a user (all their tokens) or one token's id (corral token ls)"
        ),
    ],
    as_user: Annotated[bool, typer.Option("--user", help="USER|ID is a user")] = False,
    as_id: Annotated[bool, typer.Option("--id", help="USER|ID is a token's id")] = False,
    output: OutputOption = Output.table,
) -> None:
    """Revoke a user's every token, or one token: refused from now on."""
    if as_user and as_id:
        fail("--user and --id: give one of them, or neither")
    with connected() as client:
        tokens = [] if as_user or as_id else client.tokens()
        is_id = as_id or any(token["id"] == who for token in tokens)
        is_user = as_user or any(token["user"] == who for token in tokens)
        if is_id and is_user:
            refuse(f"{who} is both a token id and a user: say which with --id or --user")
        if is_id:
            revoked = [client.revoke_token(who)]
        elif is_user:
            revoked = client.revoke_user_tokens(who)
        else:
            refuse(f"no token has the id {who} and no user {who} has tokens (see corral token ls)")
    if output is Output.json:
        print_json(revoked)
        return
    if not revoked:
        typer.echo(f"no token of {who} left to revoke")
    for token in revoked:
        typer.echo(f"revoked token {token['id']} of {token['user']}")


DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(option: str, text: str) -> float:
    """30m, 12h, 7d, 1w (or 90s) in seconds; a usage error (one line, exit 2) otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text.lower())
    seconds = float(match.group(1)) * DURATION_UNITS[match.group(2)] if match else 0.0
    if seconds <= 0:
        fail(_escape(f"{option}: expected a duration such as 30m, 12h, 7d or 1w, got {text!r}"))
    return seconds


# -- profile ------------------------------------------------------------------------------------

profile_app = typer.Typer(
    no_args_is_help=True, help="Throughput measured per model and placement (from job progress)."
)


@profile_app.command("ls")
def profile_ls(
    model: Annotated[str | None, typer.Option(help="only this model")] = None,
    output: OutputOption = Output.table,
) -> None:
    """Steps/s each model ran at, per GPU type, GPU count, nodes spanned and sharing partner."""
    with connected() as client:
        profiles = client.profiles()
    if model is not None:
        profiles = [row for row in profiles if row["model"] == model]
    if output is Output.json:
        print_json(profiles)
        return
    if not profiles:
        err_console.print(
            "nothing measured yet: jobs report progress through $CORRAL_PROGRESS_FILE "
            "(docs/progress.md)",
            highlight=False,
        )
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in (
        "MODEL",
        "GPU TYPE",
        "GPUS",
        "NODES",
        "SHARED WITH",
        "STEPS/S",
        "SAMPLES/S",
        "MEASURED",
        "RUNS",
        "UPDATED",
    ):
        table.add_column(
            column, justify="left" if column in ("MODEL", "GPU TYPE", "SHARED WITH") else "right"
        )
    now = time.time()
    for row in profiles:
        samples = row["samples_per_s"]
        table.add_row(
            _escape(row["model"]),
            _escape(row["gpu_type"]),
            str(row["gpus"]),
            str(row["nodes"]),
            _escape(row["colocated"]) or "-",
            f"{row['steps_per_s']:.3g}",
            "" if samples is None else f"{samples:.4g}",
            _age(row["seconds"]),
            str(row["runs"]),
            f"{_age(now - row['updated_at'])} ago",
        )
    console.print(table, highlight=False)


def register(app: typer.Typer) -> None:
    app.command("submit")(submit)
    app.command("ls")(ls)
    app.command("describe")(describe)
    app.command("logs")(logs)
    app.command("cancel")(cancel)
    from corral.cli import controls  # hold, release, requeue

    controls.register(app)
    app.add_typer(vc_app, name="vc")
    app.add_typer(token_app, name="token")
    app.add_typer(profile_app, name="profile")


# -- formatting -------------------------------------------------------------------------------

STATUS_STYLE = {
    "PENDING": "yellow",
    "RUNNING": "cyan",
    "SUCCEEDED": "green",
    "FAILED": "red",
    "CANCELLED": "magenta",
}


def _status(status: str) -> str:
    style = STATUS_STYLE.get(status)
    return f"[{style}]{status}[/]" if style else status


def _attempt_list(job: dict[str, Any]) -> list[dict[str, Any]]:
    """A job detail's attempts (`attempt_history`; older servers listed them in `attempts`)."""
    listed = job.get("attempt_history", job["attempts"])
    return listed if isinstance(listed, list) else []


def _attempt_count(job: dict[str, Any]) -> int:
    attempts = job["attempts"]
    return len(attempts) if isinstance(attempts, list) else int(attempts)


def _escape(text: Any) -> str:
    from rich.markup import escape

    return escape(str(text))


def _number(value: float) -> str:
    return f"{value:.0f}" if value == int(value) else f"{value:.4g}"


def _steps(progress: dict[str, Any] | None) -> str:
    """`ls`'s PROGRESS: the step, of the total where declared, and the share done."""
    if not progress:
        return ""
    step, total = progress["step"], progress.get("total_steps")
    if not total:
        return _number(step)
    return f"{_number(step)}/{_number(total)} {min(step / total, 1.0):.0%}"


def _eta(progress: dict[str, Any] | None) -> str:
    eta = (progress or {}).get("eta_s")
    return "" if eta is None else _age(eta)


def _progress_line(progress: dict[str, Any], history: list[dict[str, Any]] | None) -> str:
    """`describe`'s progress: step, rate, ETA and the loss with its trend over the history."""
    parts = [f"step {_steps(progress)}"]
    if progress.get("steps_per_s"):
        parts.append(f"{progress['steps_per_s']:.3g} steps/s")
    if progress.get("eta_s") is not None:
        parts.append(f"ETA {_age(progress['eta_s'])}")
    losses = [point["loss"] for point in history or [] if point.get("loss") is not None]
    if progress.get("loss") is not None:
        losses.append(progress["loss"])
        trend = ""
        if len(losses) >= 2 and losses[0] != losses[-1]:
            arrow = "down" if losses[-1] < losses[0] else "up"
            trend = f" ({arrow} from {losses[0]:.4g})"
        parts.append(f"loss {progress['loss']:.4g}{trend}")
    parts.append(f"reported {_age(time.time() - progress['updated_at'])} ago")
    return ", ".join(parts)


def _throughput_line(measured: dict[str, Any]) -> str:
    spread = f" over {measured['nodes']} nodes" if measured["nodes"] > 1 else ""
    return (
        f"{measured['steps_per_s']:.3g} steps/s on {measured['gpus']} x "
        f"{_escape(measured['gpu_type'])}{spread} ({measured['runs']} run"
        f"{'s' if measured['runs'] != 1 else ''}, {_age(measured['seconds'])} measured)"
    )


def _truncate(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def _clock(at: float | None) -> str:
    return "" if at is None else datetime.fromtimestamp(at).strftime("%H:%M:%S")


def _date(at: float | None) -> str:
    return "" if at is None else datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M")


def _when(at: float) -> str:
    stamp = datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M:%S")
    return f"{stamp} ({_age(time.time() - at)} ago)"
