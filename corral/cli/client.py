"""The client commands: submit, ls, queue, describe, logs, cancel, vc ls, token, profile.

They talk to a running `corral up` through corral.client (CORRAL_URL, CORRAL_TOKEN). They are
plain click commands and import neither typer, rich, numpy nor the scheduling core: a call
starts in about 0.1 s (benchmarks/cli_speed.py). With `-o json` (or yaml) a command prints only
the records on stdout, for scripts. A refusal (the server's, or an unreadable spec file) is one
line on stderr and exit code 1; a usage error exits with 2.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, NoReturn

import click

from corral.cli.output import (
    JSON,
    TABLE,
    YAML,
    Column,
    emit,
    output_option,
    plural,
    print_data,
    table_text,
)

if TYPE_CHECKING:
    from corral.client import JsonClient

DEFAULT_LS_LIMIT = 50
STATUSES = ("PENDING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED", "REFUSED")
#: The scheduler's explanation of a pending job starts with its place in the queue; `ls` shows
#: the status in its own column, so its REASON starts after that prefix.
QUEUE_PREFIX = re.compile(r"^PENDING, position \d+ of \d+ in the queue(; )?")


def refuse(message: str) -> NoReturn:
    """A request that could not be done: one line on stderr, exit code 1."""
    click.echo(f"error: {' '.join(message.split())}", err=True)
    raise click.exceptions.Exit(1)


def usage_error(message: str) -> NoReturn:
    """A usage error: one line on stderr, exit code 2."""
    click.echo(f"error: {' '.join(message.split())}", err=True)
    raise click.exceptions.Exit(2)


@contextmanager
def connected() -> Iterator[JsonClient]:
    """A client from CORRAL_URL/CORRAL_TOKEN answering the server's JSON (what the commands
    print); its errors become one line and exit code 1."""
    from corral.client import ClientError, JsonClient

    try:
        with JsonClient() as client:
            yield client
    except ClientError as error:
        refuse(error.message)


def job_option(function: Any) -> Any:
    return click.argument("job_id", metavar="JOB")(function)


# -- submit -----------------------------------------------------------------------------------

#: `--set KEY=VALUE`: the value is read as YAML (2 is a number, [a, b] a list, true a boolean).
SET_HELP = "set a field of the spec: KEY=VALUE, VALUE read as YAML (repeatable; env.NAME=...)"


class SubmitCommand(click.Command):
    """`corral submit [FILE] [flags] [-- COMMAND...]`: what follows `--` is the job's command
    line, taken whole (its own flags are not corral's)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            at = args.index("--")
            args, ctx.meta["corral.command"] = args[:at], args[at + 1 :]
        return super().parse_args(ctx, args)

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_usage(ctx.command_path, "[OPTIONS] [FILE] [-- COMMAND...]")


@click.command(cls=SubmitCommand)
@click.argument("file", required=False, type=click.Path(dir_okay=False))
@click.option("--name", help="the job's name")
@click.option("--gpus", type=float, help="GPUs (a share of one GPU: 0.5)")
@click.option("--workers", type=click.IntRange(min=1), help="processes; each gets gpus/workers")
@click.option("--vc", help="the VC to submit to (default: your token's)")
@click.option("--priority", help="the job's priority class (see docs/job-spec.md)")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE", help=SET_HELP)
@output_option(formats=(TABLE, JSON, YAML))
@click.pass_context
def submit(
    ctx: click.Context,
    file: str | None,
    name: str | None,
    gpus: float | None,
    workers: int | None,
    vc: str | None,
    priority: str | None,
    settings: tuple[str, ...],
    output: str,
) -> None:
    """Submit a job; print its id (ID=$(corral submit job.yaml)).

    FILE is a job spec (YAML or JSON); the flags override its fields. Without a file, give the
    command after `--`: corral submit --gpus 2 --name x -- python train.py --lr 0.1
    """
    from corral.client import SpecFileError, load_spec_file

    command: list[str] = ctx.meta.get("corral.command", [])
    spec: dict[str, Any] = {}
    source = None
    if file is not None:
        try:
            spec = load_spec_file(file)
        except SpecFileError as error:
            refuse(error.message)
        source = file
    elif not command:
        usage_error("give a job spec FILE, or the command after --: corral submit -- CMD ...")
    if command:
        spec["command"] = command
    for key, value in (("name", name), ("workers", workers), ("vc", vc), ("priority", priority)):
        if value is not None:
            spec[key] = value
    if gpus is not None:
        spec["gpus"] = int(gpus) if gpus == int(gpus) else gpus
    for setting in settings:
        _set_field(spec, setting)
    if file is None and "gpus" not in spec:  # the spec's one required field, given by a flag
        usage_error("--gpus is required: the GPUs the job needs (--gpus 1; a share of one: 0.5)")
    if "name" not in spec and file is None:
        spec["name"] = _name_of(command)
    # The job runs where it was submitted from, as with sbatch, unless the file says otherwise.
    workdir = spec.get("workdir")
    workdir = os.path.expanduser(workdir if isinstance(workdir, str) and workdir else ".")
    spec["workdir"] = os.path.normpath(os.path.join(os.getcwd(), workdir))
    with connected() as client:
        job = client.submit(spec, source=source)
    if output == TABLE:
        click.echo(job["id"])
    else:
        print_data(job, output)
    if job["status"] == "REFUSED":  # stored, and will never run (ElasticFlow's admission)
        refuse(f"job {job['id']} was refused: {job['reason'].removeprefix('refused: ')}")


def _set_field(spec: dict[str, Any], setting: str) -> None:
    """`--set a.b=VALUE`: spec["a"]["b"] = VALUE read as YAML."""
    import yaml

    key, equals, text = setting.partition("=")
    path = key.strip().split(".")
    if not equals or not all(path):
        usage_error(f"--set: expected KEY=VALUE (e.g. max_retries=2), got {setting!r}")
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        value = text
    target = spec
    for part in path[:-1]:
        inner = target.setdefault(part, {})
        if not isinstance(inner, dict):
            usage_error(f"--set {key}: {part} is not a mapping in the spec")
        target = inner
    target[path[-1]] = value


def _name_of(command: list[str]) -> str:
    """A job name from its command line: the script's or program's name (train.py -> train)."""
    words = [w for w in command if not w.startswith("-")]
    scripts = [w for w in words if w.endswith((".py", ".sh"))]
    base = os.path.basename(scripts[0] if scripts else words[0] if words else "job")
    name = re.sub(r"[^A-Za-z0-9._-]", "-", base.rsplit(".", 1)[0] or base)[:63].strip("-.")
    return name or "job"


# -- ls ---------------------------------------------------------------------------------------


def _reason(job: dict[str, Any]) -> str:
    return QUEUE_PREFIX.sub("", job["reason"] or "")


JOB_COLUMNS = (
    Column("ID", lambda j: j["id"]),
    Column("NAME", lambda j: j["name"]),
    Column("USER", lambda j: j["user"]),
    Column("VC", lambda j: j["vc"]),
    Column("STATUS", lambda j: j["status"]),
    Column("GPUS", lambda j: j["gpus"]),
    Column("WORKERS", lambda j: j.get("workers", 1), wide_only=True),
    Column("PRIORITY", lambda j: j["priority"], wide_only=True),
    Column("AGE", lambda j: _age(time.time() - j["submitted_at"])),
    Column("PROGRESS", lambda j: _steps(j.get("progress"))),
    Column("ETA", lambda j: _eta(j.get("progress"))),
    Column("ATTEMPTS", lambda j: j["attempts"], wide_only=True),
    Column("PLACEMENT", lambda j: ",".join(j.get("placement") or []) or "-", wide_only=True),
    Column("REASON", _reason),  # last: whole, however long (as kubectl's last column)
)


@click.command()
@click.option(
    "--all",
    "-a",
    "all_jobs",
    is_flag=True,
    help=f"every job (default: the {DEFAULT_LS_LIMIT} newest)",
)
@click.option("--limit", "-n", type=click.IntRange(min=1), help="the N newest jobs")
@click.option(
    "--status",
    type=click.Choice(STATUSES, case_sensitive=False),
    help="only jobs in this state",
)
@click.option("--vc", help="only this VC's jobs")
@click.option("--user", help="only this user's jobs")
@click.option("--name", help="only jobs of this name (an array's: its tasks) or glob ('sweep*')")
@output_option()
def ls(
    all_jobs: bool,
    limit: int | None,
    status: str | None,
    vc: str | None,
    user: str | None,
    name: str | None,
    output: str,
) -> None:
    """List jobs, newest first.

    The server filters and pages: `corral ls --all` reads 10,000 jobs a request. --name takes a
    name (an array's name: its tasks, NAME[i]) or a shell glob ('sweep*'). The table is plain
    text, its last column, the reason, whole however long; -o wide adds columns.
    """
    if all_jobs and limit is not None:
        usage_error("--all and --limit: give one of them")
    with connected() as client:
        jobs = client.jobs(
            status=status.upper() if status else None,
            vc=vc,
            user=user,
            name=name,
            limit=None if all_jobs else limit or DEFAULT_LS_LIMIT,
        )
    emit(jobs, JOB_COLUMNS, output, empty="no jobs")


# -- queue ------------------------------------------------------------------------------------

QUEUE_COLUMNS = (
    Column("POS", lambda j: j["position"], right=True),
    Column("ID", lambda j: j["id"]),
    Column("NAME", lambda j: j["name"]),
    Column("USER", lambda j: j["user"]),
    Column("VC", lambda j: j["vc"]),
    Column("GPUS", lambda j: j["gpus"], right=True),
    Column("PRIORITY", lambda j: j["priority"]),
    Column("WAIT", lambda j: _age(time.time() - j["submitted_at"])),
    Column("ATTEMPTS", lambda j: j["attempts"], wide_only=True),
    Column("REASON", _reason),  # last: whole, however long (as kubectl's last column)
)


@click.command()
@click.option(
    "--limit",
    "-n",
    type=click.IntRange(1, 10_000),
    default=100,
    show_default=True,
    help="the first N waiting jobs",
)
@output_option()
def queue(limit: int, output: str) -> None:
    """The pending jobs in the order the scheduler considers them: position, priority, how
    long each has waited and why."""
    with connected() as client:
        found = client.queue(limit)
    jobs = [job | {"position": i} for i, job in enumerate(found["jobs"], start=1)]
    if output in (JSON, YAML):
        print_data({"total": found["total"], "jobs": jobs}, output)
        return
    emit(jobs, QUEUE_COLUMNS, output, empty="no job is waiting")
    if found["total"] > len(jobs):
        click.echo(f"({found['total'] - len(jobs)} more waiting: --limit)", err=True)


# -- describe ---------------------------------------------------------------------------------


@click.command()
@job_option
@output_option(formats=(TABLE, JSON, YAML))
def describe(job_id: str, output: str) -> None:
    """A job's state, placement, attempts and events, and why it is pending."""
    with connected() as client:
        job = client.job(job_id)
    if output != TABLE:
        print_data(job, output)
        return
    click.echo(describe_text(job), nl=False)


def describe_text(job: dict[str, Any]) -> str:
    spec = job.get("spec", {})
    workers = job.get("workers", 1)
    attempts = _attempt_list(job)
    live = job["status"] in ("PENDING", "RUNNING")
    fields: list[tuple[str, str]] = [
        ("Status", job["status"]),
        ("User / VC", f"{job['user']} / {job['vc']}"),
        ("Priority", job["priority"]),
        ("GPUs", f"{job['gpus']} ({plural(workers, 'worker')})"),
    ]
    if job["placement"]:
        fields.append(("Placement", ", ".join(job["placement"])))
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
    # A pending or running job's exit code is an earlier attempt's: the attempts list has it.
    if job["exit_code"] is not None and not live:
        fields.append(("Exit code", str(job["exit_code"])))
    if job.get("progress"):
        fields.append(("Progress", _progress_line(job["progress"], job.get("progress_history"))))
    if job.get("estimate"):
        estimate = job["estimate"]
        fields.append(("Remaining", f"{_age(estimate['remaining_s'])} ({estimate['basis']})"))
    problems = job.get("progress_problems") or {}
    if problems.get("malformed_lines") or problems.get("last_error"):
        fields.append(
            (
                "Reports",
                f"{problems['malformed_lines']} line(s) were not progress reports "
                f"(latest: {problems['last_error']})",
            )
        )
    if problems.get("rejected"):
        fields.append(("Reports", problems["rejected"]))
    for measured in job.get("throughput") or []:
        fields.append(("Throughput", _throughput_line(measured)))
    if spec.get("command"):
        command = spec["command"]
        fields.append(("Command", command if isinstance(command, str) else shell_line(command)))
    if spec.get("workdir"):
        fields.append(("Workdir", spec["workdir"]))
    lines = [f"Job {job['id']}  {job['name']}"]
    lines += [
        f"  {label + ':':<11} {value if label == 'Command' else ' '.join(str(value).split())}"
        for label, value in fields
    ]
    if job["status"] == "PENDING":
        lines.append(f"Why pending: {job['reason'] or 'not yet considered by the scheduler'}")
    elif job["reason"]:
        lines.append(f"{'Note' if job['status'] == 'RUNNING' else 'Reason'}: {job['reason']}")
    text = "\n".join(lines) + "\n"
    if attempts:
        rows = [
            [
                str(attempt["number"]),
                ",".join(attempt["gpus"]) or "-",
                _clock(attempt["started_at"]),
                _clock(attempt["ended_at"]),
                attempt["state"],
                attempt["outcome"] or "",
                "" if attempt["exit_code"] is None else str(attempt["exit_code"]),
                " ".join((attempt["reason"] or "").split()),
            ]
            for attempt in attempts
        ]
        headers = ["#", "GPUS", "STARTED", "ENDED", "STATE", "OUTCOME", "EXIT", "REASON"]
        text += "\nAttempts\n" + table_text(headers, rows)
    events = sorted(job.get("events", []), key=lambda event: event["at"])
    if events:
        rows = [[_clock(e["at"]), e["kind"], " ".join(str(e["message"]).split())] for e in events]
        text += "\nEvents\n" + table_text(["TIME", "EVENT", "MESSAGE"], rows)
    return text


def shell_line(argv: list[str]) -> str:
    """An argv as one line a POSIX shell reads back to the same words (shlex.join); a word with
    a control character (a newline, a tab) in bash's $'...' quoting, which keeps it one line."""
    import shlex

    words = []
    for word in map(str, argv):
        if any(ord(char) < 32 or ord(char) == 127 for char in word):
            escaped = "".join(
                {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(char)
                or (f"\\x{ord(char):02x}" if ord(char) < 32 or ord(char) == 127 else char)
                for char in word
            )
            words.append(f"$'{escaped}'")
        else:
            words.append(shlex.quote(word))
    return " ".join(words)


# -- logs -------------------------------------------------------------------------------------


@click.command()
@job_option
@click.option("--follow", "-f", is_flag=True, help="keep printing until the job ends")
@click.option("--attempt", type=click.IntRange(min=1), help="this attempt (default: the latest)")
@click.option("--rank", type=click.IntRange(min=0), default=0, help="this worker's output")
@click.option("--stderr", is_flag=True, help="stderr instead of stdout")
@click.option(
    "--tail",
    "-n",
    type=click.IntRange(0, 1_000_000),
    help="only the last N lines (with -f: then follow)",
)
def logs(
    job_id: str, follow: bool, attempt: int | None, rank: int, stderr: bool, tail: int | None
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
                raise click.exceptions.Exit(130) from None
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


def array_option(function: Any) -> Any:
    return click.option(
        "--array", is_flag=True, help="JOB is an array's id: act on each unfinished task"
    )(function)


def filter_options(function: Any) -> Any:
    """`--state/-t`, `--user/-u`, `--vc`, `--name/-n`: act on every unfinished job they select
    (Slurm's scancel -t PENDING -u alice), in one call, instead of one JOB. The command takes
    them as `**where` (states, user, vc, name), what `bulk_or_one` reads."""
    for option in reversed(
        (
            click.option(
                "--state",
                "-t",
                "states",
                multiple=True,
                type=click.Choice(["PENDING", "RUNNING"], case_sensitive=False),
                help="only jobs in this state (repeat for both)",
            ),
            click.option("--user", "-u", help="only this user's jobs (an admin's token: anyone)"),
            click.option("--vc", help="only jobs of this VC"),
            click.option(
                "--name",
                "-n",
                help="only jobs of this name (an array's: its tasks) or glob ('sweep-*')",
            ),
        )
    ):
        function = option(function)
    return click.argument("job_id", metavar="[JOB]", required=False)(function)


def bulk_or_one(
    verb: str, job_id: str | None, array: bool, where: dict[str, Any], output: str
) -> bool:
    """With a filter (and no JOB), act on every job it selects and report; True if it did."""
    given = {key: value for key, value in where.items() if value}
    if job_id is not None and given:
        refuse(f"give JOB or a filter ({', '.join('--' + key for key in given)}), not both")
    if job_id is None and not given:
        refuse("give a JOB, or a filter: --state, --user, --vc or --name")
    if job_id is not None:
        return False
    if array:
        refuse("--array needs a JOB (an array's id)")
    states = list(given.pop("states", ()))
    if states:
        given["state"] = [state.upper() for state in states]
    with connected() as client:
        answer = getattr(client, f"{verb}_jobs")(**given)
    if output != TABLE:
        print_data(answer, output)
        return True
    past = {"cancel": "cancelled", "hold": "held", "release": "released"}[verb]
    ids = answer["ids"]
    shown = ", ".join(ids[:20]) + (f", ... ({len(ids) - 20} more)" if len(ids) > 20 else "")
    count = answer["count"]
    click.echo(f"{count} job{'' if count == 1 else 's'} {past}" + (f": {shown}" if ids else ""))
    return True


@click.command()
@filter_options
@array_option
@output_option(formats=(TABLE, JSON, YAML))
def cancel(job_id: str | None, array: bool, output: str, **where: Any) -> None:
    """Cancel a pending or running job (its processes get their signal, then SIGKILL), or every
    job a filter selects: `corral cancel --state PENDING --user alice --name 'sweep-*'`."""
    if bulk_or_one("cancel", job_id, array, where, output):
        return
    assert job_id is not None
    with connected() as client:
        job = client.cancel(job_id, array=array)
    if output != TABLE:
        print_data(job, output)
    if array:
        if output == TABLE:
            click.echo(f"array {job_id} cancelled")
        return
    if job["status"] != "CANCELLED":
        refuse(f"job {job_id} already ended ({job['status']}); nothing to cancel")
    if output == TABLE:
        click.echo(f"job {job_id} cancelled")


# -- vc ---------------------------------------------------------------------------------------


@click.group("vc")
def vc_group() -> None:
    """Virtual clusters (teams' GPU shares)."""


VC_COLUMNS = (
    Column("VC", lambda v: v["name"]),
    Column("GUARANTEED", lambda v: v["guaranteed_gpus"], right=True),
    Column("ALLOCATED", lambda v: v["allocated_gpus"], right=True),
    Column("PENDING", lambda v: v["pending"], right=True),
    Column("RUNNING", lambda v: v["running"], right=True),
)


#: Under departments: the tree, each level indented under its parent.
VC_TREE_COLUMNS = (
    Column("VC", lambda v: "  " * v["depth"] + v["name"] + ("/" if v["kind"] != "vc" else "")),
    Column("QUOTA", lambda v: v["guaranteed_gpus"], right=True),
    Column("USED", lambda v: v["allocated_gpus"], right=True),
    Column("BORROWED", lambda v: v["borrowed_gpus"], right=True),
    Column("WEIGHT", lambda v: f"{v['weight']:g}", right=True),
    Column("LIMIT", lambda v: "-" if v["limit"] is None else v["limit"], right=True),
    Column("PENDING", lambda v: v["pending"], right=True),
    Column("RUNNING", lambda v: v["running"], right=True),
)


@vc_group.command("ls")
@output_option()
def vc_ls(output: str) -> None:
    """The VCs: guaranteed GPUs, GPUs in use, pending and running jobs; under departments, the
    tree (a department ends in /) with each level's quota, GPUs used and borrowed, over-quota
    weight and limit."""
    with connected() as client:
        vcs = client.vcs()
    tree = any("kind" in vc for vc in vcs)
    emit(vcs, VC_TREE_COLUMNS if tree else VC_COLUMNS, output)


# -- token ------------------------------------------------------------------------------------


@click.group("token")
def token_group() -> None:
    """API tokens (admins only)."""


@token_group.command("create")
@click.argument("user")
@click.option("--vc", help="the user's VC: they submit there and read its jobs")
@click.option("--admin", is_flag=True, help="an admin token")
@click.option(
    "--expires", metavar="DURATION", help="it stops working after this long: 90s, 30m, 12h, 7d, 1w"
)
@click.option(
    "--unix-user",
    metavar="ACCOUNT",
    help="the Unix account the user's jobs run as (default: the one named like USER)",
)
@output_option(formats=(TABLE, JSON, YAML))
def token_create(
    user: str,
    vc: str | None,
    admin: bool,
    expires: str | None,
    unix_user: str | None,
    output: str,
) -> None:
    """Create a token for USER and print it (the only time it is shown)."""
    expires_in = None if expires is None else parse_duration("--expires", expires)
    with connected() as client:
        created = client.create_token(
            user, vc=vc, admin=admin, unix_user=unix_user, expires_in=expires_in
        )
    if output == TABLE:
        click.echo(created["token"])
    else:
        print_data(created, output)


def _expires(token: dict[str, Any]) -> str:
    expires = token["expires_at"]
    if expires is None:
        return ""
    return _date(expires) + (" (expired)" if token["state"] == "expired" else "")


TOKEN_COLUMNS = (
    Column("ID", lambda t: t["id"]),
    Column("USER", lambda t: t["user"]),
    Column("VC", lambda t: t["vc"] or "-"),
    Column("ADMIN", lambda t: "yes" if t["admin"] else ""),
    Column("UNIX USER", lambda t: t["unix_user"] or "-"),
    Column("CREATED", lambda t: _date(t["created_at"])),
    Column("EXPIRES", _expires),
    Column("STATE", lambda t: t["state"], wide_only=True),
    Column("REVOKED", lambda t: _date(t["revoked_at"])),
)


@token_group.command("ls")
@output_option()
def token_ls(output: str) -> None:
    """Every token: id, user, VC, admin, Unix account, created, expires, revoked (never the
    secret)."""
    with connected() as client:
        tokens = client.tokens()
    emit(tokens, TOKEN_COLUMNS, output)


@token_group.command("revoke")
@click.argument("who", metavar="USER|ID")
@click.option("--user", "as_user", is_flag=True, help="USER|ID is a user")
@click.option("--id", "as_id", is_flag=True, help="USER|ID is a token's id")
@output_option(formats=(TABLE, JSON, YAML))
def token_revoke(who: str, as_user: bool, as_id: bool, output: str) -> None:
    """Revoke a user's every token, or one token (see corral token ls): refused from now on."""
    if as_user and as_id:
        usage_error("--user and --id: give one of them, or neither")
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
    if output != TABLE:
        print_data(revoked, output)
        return
    if not revoked:
        click.echo(f"no token of {who} left to revoke")
    for token in revoked:
        click.echo(f"revoked token {token['id']} of {token['user']}")


DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def duration_seconds(text: str) -> float | None:
    """30m, 12h, 7d, 1w (or 90s) in seconds; None for text that is not such a duration."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text.lower())
    return float(match.group(1)) * DURATION_UNITS[match.group(2)] if match else None


def parse_duration(option: str, text: str) -> float:
    """30m, 12h, 7d, 1w (or 90s) in seconds; a usage error (one line, exit 2) otherwise."""
    seconds = duration_seconds(text) or 0.0
    if seconds <= 0:
        usage_error(f"{option}: expected a duration such as 30m, 12h, 7d or 1w, got {text!r}")
    return seconds


# -- profile ------------------------------------------------------------------------------------


@click.group("profile")
def profile_group() -> None:
    """Throughput measured per model and placement (from job progress)."""


def _optional(value: object, spec: str) -> str:
    return "" if value is None else format(value, spec)


PROFILE_COLUMNS = (
    Column("MODEL", lambda r: r["model"]),
    Column("GPU TYPE", lambda r: r["gpu_type"]),
    Column("GPUS", lambda r: r["gpus"], right=True),
    Column("NODES", lambda r: r["nodes"], right=True),
    Column("SHARED WITH", lambda r: r["colocated"] or "-"),
    # whose measurement: a VC's ("-": none's, read by all), and whether every VC reads it
    Column("VC", lambda r: (r.get("vc") or "-") + (" (shared)" if r.get("shared") else "")),
    Column("STEPS/S", lambda r: f"{r['steps_per_s']:.3g}", right=True),
    Column("SAMPLES/S", lambda r: _optional(r["samples_per_s"], ".4g"), right=True),
    Column("MEASURED", lambda r: _age(r["seconds"]), right=True),
    Column("RUNS", lambda r: r["runs"], right=True),
    Column("UPDATED", lambda r: f"{_age(time.time() - r['updated_at'])} ago", right=True),
)


@profile_group.command("ls")
@click.option("--model", help="only this model")
@output_option()
def profile_ls(model: str | None, output: str) -> None:
    """Steps/s each model ran at, per VC, GPU type, GPU count, nodes spanned and sharing
    partner (VC -: measured by no VC's jobs; every VC reads those)."""
    with connected() as client:
        profiles = client.profiles()
    if model is not None:
        profiles = [row for row in profiles if row["model"] == model]
    emit(
        profiles,
        PROFILE_COLUMNS,
        output,
        empty="nothing measured yet: jobs report progress through $CORRAL_PROGRESS_FILE "
        "(docs/progress.md)",
    )


@profile_group.command("share")
@click.argument("model")
@output_option(formats=(TABLE, JSON, YAML))
def profile_share(model: str, output: str) -> None:
    """Mark MODEL shared (admins only): every VC's jobs read every VC's measurements of it
    where their own VC measured none."""
    _share(model, True, output)


@profile_group.command("unshare")
@click.argument("model")
@output_option(formats=(TABLE, JSON, YAML))
def profile_unshare(model: str, output: str) -> None:
    """Unmark MODEL (admins only): each VC reads only its own measurements of it again."""
    _share(model, False, output)


def _share(model: str, shared: bool, output: str) -> None:
    with connected() as client:
        answer = client.share_model(model, shared)
    if output != TABLE:
        print_data(answer, output)
        return
    state = "shared" if shared else "not shared"
    click.echo(f"{model} is {'now' if answer['changed'] else 'already'} {state}")


# -- formatting -------------------------------------------------------------------------------


def _attempt_list(job: dict[str, Any]) -> list[dict[str, Any]]:
    """A job detail's attempts (`attempt_history`; older servers listed them in `attempts`)."""
    listed = job.get("attempt_history", job["attempts"])
    return listed if isinstance(listed, list) else []


def _attempt_count(job: dict[str, Any]) -> int:
    attempts = job["attempts"]
    return len(attempts) if isinstance(attempts, list) else int(attempts)


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
    spread = f" over {plural(measured['nodes'], 'node')}" if measured["nodes"] > 1 else ""
    return (
        f"{measured['steps_per_s']:.3g} steps/s on {measured['gpus']} x "
        f"{measured['gpu_type']}{spread} ({plural(measured['runs'], 'run')}, "
        f"{_age(measured['seconds'])} measured)"
    )


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
