"""Wording shared by what corral prints: a count with its noun in the right number."""

from __future__ import annotations


def count_noun(count: int, singular: str, plural: str | None = None, *, spec: str = "") -> str:
    """'1 node', '2 nodes', '0 nodes'; `plural` for a noun that does not just take an 's',
    `spec` a format spec for the number (',' gives '2,496 GPUs')."""
    noun = singular if count == 1 else (plural if plural is not None else singular + "s")
    return f"{count:{spec}} {noun}"
