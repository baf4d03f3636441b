"""Supervise one attempt's workers: `python -m corral.exec.shim ATTEMPT_DIR`.

The shim is the only parent of an attempt's workers. It runs in its own session, so it outlives
the server that spawned it (even a `kill -9`); a restarted server finds it again through
`shim.json` and learns how the attempt ended from `result.json`.

Files in ATTEMPT_DIR:
  launch.json        read: job_id, attempt, workdir, stop_signal, grace_s, workers [{rank, argv, env}]
  shim.json          written at start: {"pid", "start_time"} (start_time = field 22 of
                     /proc/PID/stat, so that a reused pid is not mistaken for this shim)
  workers.json       written once the workers run: {"pgid", "workers": [{rank, pid, start_time}]},
                     so that the executor can kill orphaned workers if the shim itself is killed
  rank-R.stdout/.stderr  each worker's output
  result.json        written atomically as the shim ends (see `AttemptResult` fields below)

Signals: SIGTERM asks for a stop (stop_signal to the workers' process group, `grace_s`, then
SIGKILL). SIGHUP and SIGINT are ignored. A worker exiting non-zero ends the whole gang the same
way, and the attempt reports that worker's exit code. When the attempt ends, whatever is left in
the workers' process group is killed, so nothing it started keeps holding GPUs.

Only the standard library is imported here: the shim starts once per attempt and must start fast.
"""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_TAIL_CHARS = 300
TAIL_BYTES = 64 * 1024
# The longest the wait loop sleeps without a wake-up (SIGCHLD and SIGTERM wake it at once).
MAX_WAIT_S = 1.0


# ---------------------------------------------------------------------------------------------
# /proc and file helpers (shared with corral.exec.local)


def read_proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of a process, or None when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            data = stat_file.read()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = data[data.rindex(b")") + 2 :].split()
    # fields[0] is field 3 (state); field 22 (starttime) is fields[19].
    return fields[0].decode(), int(fields[19])


def process_start_time(pid: int) -> int | None:
    stat = read_proc_stat(pid)
    return None if stat is None else stat[1]


def is_alive(pid: int, start_time: int) -> bool:
    """True if `pid` is still the process that started at `start_time` and has not exited."""
    stat = read_proc_stat(pid)
    return stat is not None and stat[1] == start_time and stat[0] not in ("Z", "X")


def write_json_atomic(path: Path, data: dict[str, Any], durable: bool = False) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        json.dump(data, out)
        if durable:
            out.flush()
            os.fsync(out.fileno())
    os.replace(tmp, path)


def last_line(path: Path, max_chars: int = MAX_TAIL_CHARS) -> str:
    """The last non-empty line of a (possibly large) text file, at most `max_chars` long."""
    try:
        with open(path, "rb") as text_file:
            text_file.seek(0, os.SEEK_END)
            size = text_file.tell()
            text_file.seek(max(0, size - TAIL_BYTES))
            data = text_file.read()
    except OSError:
        return ""
    for line in reversed(data.decode("utf-8", errors="replace").splitlines()):
        stripped = line.strip()
        if stripped:
            return stripped[:max_chars]
    return ""


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# ---------------------------------------------------------------------------------------------
# The supervisor


@dataclass(slots=True)
class Worker:
    rank: int
    popen: subprocess.Popen[bytes]
    # Popen-style: >= 0 exit code, < 0 killed by that signal, None still running.
    returncode: int | None = None


@dataclass(slots=True)
class AttemptResult:
    exit_code: int | None
    signal: int | None
    stopped: bool
    reason: str
    error_tail: str = ""
    workers: list[dict[str, Any]] = field(default_factory=list)


def _ignore(signum: int, frame: object) -> None:
    # A Python-level handler (not SIG_IGN) so that the workers get the default action back on
    # exec; its only effect is to wake the wait loop through the wake-up fd.
    return None


