"""Write the docs' tables of plugins from the registries, or check that they are current.

Each kind of corral.cli.registries.KINDS (policies, placements, admissions, stages, trace
formats, executors, presets) has one table in the docs, between the lines

    <!-- plugin-table: KIND -->
    <!-- end plugin-table -->

that this script fills: each entry's name, its one-line summary, what the code declares about it
(a policy's `preemptive`, `blocking` and `needs_lengths`; a placement's `shares` and `pure`; a
trace format's streaming reader) and its options' flags (a trace format: how `--trace` names it).
`--check` changes nothing and exits 1 naming each table that differs (tests/cli/test_plugin_lists.py
runs it).

Run: .venv/bin/python scripts/plugin_tables.py [--check]
"""

from __future__ import annotations

import difflib
import re
import sys
from collections.abc import Callable
from pathlib import Path

from corral.cli.registries import KINDS, Row

ROOT = Path(__file__).resolve().parent.parent
#: The files the tables may be in.
DOCS = ["README.md", "docs/*.md"]
BEGIN = re.compile(r"^<!-- plugin-table: (?P<kind>[a-z ]+) -->$")
END = "<!-- end plugin-table -->"


def _yes(value: object) -> str:
    return "yes" if value else "no"


def _policy_facts(name: str) -> list[str]:
    from corral.core.policy import POLICIES

    policy = POLICIES[name]
    return [_yes(policy.preemptive), _yes(policy.blocking), _yes(policy.needs_lengths)]


def _placement_facts(name: str) -> list[str]:
    from corral.core.placement import PLACEMENTS

    placement = PLACEMENTS[name]
    return [_yes(placement.shares), _yes(placement.pure)]


def _format_facts(name: str) -> list[str]:
    from corral.sim.traces import FORMATS

    return [_yes(FORMATS[name].streams)]


#: Per kind: the columns after the summary, what the code declares (headers, cells of a name).
FACTS: dict[str, tuple[list[str], Callable[[str], list[str]]]] = {
    "policy": (["`preemptive`", "`blocking`", "`needs_lengths`"], _policy_facts),
    "placement": (["`shares`", "`pure`"], _placement_facts),
    "trace format": (["`--stream`"], _format_facts),
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _use(kind: str, row: Row) -> str:
    if kind == "trace format":
        return f"`{row.use}`"
    if not row.use:
        return "-"
    if kind == "executor":
        from corral.server.executors import flag

        return ", ".join(f"`{flag(row.name, option)}`" for option in row.use.split(", "))
    from corral.cli.schedflags import flag_name

    return ", ".join(f"`{flag_name(row.name, option)}`" for option in row.use.split(", "))


def table(kind: str) -> list[str]:
    """The markdown lines of a kind's table."""
    rows = dict(KINDS)[kind]()
    headers, facts = FACTS.get(kind, ([], lambda name: []))
    what, last = (
        ("what it is", "`--trace`") if kind == "trace format" else ("what it does", "options")
    )
    lines = [
        "| " + " | ".join(["name", what, *headers, last]) + " |",
        "|" + "---|" * (len(headers) + 3),
    ]
    for row in rows:
        cells = [f"`{row.name}`", _cell(row.summary), *facts(row.name), _use(kind, row)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def doc_files() -> list[Path]:
    return sorted({path for pattern in DOCS for path in ROOT.glob(pattern)})


def rewrite(text: str) -> tuple[str, list[str]]:
    """The text with every table filled, and the kinds of its tables in order."""
    out: list[str] = []
    kinds: list[str] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        out.append(lines[i])
        match = BEGIN.match(lines[i])
        i += 1
        if match is None:
            continue
        kind = match.group("kind")
        if kind not in dict(KINDS):
            raise SystemExit(
                f"plugin-table: unknown kind {kind!r} (known: {', '.join(dict(KINDS))})"
            )
        end = next((j for j in range(i, len(lines)) if lines[j] == END), None)
        if end is None:
            raise SystemExit(f"plugin-table: {kind}: no {END!r} line after it")
        kinds.append(kind)
        out.extend(table(kind))
        i = end
    return "\n".join(out), kinds


def main(argv: list[str]) -> int:
    check = "--check" in argv
    problems: list[str] = []
    found: dict[str, list[str]] = {}
    for path in doc_files():
        text = path.read_text(encoding="utf-8")
        new, kinds = rewrite(text)
        name = str(path.relative_to(ROOT))
        for kind in kinds:
            found.setdefault(kind, []).append(name)
        if new == text:
            continue
        if check:
            diff = difflib.unified_diff(
                text.split("\n"), new.split("\n"), name, f"{name} (registries)", lineterm="", n=0
            )
            problems.append(f"{name}: a plugin table differs from the registries:")
            problems.extend(f"  {line}" for line in diff)
        else:
            path.write_text(new, encoding="utf-8")
            print(f"wrote {name}")
    for kind, _ in KINDS:
        places = found.get(kind, [])
        if len(places) != 1:
            where = ", ".join(places) or "none"
            problems.append(f"plugin-table: {kind}: {len(places)} tables ({where}); want one")
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems and check:
        print("run: .venv/bin/python scripts/plugin_tables.py", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
