"""How a job-name filter (`corral ls --name`, `cancel/hold/release --name`) selects jobs.

A pattern selects a job when the job's name, or the name of its array (a task of array `sweep`
is named `sweep[3]`), either equals the pattern or matches it as a shell glob (`*`, `?`,
`[abc]`, `[!abc]`, case-sensitive, as `fnmatch.fnmatchcase`). So `sweep` selects `sweep` and
every `sweep[i]`, `sweep*` also `sweep-2`, and `sweep[3]` the one task.

The same regular expression serves the store's query (SQLite's REGEXP, as SQLAlchemy registers
it, and PostgreSQL's `~`: it uses only what both dialects read the same) and the manager's own
matching in memory (Python's `re`).
"""

from __future__ import annotations

import re
from functools import lru_cache

#: Characters that a regular expression reads as operators; escaped where meant literally.
_SPECIAL = frozenset(".^$|()[]{}*+?\\")

#: A task's suffix: its index in brackets.
_TASK = r"(\[[0-9]+\])?"


def _literal(text: str) -> str:
    return "".join("\\" + char if char in _SPECIAL else char for char in text)


def _glob(pattern: str) -> str:
    """The regular expression of a shell glob (unanchored)."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        char = pattern[i]
        i += 1
        if char == "*":
            out.append(".*")
        elif char == "?":
            out.append(".")
        elif char == "[":
            j = i
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            j = pattern.find("]", j)
            if j < 0:  # no closing bracket: a literal '['
                out.append("\\[")
                continue
            body = pattern[i:j]
            i = j + 1
            negate = body.startswith("!")
            if negate:
                body = body[1:]
            # Inside brackets only '\' and '^' (and a leading ']') are special to either dialect.
            body = body.replace("\\", "\\\\")
            if body.startswith("^"):
                body = "\\" + body
            out.append(f"[{'^' if negate else ''}{body}]")
        else:
            out.append(_literal(char))
    return "".join(out)


@lru_cache(maxsize=256)
def name_regex(pattern: str) -> str:
    """The regular expression (anchored) of the jobs a name pattern selects."""
    return rf"^({_literal(pattern)}|{_glob(pattern)}){_TASK}$"


def name_matches(name: str, pattern: str) -> bool:
    """Whether a job of this name is selected by the pattern (as the store's query selects)."""
    return re.search(name_regex(pattern), name) is not None