class Shim:
    def __init__(self, attempt_dir: Path) -> None:
        self.attempt_dir = attempt_dir
        self.stop_requested = False
        self.launch: dict[str, Any] = {}
        self.workers: list[Worker] = []
        self.pgid: int | None = None
        self.failed_rank: int | None = None
        self.kill_deadline: float | None = None
        self.killed_after_grace = False
        self.wake_read, self.wake_write = os.pipe()
        os.set_blocking(self.wake_read, False)
        os.set_blocking(self.wake_write, False)

    # -- signals -------------------------------------------------------------------------------

    def _on_sigterm(self, signum: int, frame: object) -> None:
        self.stop_requested = True

    def install_signal_handlers(self) -> None:
        signal.set_wakeup_fd(self.wake_write, warn_on_full_buffer=False)
        signal.signal(signal.SIGTERM, self._on_sigterm)
        signal.signal(signal.SIGCHLD, _ignore)
        signal.signal(signal.SIGHUP, _ignore)
        signal.signal(signal.SIGINT, _ignore)
        # The executor spawns the shim with SIGTERM blocked, so that a stop() arriving before
        # this point stays pending instead of killing the shim with the default action.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})

    # -- the attempt ---------------------------------------------------------------------------

    def run(self) -> AttemptResult:
        self.install_signal_handlers()
        write_json_atomic(
            self.attempt_dir / "shim.json",
            {"pid": os.getpid(), "start_time": process_start_time(os.getpid())},
        )
        try:
            with open(self.attempt_dir / "launch.json", encoding="utf-8") as launch_file:
                self.launch = json.load(launch_file)
            specs = sorted(self.launch["workers"], key=lambda worker: int(worker["rank"]))
            stop_signal = int(self.launch["stop_signal"])
            grace_s = float(self.launch["grace_s"])
            workdir = str(self.launch["workdir"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return AttemptResult(None, None, False, f"bad launch.json: {exc}")
        if not specs or not all(spec.get("argv") for spec in specs):
            return AttemptResult(None, None, False, "bad launch.json: a worker without argv")
        if self.stop_requested:
            return AttemptResult(None, None, True, "stopped before the workers started")
        start_error = self.start_workers(specs, workdir)
        if start_error is not None:
            self.begin_gang_stop(stop_signal, grace_s)
            self.wait(stop_signal, grace_s)
            return start_error
        self.wait(stop_signal, grace_s)
        return self.outcome(stop_signal, grace_s)

    def start_workers(self, specs: list[dict[str, Any]], workdir: str) -> AttemptResult | None:
        for spec in specs:
            rank = int(spec["rank"])
            env = dict(os.environ)
            env.update({str(key): str(value) for key, value in spec.get("env", {}).items()})
            stdout_path = self.attempt_dir / f"rank-{rank}.stdout"
            stderr_path = self.attempt_dir / f"rank-{rank}.stderr"
            with open(stdout_path, "ab") as stdout, open(stderr_path, "ab") as stderr:
                try:
                    popen = subprocess.Popen(
                        [str(arg) for arg in spec["argv"]],
                        stdin=subprocess.DEVNULL,
                        stdout=stdout,
                        stderr=stderr,
                        cwd=workdir,
                        env=env,
                        # Worker 0 leads a new group; the others join it so that one killpg
                        # reaches the whole gang (and anything the workers start).
                        process_group=0 if self.pgid is None else self.pgid,
                    )
                except OSError as exc:
                    message = f"cannot start rank {rank}: {exc}"
                    stderr.write(f"corral: {message}\n".encode())
                    stderr.flush()
                    # The shell's conventions: 126 found but not runnable, 127 not found.
                    code = 126 if exc.errno in (errno.EACCES, errno.ENOEXEC) else 127
                    self.failed_rank = rank
                    self.record_workers()
                    return AttemptResult(code, None, False, message, last_line(stderr_path))
            if self.pgid is None:
                self.pgid = popen.pid
            self.workers.append(Worker(rank, popen))
        self.record_workers()
        return None

    def record_workers(self) -> None:
        write_json_atomic(
            self.attempt_dir / "workers.json",
            {
                "pgid": self.pgid,
                "workers": [
                    {
                        "rank": worker.rank,
                        "pid": worker.popen.pid,
                        "start_time": process_start_time(worker.popen.pid),
                    }
                    for worker in self.workers
                ],
            },
        )

    def reap(self) -> None:
        for index, worker in enumerate(self.workers):
            if worker.returncode is not None:
                continue
            if index == 0:
                # Peek without reaping: worker 0's pid is the group id, and keeping it a zombie
                # until the final killpg guarantees that the id cannot be reused meanwhile.
                status = os.waitid(os.P_PID, worker.popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                if status is None or status.si_pid == 0:
                    continue
                killed = status.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
                worker.returncode = -status.si_status if killed else status.si_status
            else:
                worker.returncode = worker.popen.poll()
            if worker.returncode is not None and worker.returncode != 0:
                if not self.stop_requested and self.failed_rank is None:
                    self.failed_rank = worker.rank

    def begin_gang_stop(self, stop_signal: int, grace_s: float) -> None:
        if self.kill_deadline is not None:
            return
        self.kill_deadline = time.monotonic() + grace_s
        self.signal_group(stop_signal)

    def signal_group(self, number: int) -> None:
        if self.pgid is None:
            return
        try:
            os.killpg(self.pgid, number)
        except ProcessLookupError:
            pass

    def wait(self, stop_signal: int, grace_s: float) -> None:
        while True:
            self.reap()
            if self.stop_requested or self.failed_rank is not None:
                self.begin_gang_stop(stop_signal, grace_s)
            if all(worker.returncode is not None for worker in self.workers):
                break
            timeout = MAX_WAIT_S
            if self.kill_deadline is not None and not self.killed_after_grace:
                remaining = self.kill_deadline - time.monotonic()
                if remaining <= 0:
                    self.signal_group(signal.SIGKILL)
                    self.killed_after_grace = True
                    continue
                timeout = min(timeout, remaining)
            select.select([self.wake_read], [], [], timeout)
            try:
                while os.read(self.wake_read, 4096):
                    pass
            except BlockingIOError:
                pass
        # Anything the workers left behind in their group goes too; then worker 0 is reaped.
        self.signal_group(signal.SIGKILL)
        for worker in self.workers:
            worker.popen.wait()

    def outcome(self, stop_signal: int, grace_s: float) -> AttemptResult:
        workers = [
            {
                "rank": worker.rank,
                "pid": worker.popen.pid,
                "exit_code": _exit_code(worker.returncode),
                "signal": _signal_of(worker.returncode),
            }
            for worker in self.workers
        ]
        if self.failed_rank is not None:
            failed = next(worker for worker in self.workers if worker.rank == self.failed_rank)
            code = failed.returncode
            assert code is not None
            if code > 0:
                reason = f"exit code {code} (rank {failed.rank})"
            else:
                reason = f"killed by {signal_name(-code)} (rank {failed.rank})"
            tail = last_line(self.attempt_dir / f"rank-{failed.rank}.stderr")
            return AttemptResult(_exit_code(code), _signal_of(code), False, reason, tail, workers)
        first = self.workers[0].returncode
        assert first is not None
        if self.stop_requested:
            if self.killed_after_grace and any(
                w.returncode == -signal.SIGKILL for w in self.workers
            ):
                reason = f"stopped: killed by SIGKILL after {grace_s:g} s grace"
                return AttemptResult(None, signal.SIGKILL, True, reason, "", workers)
            if first >= 0:
                reason = f"stopped: exit code {first} after {signal_name(stop_signal)}"
            else:
                reason = f"stopped: ended by {signal_name(-first)}"
            return AttemptResult(_exit_code(first), _signal_of(first), True, reason, "", workers)
        return AttemptResult(first, None, False, f"exit code {first}", "", workers)

    def kill_everything(self) -> None:
        """Last resort after an unexpected error: no worker may outlive its supervisor."""
        self.signal_group(signal.SIGKILL)
        for worker in self.workers:
            if worker.popen.returncode is None:
                worker.popen.kill()
                worker.popen.wait()


def _exit_code(returncode: int | None) -> int | None:
    return returncode if returncode is not None and returncode >= 0 else None


def _signal_of(returncode: int | None) -> int | None:
    return -returncode if returncode is not None and returncode < 0 else None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m corral.exec.shim ATTEMPT_DIR", file=sys.stderr)
        return 2
    attempt_dir = Path(args[0])
    shim = Shim(attempt_dir)
    try:
        result = shim.run()
    except Exception as exc:  # the result file must be written whatever went wrong
        shim.kill_everything()
        result = AttemptResult(None, None, shim.stop_requested, f"shim error: {exc!r}")
    launch = shim.launch
    write_json_atomic(
        attempt_dir / "result.json",
        {
            "job_id": launch.get("job_id"),
            "attempt": launch.get("attempt"),
            "exit_code": result.exit_code,
            "signal": result.signal,
            "stopped": result.stopped,
            "reason": " ".join(result.reason.split()),
            "error_tail": result.error_tail,
            "ended_at": time.time(),
            "workers": result.workers,
        },
        durable=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
