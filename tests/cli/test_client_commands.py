"""The client commands without a server: shell completion, help width, usage errors, and the
shared output printer (corral.cli.output). The commands against a live manager are in
tests/server/test_client_cli.py."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from corral.cli.client import describe_text
from corral.cli.main import COMMANDS, app
from corral.cli.output import JSON, TABLE, WIDE, YAML, Column, emit, plural, shorten, table_text

UNREACHABLE = {"CORRAL_URL": "http://127.0.0.1:1", "CORRAL_TOKEN": "x"}


def corral(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`corral ARGS` as a shell runs it: a fresh interpreter, stdout a pipe."""
    return subprocess.run(
        [sys.executable, "-m", "corral.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


# -- completion -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shell", "marker"),
    [
        ("bash", "complete -o nosort -F _corral_completion corral"),
        ("zsh", "compdef _corral_completion corral"),
        ("fish", "complete --no-files --command corral"),
    ],
)
def test_completion_prints_the_shells_script(shell: str, marker: str) -> None:
    done = CliRunner().invoke(app, ["completion", shell])
    assert done.exit_code == 0, done.output
    assert marker in done.stdout
    assert f"_CORRAL_COMPLETE={shell}_complete" in done.stdout


def test_completion_refuses_an_unknown_shell() -> None:
    done = CliRunner().invoke(app, ["completion", "tcsh"])
    assert done.exit_code == 2 and "'tcsh' is not one of 'bash', 'zsh', 'fish'" in done.output


def complete(words: str) -> list[str]:
    """What bash completion offers for the command line `words` (the cursor at its end), asked
    the way the script asks: _CORRAL_COMPLETE=bash_complete, COMP_WORDS, COMP_CWORD."""
    parts = words.split(" ")
    done = corral(
        env={
            "_CORRAL_COMPLETE": "bash_complete",
            "COMP_WORDS": words,
            "COMP_CWORD": str(len(parts) - 1),
        }
    )
    assert done.returncode == 0, done.stderr
    return [line.split(",", 1)[1] for line in done.stdout.splitlines()]


def test_completion_completes_command_names_subcommands_and_options() -> None:
    assert complete("corral qu") == ["queue"]
    assert complete("corral s") == ["submit", "simulate"]
    assert sorted(complete("corral ")) == sorted(COMMANDS)
    assert complete("corral token r") == ["revoke"]
    assert complete("corral ls --st") == ["--status"]
    assert complete("corral ls --status RU") == ["running"]  # any case is accepted
    assert complete("corral ls --status r") == ["running", "refused"]
    assert complete("corral ls -o y") == ["yaml"]


# -- help -------------------------------------------------------------------------------------


def test_help_piped_is_not_cut_at_80_columns() -> None:
    """Piped (a pager, grep), help uses 120 columns: the --set line of `submit --help` (about
    115 characters) stays one line."""
    env = {key: value for key, value in os.environ.items() if key != "COLUMNS"}
    done = subprocess.run(
        [sys.executable, "-m", "corral.cli", "submit", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stdout.splitlines() if "--set KEY=VALUE" in line]
    assert line.rstrip().endswith("(repeatable; env.NAME=...)") and len(line) > 80
    narrow = corral("submit", "--help", env={"COLUMNS": "70"})
    assert max(len(line) for line in narrow.stdout.splitlines()) <= 70


def test_a_typer_commands_help_piped_is_wide_too() -> None:
    """`corral up --help` (typer, drawn by rich) gets 120 columns when piped, as click's do."""
    env = {key: value for key, value in os.environ.items() if key != "COLUMNS"}
    done = subprocess.run(
        [sys.executable, "-m", "corral.cli", "export-trace", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert "Usage: corral export-trace" in done.stdout
    assert max(len(line) for line in done.stdout.splitlines()) == 120


def test_top_level_help_lists_every_command_with_its_line() -> None:
    done = corral("--help")
    assert done.returncode == 0
    for name, (_, short_help) in COMMANDS.items():
        assert f"  {name}" in done.stdout and short_help in done.stdout


# -- usage errors and unreadable spec files (no server needed) --------------------------------


def test_submit_without_a_file_or_a_command_is_a_usage_error() -> None:
    done = CliRunner().invoke(app, ["submit", "--gpus", "2"], env=UNREACHABLE)
    assert done.exit_code == 2
    assert done.stderr == (
        "error: give a job spec FILE, or the command after --: corral submit -- CMD ...\n"
    )
    empty = CliRunner().invoke(app, ["submit", "--"], env=UNREACHABLE)
    assert empty.exit_code == 2


def test_submit_a_command_without_gpus_names_the_flag() -> None:
    # The spec's one required field, when no file gives it: named as the flag to add, before
    # anything is sent (the server would say "gpus: field required").
    done = CliRunner().invoke(app, ["submit", "--", "python", "train.py"], env=UNREACHABLE)
    assert done.exit_code == 2 and done.stdout == ""
    assert done.stderr == (
        "error: --gpus is required: the GPUs the job needs (--gpus 1; a share of one: 0.5)\n"
    )
    # Given through --set instead, it is not missing (the unreachable server is the next error).
    given = CliRunner().invoke(
        app, ["submit", "--set", "gpus=1", "--", "python", "train.py"], env=UNREACHABLE
    )
    assert given.exit_code == 1 and "--gpus" not in given.stderr, given.stderr


def detail(command: object) -> dict[str, object]:
    """A job as `GET /api/v1/jobs/ID` answers, with the fields describe reads."""
    return {
        "id": "7", "name": "train", "user": "alice", "vc": "default", "status": "SUCCEEDED",
        "priority": "guaranteed", "gpus": 1, "workers": 1, "placement": [],
        "submitted_at": 1_700_000_000.0, "started_at": None, "finished_at": None,
        "attempts": 0, "failures": 0, "preemptions": 0, "exit_code": None, "reason": "",
        "spec": {"command": command},
    }  # fmt: skip


def test_describe_prints_the_argv_shell_quoted() -> None:
    argv = ["python", "train.py", "--name", "a b", "it's", "$HOME", "", "x;y"]
    text = describe_text(detail(argv))
    (line,) = [line for line in text.splitlines() if line.startswith("  Command:")]
    shown = line.removeprefix("  Command:").strip()
    # By hand, as shlex.join quotes: a word with a space, a quote, a $, nothing or a ; is quoted.
    assert shown == "python train.py --name 'a b' 'it'\"'\"'s' '$HOME' '' 'x;y'"
    assert shlex.split(shown) == argv  # a shell reads back the same words
    # Two spaces inside a word stay two: the line is not re-spaced.
    assert "'a  b'" in describe_text(detail(["echo", "a  b"]))
    # A newline inside a word stays on the one line, in bash's $'...' quoting.
    text = describe_text(detail(["printf", "a\nb"]))
    assert "  Command:    printf $'a\\nb'\n" in text
    assert (
        subprocess.run(
            ["bash", "-c", "printf '%s|' " + "$'a\\nb'"], capture_output=True, text=True, check=True
        ).stdout
        == "a\nb|"
    )
    # A command given as one string is shown as it was written.
    assert "  Command:    python train.py --lr 0.1\n" in describe_text(
        detail("python train.py --lr 0.1")
    )


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("- a\n- b\n", "a job spec is a mapping of fields, not a list"),
        ("just words\n", "a job spec is a mapping of fields, not a string"),
        ("", "the file is empty"),
        ("name: a\nname: b\n", "found duplicate key 'name'"),
        ("gpus: [1\n", "invalid YAML"),
    ],
)
def test_an_unusable_spec_file_is_one_line_naming_it(
    tmp_path: Path, text: str, reason: str
) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(text)
    done = CliRunner().invoke(app, ["submit", str(spec)], env=UNREACHABLE)
    assert done.exit_code == 1 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"error: {spec}: ") and reason in line, line


def test_a_missing_spec_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    done = CliRunner().invoke(app, ["submit", str(missing)], env=UNREACHABLE)
    assert done.exit_code == 1
    assert done.stderr.startswith(f"error: {missing}: cannot read the file")


def test_set_needs_key_equals_value_and_a_mapping_to_set_into(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: a\ngpus: 1\ncommand: 'true'\nenv: plain\n")
    for setting, message in (
        ("gpus", "--set: expected KEY=VALUE (e.g. max_retries=2), got 'gpus'"),
        ("=3", "--set: expected KEY=VALUE"),
        ("env.A=1", "--set env.A: env is not a mapping in the spec"),
    ):
        done = CliRunner().invoke(app, ["submit", str(spec), "--set", setting], env=UNREACHABLE)
        assert done.exit_code == 2 and done.stderr.startswith(f"error: {message}"), done.stderr


def test_an_unreachable_server_is_one_line_for_every_listing() -> None:
    for args in (["ls"], ["queue"], ["vc", "ls"], ["token", "ls"], ["describe", "3"]):
        done = CliRunner().invoke(app, args, env=UNREACHABLE)
        assert done.exit_code == 1, args
        assert done.stderr == (
            "error: cannot reach corral at http://127.0.0.1:1: is `corral up` running? "
            "(CORRAL_URL)\n"
        )


def test_a_bad_corral_url_is_one_line() -> None:
    done = CliRunner().invoke(app, ["ls"], env={"CORRAL_URL": "ftp://host"})
    assert done.exit_code == 1
    assert done.stderr == (
        "error: CORRAL_URL: not a usable URL 'ftp://host' (expected http://HOST:PORT)\n"
    )


# -- the output printer -----------------------------------------------------------------------

COLUMNS = (
    Column("ID", lambda r: r["id"]),
    Column("COUNT", lambda r: r["count"], right=True),
    Column("OWNER", lambda r: r["owner"], wide_only=True),
    Column("NOTE", lambda r: r["note"], width=10),
)
RECORDS = [
    {"id": "7", "count": 3, "owner": "ann", "note": "short"},
    {"id": "12", "count": 120, "owner": "bo", "note": "a note well past ten\ncharacters"},
]


def test_a_table_aligns_its_columns_and_shortens_only_where_asked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    emit(RECORDS, COLUMNS, TABLE)
    assert capsys.readouterr().out == ("ID  COUNT  NOTE\n7       3  short\n12    120  a note we…\n")
    emit(RECORDS, COLUMNS, WIDE)
    assert capsys.readouterr().out == (
        "ID  COUNT  OWNER  NOTE\n"
        "7       3  ann    short\n"
        "12    120  bo     a note well past ten characters\n"
    )


def test_json_and_yaml_print_the_records_unchanged(capsys: pytest.CaptureFixture[str]) -> None:
    emit(RECORDS, COLUMNS, JSON)
    assert json.loads(capsys.readouterr().out) == RECORDS
    emit(RECORDS, COLUMNS, YAML)
    assert yaml.safe_load(capsys.readouterr().out) == RECORDS
    emit([], COLUMNS, JSON, empty="nothing")
    assert capsys.readouterr() == ("[]\n", "")


def test_an_empty_table_says_so_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    emit([], COLUMNS, TABLE, empty="no jobs")
    assert capsys.readouterr() == ("", "no jobs\n")
    emit([], COLUMNS, TABLE)
    assert capsys.readouterr().out == "ID  COUNT  NOTE\n"


def test_the_small_helpers() -> None:
    assert table_text(["A", "LONGER"], [["xyz", ""]]) == "A    LONGER\nxyz\n"
    assert shorten("  two\n words ", 20) == "two words"
    assert shorten("abcdefghij", 5) == "abcd…"
    assert [plural(n, "node") for n in (0, 1, 2)] == ["0 nodes", "1 node", "2 nodes"]
    assert plural(1, "process", "processes") == "1 process"
    assert plural(3, "process", "processes") == "3 processes"
