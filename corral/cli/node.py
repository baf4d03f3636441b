"""`corral node ls`, `drain` and `resume`: a node's lifecycle (docs/server.md, "Nodes").

Plain click commands (the group is listed in corral.cli.main.COMMANDS); the client is imported
when one runs."""

from __future__ import annotations

import time

import click

from corral.cli.client import connected
from corral.cli.output import JSON, TABLE, YAML, Column, emit, output_option, print_data


@click.group("node")
def node_group() -> None:
    """Nodes: their state, drain and resume (admins)."""


def _since(at: object) -> str:
    if not isinstance(at, (int, float)):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


NODE_COLUMNS = (
    Column("NODE", lambda n: n["name"]),
    Column("STATE", lambda n: n["state"]),
    Column("REASON", lambda n: n["reason"] or "-", width=40),
    Column("SINCE", lambda n: _since(n["since"])),
    Column("GPUS FREE", lambda n: n["gpus_free"], right=True),
    Column("GPUS USED", lambda n: n["gpus_used"], right=True),
    Column("GPUS HELD", lambda n: n.get("gpus_held", 0), right=True),
    Column("JOBS", lambda n: ",".join(n["jobs"]) or "-", width=30),
    Column("BY", lambda n: n["by"] or "-", wide_only=True),
)


@node_group.command("ls")
@output_option()
def node_ls(output: str) -> None:
    """Every node: state (up, draining, drained, unhealthy, down), why and since when, GPUs free,
    used and held out (idle on a node that takes no jobs), the jobs on it."""
    with connected() as client:
        nodes = client.nodes()
    emit(nodes, NODE_COLUMNS, output)


@node_group.command("drain")
@click.argument("node")
@click.option("--reason", required=True, help="why (shown by `corral node ls`)")
@click.option(
    "--preempt",
    is_flag=True,
    help="preempt its jobs now (checkpoint, queued again) instead of letting them finish",
)
@output_option(formats=(TABLE, JSON, YAML))
def node_drain(node: str, reason: str, preempt: bool, output: str) -> None:
    """Start nothing new on NODE (admins only); its jobs finish, or with --preempt are
    preempted and queued again."""
    with connected() as client:
        answer = client.drain_node(node, reason, preempt=preempt)
    if output == TABLE:
        click.echo(f"node {node} {answer['state']}: {reason}")
    else:
        print_data(answer, output)


@node_group.command("resume")
@click.argument("node")
@output_option(formats=(TABLE, JSON, YAML))
def node_resume(node: str, output: str) -> None:
    """Let jobs start on a drained or unhealthy NODE again (admins only); a health check that
    still fails takes it out again."""
    with connected() as client:
        answer = client.resume_node(node)
    if output == TABLE:
        click.echo(f"node {node} {answer['state']}")
    else:
        print_data(answer, output)
