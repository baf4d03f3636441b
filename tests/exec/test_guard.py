"""The guard that leads a Ray worker's process group (corral/exec/guard.py): it ends as its
command ends, outlives the signals sent to the group, and kills the group when its parent dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.server.helpers import alive

PYTHON = sys.executable


def guard(parent: int, *argv: str) -> list[str]:
    return [PYTHON, "-m", "corral.exec.guard", str(parent), "--", *argv]


def wait_for(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text().strip():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def test_the_guard_ends_as_its_command_did() -> None:
    me = os.getpid()
    assert subprocess.run(guard(me, PYTHON, "-c", "raise SystemExit(3)")).returncode == 3
    killed = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    assert subprocess.run(guard(me, PYTHON, "-c", killed)).returncode == -signal.SIGTERM
    missing = subprocess.run(guard(me, "/nonexistent/cmd"), capture_output=True, text=True)
    assert missing.returncode == 127 and "cannot start /nonexistent/cmd" in missing.stderr


def test_usage_is_refused() -> None:
    result = subprocess.run(guard(os.getpid())[:-1], capture_output=True, text=True)
    assert result.returncode == 2 and "usage" in result.stderr


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT, signal.SIGALRM, signal.SIGUSR2])
def test_a_signal_to_the_group_reaches_the_command_and_the_guard_waits_for_it(
    tmp_path: Path, number: int
) -> None:
    # The command catches the signal, and takes a moment to end with exit code 7: a guard that
    # died of the signal would end at once, and of it.
    ready = tmp_path / "ready"
    command = (
        "import signal, sys, time\n"
        f"signal.signal({int(number)}, lambda *a: (time.sleep(0.5), sys.exit(7)))\n"
        f"open({str(ready)!r}, 'w').write('up')\n"
        "time.sleep(30)\n"
    )
    process = subprocess.Popen(guard(os.getpid(), PYTHON, "-c", command), process_group=0)
    try:
        wait_for(ready)
        os.killpg(process.pid, number)
        assert process.wait(timeout=60) == 7
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_the_group_dies_with_the_guards_parent(tmp_path: Path) -> None:
    # A stand-in for the Ray actor starts the guard, then dies by SIGKILL.
    pid_file = tmp_path / "command.pid"
    actor = (
        "import os, subprocess, sys, time\n"
        f"argv = [sys.executable, '-m', 'corral.exec.guard', str(os.getpid()), '--',\n"
        f"        'sh', '-c', 'echo $$ > {pid_file}; exec sleep 60']\n"
        "subprocess.Popen(argv, process_group=0)\n"
        "time.sleep(60)\n"
    )
    stand_in = subprocess.Popen([PYTHON, "-c", actor])
    try:
        wait_for(pid_file)
        command = int(pid_file.read_text())
        time.sleep(1.0)  # not a wait for anything: a second in which nothing may happen
        assert alive(command)  # its parent lives: the guard leaves it be
    finally:
        stand_in.kill()
        stand_in.wait()
    deadline = time.monotonic() + 60
    while alive(command):
        assert time.monotonic() < deadline, "the command outlived its guard's parent"
        time.sleep(0.05)
