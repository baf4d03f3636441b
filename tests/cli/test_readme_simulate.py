"""The README's simulator commands work from a user's fresh clone, which has no `../shared/data`.

Every `corral simulate` command of README.md (its shell blocks and its inline code) is parsed.
A command that reads no data set runs, as written, in an empty directory whose parent has no
`shared/data`, and must succeed and print its summary. A command that reads one
(`../shared/data/NAME/...`) needs the data set: the README must say where NAME comes from, with
its source's address and a command that puts it there.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
CORRAL = Path(sys.executable).parent / "corral"
DATA = re.compile(r"\.\./shared/data/([\w.-]+)")


def simulate_commands(text: str) -> list[str]:
    """Each `corral simulate ...` of the README: a line of a shell block (comment dropped), or
    an inline `...` span (which may break across lines)."""
    found: list[str] = []
    for block in re.findall(r"^```sh\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL):
        for line in block.splitlines():
            line = re.split(r"\s+#\s", line, maxsplit=1)[0].strip()
            if line.startswith("corral simulate "):
                found.append(line)
    prose = re.sub(r"^```.*?^```$", "", text, flags=re.MULTILINE | re.DOTALL)
    for span in re.findall(r"`(corral simulate [^`]+)`", prose):
        found.append(" ".join(span.split()))
    return found


COMMANDS = simulate_commands(README.read_text(encoding="utf-8"))
TEMPLATE = re.compile(r"\b[A-Z]{3,}(:[A-Z]+)?\b")  # FORMAT:PATH, DIR: a pattern, not a command


def runnable(command: str) -> bool:
    return not TEMPLATE.search(command) and not DATA.search(command)


def test_the_readme_has_simulator_commands_of_both_kinds() -> None:
    # The headline's gavel command, the synthetic one, the tiresias and gavel ones of the
    # usage block, and the usage block's pattern line.
    assert len(COMMANDS) >= 5, COMMANDS
    assert any(runnable(command) for command in COMMANDS)
    assert any(DATA.search(command) for command in COMMANDS)


@pytest.mark.parametrize("command", [c for c in COMMANDS if DATA.search(c)])
def test_each_data_set_a_command_reads_says_where_it_comes_from(command: str) -> None:
    text = README.read_text(encoding="utf-8")
    for name in DATA.findall(command):
        # A list item of the README's data sets: `name/`, its source's https address, and a
        # command that writes into ../shared/data/name.
        item = re.search(rf"^- `{re.escape(name)}/`.*?(?=^- |^$)", text, re.MULTILINE | re.DOTALL)
        assert item is not None, f"the README does not say where {name} comes from"
        assert re.search(r"https://github\.com/\S+", item.group(0)), item.group(0)
        assert f"../shared/data/{name}" in item.group(0), item.group(0)


@pytest.mark.parametrize("command", [c for c in COMMANDS if runnable(c)])
def test_a_command_that_needs_no_data_runs_in_a_fresh_clone(command: str, tmp_path: Path) -> None:
    clone = tmp_path / "corral"  # a user's clone: nothing beside it, no ../shared/data
    clone.mkdir()
    assert not (tmp_path / "shared").exists()
    argv = shlex.split(command)
    argv[0] = str(CORRAL)
    env = {**os.environ, "COLUMNS": "200"}
    done = subprocess.run(
        argv, cwd=clone, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Simulation summary" in done.stdout
    assert "shared/data" not in done.stdout + done.stderr
    out = argv[argv.index("--out") + 1] if "--out" in argv else "runs/latest"
    assert (clone / out / "summary.json").is_file()
