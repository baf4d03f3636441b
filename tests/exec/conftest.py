"""Fixtures for executor tests: real shims and workers in a tmp dir, none left behind."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from corral.exec.local import LocalExecutor, kill_attempt
from corral.exec.shim import read_proc_stat
from tests.exec.contain_helpers import kill_marked


def _processes_under(root: Path) -> list[int]:
    """Live processes whose cwd or command line is inside `root` (our shims and workers)."""
    found = []
    root_text = str(root)
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        stat = read_proc_stat(int(entry))
        if stat is None or stat[0] in ("Z", "X"):
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline_file:
                cmdline = cmdline_file.read().decode(errors="replace")
        except OSError:
            continue
        if cwd.startswith(root_text) or root_text in cmdline:
            found.append(int(entry))
    return found


@pytest.fixture
def make_executor(tmp_path: Path) -> Iterator[Callable[[], LocalExecutor]]:
    """New LocalExecutors (as after a server restart); fails the test if processes leak."""
    executors: list[LocalExecutor] = []

    def make() -> LocalExecutor:
        executor = LocalExecutor()
        executors.append(executor)
        return executor

    try:
        yield make
    finally:
        try:
            for executor in executors:
                executor.close()
        finally:
            for attempt_dir in tmp_path.rglob("attempt-*"):
                kill_attempt(attempt_dir)
    # SIGKILL takes a moment to land (longer on a loaded machine); anything still there after
    # that is a leak.
    deadline = time.monotonic() + 10.0
    leftovers = _processes_under(tmp_path)
    while leftovers and time.monotonic() < deadline:
        time.sleep(0.05)
        leftovers = _processes_under(tmp_path)
    for pid in leftovers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not leftovers, f"processes left behind: {leftovers}"


@pytest.fixture
def executor(make_executor: Callable[[], LocalExecutor]) -> LocalExecutor:
    return make_executor()


@pytest.fixture
def mark() -> Iterator[str]:
    """A value every process of the test's job carries (contain_helpers.MARK); whatever
    carries it is killed at the end."""
    value = uuid.uuid4().hex
    yield value
    kill_marked(value)
