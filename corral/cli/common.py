"""What the `corral` commands share: the consoles, the user's errors and option parsing.

Every module of corral.cli imports these from here; corral.cli.main imports the modules that
hold commands and registers them, and none of them imports corral.cli.main.
"""

from __future__ import annotations

import os
import re
import sys
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

if TYPE_CHECKING:
    from rich.console import Console

#: A line rich writes as it is to a stream that is no terminal: printable, no backslash, no
#: markup but one `[bold]...[/]`.
PLAIN_MARKUP = re.compile(r"[^\[\\]*(?:\[bold\][^\[\\]*\[/\])?[^\[\\]*")
#: The characters of rich's emoji names (rich._emoji_codes), which it replaces in `:name:`.
EMOJI_NAME = re.compile(r"[!#&()*+\-.0-9_a-z\u00e3\u00e5\u00e7\u00e9\u00ed\u00f4\u2019]+")


def plain_stream(stream: TextIO) -> bool:
    """Whether rich's Console would see `stream` as no terminal, for sure (else: ask rich)."""
    environ = os.environ
    if any(environ.get(name) is not None for name in ("FORCE_COLOR", "TTY_COMPATIBLE")):
        return False
    if environ.get("TTY_INTERACTIVE") is not None:  # (rich's is_interactive)
        return False
    if "IPython" in sys.modules or "idlelib" in sys.modules:  # (rich's own cases)
        return False
    isatty = getattr(stream, "isatty", None)
    try:
        return isatty is not None and not isatty()
    except ValueError:
        return False


def plain_line(text: str) -> str | None:
    """The line rich's `print(text, soft_wrap=True)` writes to a stream that is no terminal
    (without its newline), where that is sure; else None."""
    if not text.isprintable() or PLAIN_MARKUP.fullmatch(text) is None:
        return None
    line = text.replace("[bold]", "").replace("[/]", "")
    if any(EMOJI_NAME.fullmatch(name) for name in line.split(":")[1:-1]):
        return None  # (what could be an emoji's `:name:`)
    return line


class LazyConsole:
    """rich's Console, made when first used: importing rich.console is some 150 M instructions
    (20 to 35 ms of CPU) of a `corral simulate`'s start, before its first event. A line of text
    to an output that is no terminal is written without it, as rich writes it (`print` of one
    string with `soft_wrap=True`, or of nothing; tests/cli/test_console.py compares them); then
    `is_terminal`, `is_interactive` and `is_jupyter` are answered without rich too, and the
    simulator's progress bar is one that draws nothing, as rich's draws nothing there
    (corral.sim.report.progress_bar). Anything else is rich's."""

    def __init__(self, *, stderr: bool = False) -> None:
        self._stderr = stderr
        self._console: Console | None = None

    def real(self) -> Console:
        if self._console is None:
            from rich.console import Console

            console = Console(stderr=self._stderr)
            if not self._stderr and not console.is_terminal:
                console = Console(
                    width=140
                )  # piped (CI, files): the summary table on one line a run
            self._console = console
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real(), name)

    def _stream(self) -> TextIO:
        return sys.stderr if self._stderr else sys.stdout

    def _plain(self) -> bool:
        return self._console is None and plain_stream(self._stream())

    @property
    def is_terminal(self) -> bool:
        return False if self._plain() else bool(self.real().is_terminal)

    @property
    def is_interactive(self) -> bool:
        return False if self._plain() else bool(self.real().is_interactive)

    @property
    def is_jupyter(self) -> bool:
        return False if self._plain() else bool(self.real().is_jupyter)

    def print(self, *objects: Any, **options: Any) -> None:
        line: str | None = None
        if not objects and not options:
            line = ""  # (an empty line)
        elif len(objects) == 1 and options == {"soft_wrap": True} and isinstance(objects[0], str):
            line = plain_line(objects[0])
        if line is not None and self._plain():
            stream = self._stream()
            stream.write(line + "\n")
            stream.flush()
            return
        self.real().print(*objects, **options)


console: Any = LazyConsole()
err_console: Any = LazyConsole(stderr=True)


class UserError(Exception):
    """An error the user caused: shown as one line, exit code 2."""


def fail(message: str) -> NoReturn:
    """One line on stderr, exit code 2; the message is text, never rich markup."""
    import typer  # (here: a run of `corral simulate` read by corral.cli.simargs imports none)
    from rich.markup import escape

    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def warn(message: str) -> None:
    """One line on stderr that does not stop the command; the message is text, not markup."""
    from rich.markup import escape

    err_console.print(
        f"[bold yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True
    )


def parse_floats(option: str, text: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserError(f"{option}: expected comma-separated numbers, got {text!r}") from None
