"""`python -m corral.exec.guard PARENT_PID -- ARGV...`: run ARGV, and kill its whole process
group if PARENT_PID (the Ray actor that started this guard) dies first.

A Ray node whose daemons die (OOM killer, `ray stop`, a crash) while the machine lives on would
otherwise leave the job's processes running, holding GPUs and writing the checkpoint, while the
manager restarts the job elsewhere. The guard leads the worker's process group: signals sent to
the group reach the command directly (the guard outlives every signal a process can catch), and
the guard ends as its command did: the same exit code, or the same signal.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

#: How often the guard checks on its parent (seconds): a dead node's workers die this late.
CHECK_EVERY_S = 0.5
#: Signals the guard cannot outlive (KILL, STOP), that tell it of its child (CHLD), and those a
#: fault raises, which a handler that returns would raise again.
UNHANDLED = {
    signal.SIGKILL,
    signal.SIGSTOP,
    signal.SIGCHLD,
    signal.SIGSEGV,
    signal.SIGBUS,
    signal.SIGFPE,
    signal.SIGILL,
    signal.SIGTRAP,
    signal.SIGSYS,
}


def _ignore(number: int, frame: object) -> None:
    pass


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m corral.exec.guard PARENT_PID -- ARGV...", file=sys.stderr)
        return 2
    parent = int(argv[0])
    # The group's signals reach the command itself; the guard outlives them. A handler, not
    # SIG_IGN: exec resets handled signals to their default, but keeps ignored ones ignored.
    for caught in signal.valid_signals() - UNHANDLED:
        try:
            signal.signal(caught, _ignore)
        except (OSError, ValueError):  # kept by the C library for itself
            pass
    try:
        child = subprocess.Popen(argv[2:])
    except OSError as error:
        print(f"corral: cannot start {argv[2]}: {error}", file=sys.stderr)
        return 127
    while True:
        try:
            returncode = child.wait(timeout=CHECK_EVERY_S)
            break
        except subprocess.TimeoutExpired:
            if os.getppid() != parent:  # the actor died: so does the job, here and now
                os.killpg(0, signal.SIGKILL)
    if returncode >= 0:
        return returncode
    number = -returncode
    signal.signal(number, signal.SIG_DFL)
    os.kill(os.getpid(), number)
    return 128 + number


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
