"""corral.cli.simargs reads `corral simulate`'s command line as typer does, or leaves it to typer.

Each line `read` accepts is also parsed by the typer command (`corral.cli.simulate.command`'s
construction, its callback replaced by one that records its keyword arguments): both must give
the same arguments, the scheduler mapping included. The lines it must leave to typer (None) are
the ones where typer prints help or an error, or where a value is not written plainly.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from corral.cli import simargs
from corral.cli.schedflags import click_command
from corral.cli.simulate import simulate

TRACE = ["--trace", "tiresias:trace.csv"]


def typer_reads(args: list[str]) -> dict[str, Any]:
    """The keyword arguments typer's command calls `simulate` with for this line."""

    @functools.wraps(simulate)
    def record(**kwargs: Any) -> dict[str, Any]:
        return kwargs

    command = click_command("simulate", record)
    return command.main(args=args, prog_name="corral simulate", standalone_mode=False)  # type: ignore[no-any-return]


def typer_params() -> dict[str, Any]:
    command = click_command("simulate", simulate)
    return {param.name: param for param in command.params}


def test_the_options_are_typers() -> None:
    """Every option of typer's command, with its names, flag-ness, requirement and default, is
    one simargs knows, and no other."""
    ours = simargs.simulate_params() + simargs.scheduler_params(
        __import__("corral.cli.schedflags", fromlist=["flags"]).flags()
    )
    theirs = typer_params()
    assert {p.name for p in ours} == set(theirs)
    for param in ours:
        option = theirs[param.name]
        assert option.opts == [param.on], param.name
        assert option.secondary_opts == ([param.off] if param.off else []), param.name
        assert option.is_flag == (param.kind is bool), param.name
        assert option.required == param.required, param.name
        if not param.required:
            assert option.default == param.default, param.name


def sample(kind: type) -> str:
    return {int: "3", float: "0.25", str: "some-text", Path: "a/b.yaml"}[kind]


def every_own_option() -> list[str]:
    """A line giving each of simulate's own options a plain value (flags: their on name)."""
    line = []
    for param in simargs.simulate_params():
        if param.kind is bool:
            line.append(param.on)
        else:
            line += [param.on, sample(param.kind)]
    return line


LINES = [
    TRACE,
    every_own_option(),
    # each flag's off name, and a later repeat that wins
    [*TRACE, "--no-spread-slowdown", "--plot", "--no-plot", "--skip-oversized"],
    [*TRACE, "--seed", "-1", "--seed", "7", "--arrival-scale", "-0.5", "--racks=4"],
    [*TRACE, "--optimus-noise", "1e-3", "--storage-gbps", ".5", "--workers", "0"],
    [*TRACE, "--cluster=2x4", "--out", "runs/x", "--config", "c.yaml", "--window", "1:9"],
    # the scheduler's flags: a value, a bool on and off, a flag alone at the end and before
    # another flag (its value alone), one with a value
    [*TRACE, "--relax-after-s", "30", "--quota-lend-last", "--policy", "las"],
    [*TRACE, "--no-quota-lend-last", "--las-thresholds-gpu-s", "10,20", "--backfill"],
    [*TRACE, "--backfill", "--seed", "2"],
    [*TRACE, "--backfill", "easy", "--placement", "relax"],
    [*TRACE, "--relax-after-s=abc"],  # text: the scheduler's config refuses it later, as ever
]


@pytest.mark.parametrize("line", LINES, ids=lambda line: " ".join(line)[:60])
def test_a_line_it_reads_is_read_as_typer_reads_it(line: list[str]) -> None:
    ours = simargs.read(line)
    assert ours is not None, line
    assert ours == typer_reads(line)


def test_every_scheduler_flag_is_read_as_typer_reads_it() -> None:
    from corral.cli.schedflags import flags

    line = list(TRACE)
    for param in simargs.scheduler_params(flags()):
        line += [param.on] if param.kind is bool else [param.on, "1"]
    assert simargs.read(line) == typer_reads(line)


@pytest.mark.parametrize(
    "line",
    [
        ["--help"],
        [*TRACE, "--help"],
        [],  # --trace missing: typer's error
        [*TRACE, "--bogus", "1"],
        [*TRACE, "extra"],
        [*TRACE, "--"],
        [*TRACE, "-h"],
        [*TRACE, "--seed"],  # no value
        [*TRACE, "--seed", "1_000"],
        [*TRACE, "--seed", "0x10"],
        [*TRACE, "--seed", "08"],
        [*TRACE, "--seed", "2.0"],
        [*TRACE, "--optimus-noise", "inf"],
        [*TRACE, "--plot=yes"],
        [*TRACE, "--out", ""],
        [*TRACE, "--cluster", "--racks"],  # a value that begins with -: typer decides
    ],
    ids=lambda line: " ".join(line)[:60] or "empty",
)
def test_a_line_it_is_not_sure_of_is_left_to_typer(line: list[str]) -> None:
    assert simargs.read(line) is None


def test_shell_completion_is_left_to_typer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(simargs.COMPLETE_VAR, "bash_complete")
    assert simargs.read(TRACE) is None
