"""The `corral` command: a click group that imports a command's module only when it runs.

The everyday client commands (corral.cli.client: submit, ls, queue, describe, ...) are plain
click commands: `corral submit` imports click, yaml and HTTP on a socket (corral.wire), never
http.client, typer, rich, numpy or the scheduling core (benchmarks/client_start.py). The
simulator's and the manager's commands (simulate, up, config, ...) are typer commands of
corral.cli.tools; `corral NAME ARGS` hands ARGS to that typer app, once corral.cli.extras found
the extra it needs installed (`pip install corral` is the client alone; `corral up` needs
`corral[server]`).

A new command is one line in COMMANDS: "module:attribute" of a click command, or "tools" for a
command of corral.cli.tools' typer app (registered there), with the one-line help that
`corral --help` shows without importing it (tests/cli/test_imports.py checks they agree).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

TOOLS = "tools"
#: name -> (where the command is, its one-line help), in the order `corral --help` lists them.
COMMANDS: dict[str, tuple[str, str]] = {
    "submit": ("corral.cli.client:submit", "Submit a job; print its id."),
    "ls": ("corral.cli.client:ls", "List jobs, newest first."),
    "queue": ("corral.cli.client:queue", "The pending jobs in the scheduler's order."),
    "describe": ("corral.cli.client:describe", "A job's state, placement, attempts, events."),
    "logs": ("corral.cli.client:logs", "Print a job's output."),
    "cancel": ("corral.cli.client:cancel", "Cancel a pending or running job."),
    "hold": ("corral.cli.controls:hold", "Keep a pending job from starting."),
    "release": ("corral.cli.controls:release", "Let a held job start again."),
    "requeue": ("corral.cli.controls:requeue", "Queue a running or ended job again."),
    "usage": ("corral.cli.usage:usage", "GPU-hours, jobs and queueing per user or VC."),
    "vc": ("corral.cli.client:vc_group", "Virtual clusters (teams' GPU shares)."),
    "token": ("corral.cli.client:token_group", "API tokens (admins only)."),
    "profile": ("corral.cli.client:profile_group", "Throughput measured per VC and model."),
    "node": ("corral.cli.node:node_group", "Nodes: their state, drain and resume (admins)."),
    "reservation": (
        "corral.cli.reservation:reservation_group",
        "Reservations: GPUs kept for some users in a window.",
    ),
    "up": (TOOLS, "Run the manager: API, dashboard, scheduler, executor."),
    "export-trace": (TOOLS, "Write the manager's job history as a trace."),
    "config": (TOOLS, "Show or check a scheduler config."),
    "simulate": (TOOLS, "Replay a trace through the scheduler."),
    "vc-config": (TOOLS, "Write a cluster config sized to a trace's VCs."),
    "plot-vcs": (TOOLS, "Plot per-VC queueing, shared against alone."),
    "fgd": (TOOLS, "Replay an Alibaba GPU-sharing trace (FGD)."),
    "completion": ("corral.cli.completion:completion", "Print a shell completion script."),
}
#: Help goes to the terminal's width; piped (a pager, a file), to this many columns, not 80.
PIPED_HELP_WIDTH = 120
#: The simulator's commands: numpy's BLAS keeps to the calling thread. OpenBLAS otherwise starts
#: a thread per CPU when numpy is imported, which spin while they wait: 65 to 100 ms of CPU of
#: every `corral simulate` before its first event (2 CPUs), for the short vectors it works on.
#: A value the user set is kept.
ONE_BLAS_THREAD = frozenset({"simulate", "vc-config", "plot-vcs", "fgd"})


def help_width() -> int:
    if sys.stdout.isatty():
        try:
            return max(60, os.get_terminal_size(sys.stdout.fileno()).columns)
        except (OSError, ValueError):
            return PIPED_HELP_WIDTH
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) >= 40 else PIPED_HELP_WIDTH


def tool_environment(name: str) -> None:
    """What the process of typer command `name` sets before it imports anything of it."""
    if not sys.stdout.isatty():
        os.environ.setdefault("COLUMNS", str(help_width()))  # rich's help width, piped
    if name in ONE_BLAS_THREAD:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


class ToolCommand(click.Command):
    """A typer command of corral.cli.tools, run as `corral NAME ARGS`: its own parser (and
    `--help`) reads ARGS."""

    def __init__(self, name: str, help: str) -> None:
        super().__init__(
            name,
            short_help=help,
            help=help,
            add_help_option=False,
            context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        )
        self.params = [click.Argument(["args"], nargs=-1, type=click.UNPROCESSED)]

    def invoke(self, ctx: click.Context) -> Any:
        from corral.cli.extras import missing_extra

        missing = missing_extra(self.name or "")
        if missing is not None:  # a client-only install: say what to install, in one line
            click.echo(f"error: {missing}", err=True)
            raise click.exceptions.Exit(2)
        tool_environment(self.name or "")
        if self.name == "simulate":
            from corral.cli.simargs import run

            if run(list(ctx.params["args"])):  # read without typer (help and errors: typer's)
                return None
        import typer.main

        from corral.cli.tools import app as tools

        parent = ctx.parent.command_path if ctx.parent is not None else "corral"
        command = typer.main.get_command(tools)
        return command.main(
            args=[self.name or "", *ctx.params["args"]], prog_name=parent, standalone_mode=True
        )


class CorralGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        if cmd_name not in self.commands:
            where, short_help = COMMANDS[cmd_name]
            if where == TOOLS:
                self.commands[cmd_name] = ToolCommand(cmd_name, short_help)
            else:
                module, _, attribute = where.partition(":")
                self.commands[cmd_name] = getattr(importlib.import_module(module), attribute)
        return self.commands[cmd_name]

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands and their one-line help, from COMMANDS: nothing is imported."""
        rows = [(name, short_help) for name, (_, short_help) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(
    cls=CorralGroup,
    context_settings={
        "help_option_names": ["-h", "--help"],
        "terminal_width": help_width(),
        "max_content_width": help_width(),
    },
    no_args_is_help=True,
)
def app() -> None:
    """corral: a GPU cluster manager for deep-learning training.

    The client commands talk to `corral up` at CORRAL_URL with the token in CORRAL_TOKEN.
    """


def run() -> None:
    app.main(prog_name="corral")
