"""`corral hold`, `release` and `requeue`: the job controls of Slurm's scontrol (docs/server.md).

Registered by corral.cli.client.register; imports nothing heavy at module level (the client is
imported when a command runs)."""

from __future__ import annotations

from typing import Annotated

import typer

from corral.cli.client import Output, OutputOption, connected, print_json

JobArgument = Annotated[str, typer.Argument(metavar="JOB", help="the job id")]
ArrayOption = Annotated[
    bool, typer.Option("--array", help="JOB is an array's id: act on each unfinished task")
]


def hold(
    job_id: JobArgument, array: ArrayOption = False, output: OutputOption = Output.table
) -> None:
    """Keep a pending job from starting until `corral release` (a running job is refused)."""
    with connected() as client:
        job = client.hold(job_id, array=array)
    if output is Output.json:
        print_json(job)
    else:
        typer.echo(f"{'array' if array else 'job'} {job_id} held")


def release(
    job_id: JobArgument, array: ArrayOption = False, output: OutputOption = Output.table
) -> None:
    """Let a held job start again, in its place in the queue."""
    with connected() as client:
        job = client.release(job_id, array=array)
    if output is Output.json:
        print_json(job)
    else:
        typer.echo(f"{'array' if array else 'job'} {job_id} released")


def requeue(job_id: JobArgument, output: OutputOption = Output.table) -> None:
    """Stop a running job and queue it again (not a failure; its checkpoint kept), or queue a
    failed or cancelled job again under its id."""
    with connected() as client:
        job = client.requeue(job_id)
    if output is Output.json:
        print_json(job)
    else:
        typer.echo(f"job {job_id} requeued")


def register(app: typer.Typer) -> None:
    app.command("hold")(hold)
    app.command("release")(release)
    app.command("requeue")(requeue)
