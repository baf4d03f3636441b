"""Every list of plugins a user sees is its registry: `corral config plugins` and the help of the
flags that choose one. A plugin registered late is listed too: tests/test_extensions.py
registers one of each kind."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner
from rich.console import Console

from corral.cli.main import app
from corral.cli.registries import KINDS, Row


def listed(args: list[str], monkeypatch: pytest.MonkeyPatch) -> str:
    """The command's output, the lines of its tables and help boxes joined: words only."""
    import corral.cli.configcmd

    monkeypatch.setattr(corral.cli.configcmd, "console", Console(width=400))
    result = CliRunner().invoke(app, args, env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.output).split())


def test_config_plugins_lists_every_entry_of_every_kind(monkeypatch):
    text = listed(["config", "plugins"], monkeypatch)
    for kind, rows in KINDS:
        for row in rows():
            assert f"{kind} {row.name} {row.summary} {row.use or '-'}" in text


def names(rows: list[Row]) -> str:
    return ", ".join(row.name for row in rows)


def test_the_flags_list_the_registries(monkeypatch):
    rows = dict(KINDS)
    simulate = listed(["simulate", "--help"], monkeypatch)
    policies = f"the ordering policy, one of: {names(rows['policy']())} [default"
    assert policies in simulate
    assert f"placement (one of: {names(rows['placement']())}) [default: relax]" in simulate
    assert f"(one of: auto, {names(rows['admission']())}) [default: auto]" in simulate
    assert f"round stages to run (any of: {names(rows['stage']())})" in simulate
    usages = ", ".join(row.use for row in rows["trace format"]())
    assert f"FORMAT:PATH, one of: {usages} (a path ending" in simulate
    for args in (["up", "--help"], ["config", "show", "--help"]):
        text = listed(args, monkeypatch)
        assert policies in text, args
        assert f"placement (one of: {names(rows['placement']())})" in text, args
