"""What the `corral` commands share: the consoles, the user's errors and option parsing.

Every module of corral.cli imports these from here; corral.cli.main imports the modules that
hold commands and registers them, and none of them imports corral.cli.main.
"""

from __future__ import annotations

from typing import NoReturn

from rich.console import Console
from rich.markup import escape

console = Console()
if not console.is_terminal:
    console = Console(
        width=140
    )  # piped output (CI, files): keep the summary table on one line a run
err_console = Console(stderr=True)


class UserError(Exception):
    """An error the user caused: shown as one line, exit code 2."""


def fail(message: str) -> NoReturn:
    """One line on stderr, exit code 2; the message is text, never rich markup."""
    import typer  # (here: a run of `corral simulate` read by corral.cli.simargs imports none)

    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def warn(message: str) -> None:
    """One line on stderr that does not stop the command; the message is text, not markup."""
    err_console.print(
        f"[bold yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True
    )


def parse_floats(option: str, text: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserError(f"{option}: expected comma-separated numbers, got {text!r}") from None
