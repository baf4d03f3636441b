"""corral.cli.common's console writes a plain line as rich would, without importing rich."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from rich.console import Console

from corral.cli.common import LazyConsole, plain_line, plain_stream


class Pipe(io.StringIO):
    """An output that is no terminal (a pipe, a file)."""

    def isatty(self) -> bool:
        return False


LINES = [
    "[bold]tiresias:/data/tiresias-300.csv[/]: 300 jobs on 8 nodes (8x8 v100), 64 GPUs, 1 rack",
    "[bold]philly:/data/cluster_job_log[/]: 1,000 jobs on 2 nodes (2x8 v100), 16 GPUs, 1 rack, "
    "3 VCs, admission quota; dropped 2 jobs larger than the cluster",
    "  note: speeds from /tmp/x.json (4 measured shapes)",
    "  note: a path with spaces, ünïcödé and 中文 that is much longer than one hundred and forty "
    "columns, which rich would wrap were it not written with soft_wrap=True, as every line here",
    "trailing spaces   ",
    "",
    # rich's markup and emoji: written by rich (plain_line says None), the same bytes either way
    "[bold]synthetic:jobs=10[/]: :smile: and :thumbs_up: and :+1:",
    "a [red]tag[/red] and [not a tag",
    "[bold]C:\\traces\\x.csv[/]: 1 job",
    "an [/] alone",
    "a tab\there",
]


def rich_line(text: str) -> str:
    out = Pipe()
    Console(file=out, width=140).print(text, soft_wrap=True)
    return out.getvalue()


def lazy_line(text: str, monkeypatch: pytest.MonkeyPatch) -> str:
    out = Pipe()
    monkeypatch.setattr(sys, "stdout", out)
    console = LazyConsole()
    try:
        console.print(text, soft_wrap=True)
    except Exception as error:  # rich's own errors (a closing tag alone) are rich's
        return f"error {type(error).__name__}"
    finally:
        monkeypatch.undo()
    return out.getvalue()


@pytest.mark.parametrize("text", LINES)
def test_a_plain_line_is_written_as_rich_writes_it(
    text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    try:
        expected = rich_line(text)
    except Exception as error:
        expected = f"error {type(error).__name__}"
    assert lazy_line(text, monkeypatch) == expected


def test_what_rich_must_read_is_left_to_it() -> None:
    """Markup but one bold span, a possible emoji, a backslash or a control character: rich's."""
    assert plain_line("[bold]a:/b[/]: c") == "a:/b: c"
    assert plain_line("x :smile: y") is None
    assert plain_line("x :/not/an/emoji: y") == "x :/not/an/emoji: y"
    assert plain_line("[red]x[/red]") is None
    assert plain_line("[bold]x") is None
    assert plain_line("x [/]") is None
    assert plain_line("a\\b") is None
    assert plain_line("a\tb") is None


def test_a_terminal_or_forced_colour_is_left_to_rich(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(Pipe):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    assert plain_stream(Pipe())
    assert not plain_stream(Tty())
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert not plain_stream(Pipe())
    monkeypatch.delenv("FORCE_COLOR")
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    assert not plain_stream(Pipe())


def test_a_piped_line_imports_no_rich() -> None:
    """Printed to a pipe, the first line and the progress bar's answer need no rich."""
    check = (
        "import sys\n"
        "from corral.cli.common import console\n"
        "from corral.sim.report import progress_bar\n"
        "console.print('[bold]x:/y[/]: 1 job', soft_wrap=True)\n"
        "with progress_bar(console) as progress:\n"
        "    progress.update(progress.add_task('las/relax', total=3), completed=1)\n"
        "assert not [m for m in sys.modules if m.startswith('rich')], sys.modules\n"
        "console.print('[bold]x[/]')\n"  # (anything else: rich's)
        "assert 'rich.console' in sys.modules\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    done = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "x:/y: 1 job\n\nx\n"  # (the bar's empty line, as rich's)


def test_the_quiet_progress_bar_writes_what_rich_writes_to_a_pipe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On an output that is no terminal rich's transient bar draws nothing and, stopping,
    writes one empty line; the bar `progress_bar` gives there writes the same, without rich."""
    from rich.progress import Progress

    from corral.sim.report import QuietProgress, progress_bar

    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    monkeypatch.delenv("TTY_INTERACTIVE", raising=False)

    def run(bar: object) -> None:
        with bar as progress:  # type: ignore[attr-defined]
            task = progress.add_task("las/relax", total=3, start=False)
            progress.start_task(task)
            progress.update(task, completed=2, description="las: done")

    rich_out = Pipe()
    console = Console(file=rich_out, width=140)
    console.print("first", soft_wrap=True)
    run(Progress(console=console, transient=True))
    console.print("after", soft_wrap=True)
    out = Pipe()
    monkeypatch.setattr(sys, "stdout", out)
    lazy = LazyConsole()
    lazy.print("first", soft_wrap=True)
    bar = progress_bar(lazy)
    assert isinstance(bar, QuietProgress)
    run(bar)
    lazy.print("after", soft_wrap=True)
    monkeypatch.undo()
    assert out.getvalue() == rich_out.getvalue() == "first\n\nafter\n"
    assert isinstance(progress_bar(console), QuietProgress)  # (rich's own console: the same)
