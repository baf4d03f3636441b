"""`python -m corral.exec.guard PARENT_PID [OPTIONS] -- ARGV...`: run ARGV in a container of its
own (corral.exec.contain), and end everything in it when ARGV ends, when PARENT_PID (the Ray
actor that started this guard) dies, or when the actor asks.

A Ray node whose daemons die (OOM killer, `ray stop`, a crash) while the machine lives on would
otherwise leave the job's processes running, holding GPUs and writing the checkpoint, while the
manager restarts the job elsewhere. The guard leads the worker's process group: signals sent to
the group reach the command directly (the guard outlives every signal a process can catch), and
the guard ends as its command did: the same exit code, or the same signal. It is the child
subreaper of everything the command starts, and (as root) puts the command in a cgroup, so that
what left the group (`setsid`, double forks, torchrun's workers) is ended with it too.

The guard is two processes (see `main`): Ray SIGKILLs an actor's children as the actor goes
(`ray.kill`, its worker exiting), so the one that ends the container is the actor's grandchild.

Options:
  --contain MECHANISM   a corral.exec.contain mechanism (default: $CORRAL_CONTAIN, else auto)
  --name NAME           names the container (the actor's name)
  --log-cap BYTES       cap the guard's own stdout and stderr, when they are files (the worker's
                        log files, which the command inherits), with corral.exec.logcap
  --control-stdin       stdin is a pipe from the actor: a "k" on it means "kill everything now"
                        (the end of a stop's grace; a SIGKILL to the group would kill the guard
                        before it could end the container), and its end means the actor died
  --report PATH         write {"leftover": [pids], "oom_kills": N} there as the guard ends
  --memory BYTES, --cpus CPUS, --pids-max N
                        the container's limits (corral.exec.contain.Limits); one that this node
                        cannot enforce is named on stderr (the worker's log) and not set
"""

from __future__ import annotations

import json
import os
import select
import signal
import stat
import subprocess
import sys
import time

from corral.exec import contain
from corral.exec.shim import LogCapper

#: How often the guard checks on its parent (seconds): a dead node's workers die this late.
CHECK_EVERY_S = 0.5
#: Signals the guard cannot outlive (KILL, STOP), and those a fault raises, which a handler that
#: returns would raise again.
UNHANDLED = {
    signal.SIGKILL,
    signal.SIGSTOP,
    signal.SIGSEGV,
    signal.SIGBUS,
    signal.SIGFPE,
    signal.SIGILL,
    signal.SIGTRAP,
    signal.SIGSYS,
}
KILL_REQUEST = b"k"
#: The options that take a value.
LONG_OPTIONS = ("--contain", "--name", "--log-cap", "--report", "--memory", "--cpus", "--pids-max")
USAGE = "usage: python -m corral.exec.guard PARENT_PID [OPTIONS] -- ARGV..."


def _ignore(number: int, frame: object) -> None:
    pass


def _parse(argv: list[str]) -> tuple[int, dict[str, str], list[str]] | None:
    if len(argv) < 3 or "--" not in argv[1:]:
        return None
    split = argv.index("--", 1)
    command = argv[split + 1 :]
    options: dict[str, str] = {}
    words = argv[1:split]
    while words:
        word = words.pop(0)
        if word == "--control-stdin":
            options["control"] = "stdin"
        elif word in LONG_OPTIONS and words:
            options[word[2:]] = words.pop(0)
        else:
            return None
    try:
        parent = int(argv[0])
    except ValueError:
        return None
    return (parent, options, command) if command else None


def _capped_files() -> list[int]:
    """The guard's stdout and stderr, where they are regular files (the logs)."""
    found = []
    for fd in (1, 2):
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                found.append(fd)
        except OSError:
            continue
    return found


