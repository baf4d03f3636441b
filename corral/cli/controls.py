"""`corral hold`, `release` and `requeue`: the job controls of Slurm's scontrol (docs/server.md).

Plain click commands, listed in corral.cli.main.COMMANDS; the client is imported when one runs."""

from __future__ import annotations

from typing import Any

import click

from corral.cli.client import array_option, bulk_or_one, connected, filter_options, job_option
from corral.cli.output import JSON, TABLE, YAML, output_option, plural, print_data


def _done(what: str, job_id: str, array: bool, answer: dict[str, Any], output: str) -> None:
    if output != TABLE:
        print_data(answer, output)
    elif not array:
        click.echo(f"job {job_id} {what}")
    else:
        click.echo(array_line(what, job_id, answer))


def array_line(what: str, job_id: str, answer: dict[str, Any]) -> str:
    """`array 5: 3 tasks held; 1 skipped: job 6 is RUNNING: ...`: how many tasks were acted on,
    and why the others were not (the first five reasons)."""
    done = answer.get("array_tasks") or []
    skipped: dict[str, str] = answer.get("array_skipped") or {}
    line = f"array {job_id}: {plural(len(done), 'task')} {what}"
    if skipped:
        reasons = list(skipped.values())
        more = f"; ... ({len(reasons) - 5} more)" if len(reasons) > 5 else ""
        line += f"; {len(skipped)} skipped: " + "; ".join(reasons[:5]) + more
    return line


@click.command()
@filter_options
@array_option
@output_option(formats=(TABLE, JSON, YAML))
def hold(job_id: str | None, array: bool, output: str, **where: Any) -> None:
    """Keep a pending job from starting until `corral release` (a running job is refused), or
    every pending job a filter selects (--user, --vc, --name). With --array, every pending task
    of the array; running ones are skipped and counted."""
    if bulk_or_one("hold", job_id, array, where, output):
        return
    assert job_id is not None
    with connected() as client:
        _done("held", job_id, array, client.hold(job_id, array=array), output)


@click.command()
@filter_options
@array_option
@output_option(formats=(TABLE, JSON, YAML))
def release(job_id: str | None, array: bool, output: str, **where: Any) -> None:
    """Let a held job start again, in its place in the queue, or every held job a filter
    selects (--user, --vc, --name)."""
    if bulk_or_one("release", job_id, array, where, output):
        return
    assert job_id is not None
    with connected() as client:
        _done("released", job_id, array, client.release(job_id, array=array), output)


@click.command()
@job_option
@output_option(formats=(TABLE, JSON, YAML))
def requeue(job_id: str, output: str) -> None:
    """Stop a running job and queue it again (not a failure; its checkpoint kept), or queue a
    failed or cancelled job again under its id."""
    with connected() as client:
        _done("requeued", job_id, False, client.requeue(job_id), output)
