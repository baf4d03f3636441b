"""Every list of plugins a user sees is its registry: the docs' tables (scripts/plugin_tables.py
writes them), `corral config plugins`, and the help of the flags that choose one. A plugin
registered late is listed too: tests/test_extensions.py registers one of each kind."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from corral.cli.main import app
from corral.cli.registries import KINDS, Row

ROOT = Path(__file__).resolve().parents[2]


def plugin_tables():  # the script, loaded from its file
    spec = importlib.util.spec_from_file_location(
        "plugin_tables", ROOT / "scripts/plugin_tables.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def doc_tables() -> dict[str, list[tuple[str, str]]]:
    """Each kind's table in the docs, read back: (name, summary) per row."""
    tables: dict[str, list[tuple[str, str]]] = {}
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            match = re.fullmatch(r"<!-- plugin-table: ([a-z ]+) -->", line)
            if match is None:
                continue
            assert match.group(1) not in tables, f"{path.name}: a second {match.group(1)} table"
            rows = []
            for row in lines[i + 3 :]:
                if not row.startswith("|"):
                    break
                cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", row)[1:-1]]
                rows.append((cells[0].strip("`"), cells[1].replace("\\|", "|")))
            tables[match.group(1)] = rows
    return tables


def test_the_docs_tables_are_the_registries():
    tables = doc_tables()
    assert sorted(tables) == sorted(kind for kind, _ in KINDS)
    for kind, rows in KINDS:
        assert tables[kind] == [(row.name, row.summary) for row in rows()], kind


def test_the_table_script_finds_nothing_to_change(capsys):
    assert plugin_tables().main(["--check"]) == 0, capsys.readouterr().err


def test_the_table_script_names_a_table_that_differs(tmp_path, monkeypatch, capsys):
    script = plugin_tables()
    doc = tmp_path / "docs" / "x.md"
    doc.parent.mkdir()
    doc.write_text("# x\n\n<!-- plugin-table: stage -->\n| stale |\n<!-- end plugin-table -->\n")
    monkeypatch.setattr(script, "ROOT", tmp_path)
    assert script.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert "docs/x.md: a plugin table differs from the registries:" in err
    assert "plugin-table: policy: 0 tables (none); want one" in err
    assert doc.read_text().count("| stale |") == 1  # --check writes nothing
    script.main([])
    assert "| `packing` | Gandiva's packing:" in doc.read_text()


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
    assert f"(any of: auto, {names(rows['admission']())}) [default: auto]" in simulate
    assert f"round stages to run (any of: {names(rows['stage']())})" in simulate
    usages = ", ".join(row.use for row in rows["trace format"]())
    assert f"FORMAT:PATH, one of: {usages} (a path ending" in simulate
    for args in (["up", "--help"], ["config", "show", "--help"]):
        text = listed(args, monkeypatch)
        assert policies in text, args
        assert f"placement (one of: {names(rows['placement']())})" in text, args