def _wake_pipe() -> int:
    """A pipe that signals write to (SIGCHLD wakes the select); returns its read end."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
    return wake_read


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _end_as(returncode: int) -> int:
    """Exit as a process that ended with `returncode` (Popen-style) did."""
    if returncode >= 0:
        return returncode
    number = -returncode
    if number not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(number, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {number})
    os.kill(os.getpid(), number)
    return 128 + number


def main(argv: list[str]) -> int:
    """The guard is two processes. The first, the actor's child, only waits for the second and
    ends as it does: Ray SIGKILLs an actor's children when the actor goes, and the second, its
    grandchild, must live on to end the job's container. The second (the keeper) runs the
    command and ends everything when the first goes (the life line pipe closes), when the actor
    goes (its control pipe closes), when asked, or when the command ends."""
    parsed = _parse(argv)
    if parsed is None:
        print(USAGE, file=sys.stderr)
        return 2
    parent, options, command = parsed
    # The group's signals reach the command itself; the guard outlives them. A handler, not
    # SIG_IGN: exec resets handled signals to their default, but keeps ignored ones ignored.
    for caught in signal.valid_signals() - UNHANDLED:
        try:
            signal.signal(caught, _ignore)
        except (OSError, ValueError):  # kept by the C library for itself
            pass
    life_read, life_write = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    keeper = os.fork()
    if keeper == 0:
        os.close(life_write)
        try:
            code = _keep(options, command, life_read)
        except BaseException as error:  # never back into the first process's code
            print(f"corral: guard error: {error!r}", file=sys.stderr)
            code = 127
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_end_as(code))
    os.close(life_read)
    wake_read = _wake_pipe()
    while True:
        status = os.waitid(os.P_PID, keeper, os.WEXITED | os.WNOHANG)
        if status is not None and status.si_pid == keeper:
            killed = status.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
            return _end_as(-status.si_status if killed else status.si_status)
        if life_write >= 0 and os.getppid() != parent:  # the actor died: so does the job
            os.close(life_write)
            life_write = -1
        select.select([wake_read], [], [], CHECK_EVERY_S)
        _drain(wake_read)


def _keep(options: dict[str, str], command: list[str], life_read: int) -> int:
    """The keeper: run the command in its container; returns its Popen-style returncode."""
    control = options.get("control") == "stdin"
    log_cap = int(options.get("log-cap", "0"))
    wake_read = _wake_pipe()
    try:
        limits = contain.Limits.parse(
            {
                "memory_bytes": int(options["memory"]) if "memory" in options else None,
                "cpus": float(options["cpus"]) if "cpus" in options else None,
                "pids": int(options["pids-max"]) if "pids-max" in options else None,
            }
        )
        container = contain.Container.create(
            options.get("name", "worker"), options.get("contain"), limits=limits
        )
    except (contain.ContainError, OSError, ValueError) as error:
        print(f"corral: cannot contain {command[0]}: {error}", file=sys.stderr)
        return 127
    for why in container.unenforced.values():
        print(f"corral: limit not enforced on this node: {why}", file=sys.stderr, flush=True)
    try:
        with container.entered():
            child = subprocess.Popen(command, stdin=subprocess.DEVNULL if control else None)
    except OSError as error:
        print(f"corral: cannot start {command[0]}: {error}", file=sys.stderr)
        container.end()
        return 127
    capper = LogCapper(_capped_files() if log_cap > 0 else [], log_cap)
    watched = [wake_read, life_read] + ([0] if control else [])
    returncode = None
    while returncode is None:
        capper.cap_if_due()
        ready, _, _ = select.select(watched, [], [], min(CHECK_EVERY_S, capper.due_in()))
        if wake_read in ready:
            _drain(wake_read)
            contain.reap_orphans({child.pid})
        returncode = child.poll()
        if returncode is not None:
            break
        # A kill asked for, or the end of a pipe: the actor or the first process is gone.
        ordered = life_read in ready and not os.read(life_read, 64)
        if 0 in ready:
            message = os.read(0, 64)
            ordered = ordered or KILL_REQUEST in message or not message
        if ordered:
            container.end({child.pid})
            returncode = child.wait()
    # Whatever the command left behind goes with it, before the actor learns of its end.
    oom_kills = container.oom_kills()  # (before its cgroups go)
    left = container.end({child.pid})
    capper.cap()
    if left:
        print(f"corral: {len(left)} process(es) could not be ended: {left}", file=sys.stderr)
    if "report" in options:
        with open(options["report"], "w", encoding="utf-8") as report:
            json.dump({"leftover": left, "ended_at": time.time(), "oom_kills": oom_kills}, report)
    return returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
