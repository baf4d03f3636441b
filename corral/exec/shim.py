"""Supervise one attempt's workers: `python -m corral.exec.shim ATTEMPT_DIR`.

The shim is the only parent of an attempt's workers. It runs in its own session, so it outlives
the server that spawned it (even a `kill -9`); a restarted server finds it again through
`shim.json` and learns how the attempt ended from `result.json`.

ATTEMPT_DIR and every directory above it must belong to root or the shim's own account and be
writable by no one else (a world-writable parent only with the sticky bit, like /tmp), and
launch.json must be such a file too (corral.exec.safefs): otherwise the shim refuses in one line
and runs nothing. Every file below is opened relative to the checked directory's descriptor.

Files in ATTEMPT_DIR (the control files are the shim's, mode 0600):
  launch.json        read: job_id, attempt, workdir, stop_signal, grace_s, workers [{rank, argv, env}],
                     and optionally run_as {user, uid, gid, home}, gpu_devices [int], device_dir,
                     log_cap_bytes, contain (a corral.exec.contain mechanism), end_timeout_s,
                     limits {memory_bytes, cpus, pids} (the attempt's, all its workers together)
  shim.json          written at start: {"pid", "start_time"} (start_time = field 22 of
                     /proc/PID/stat, so that a reused pid is not mistaken for this shim), and again
                     with "container" (`Container.record`) once the container exists, before any
                     worker starts, so that the executor can end it if the shim itself is killed
  workers.json       written once the workers run: {"pgid", "workers": [{rank, pid, start_time}]}
  rank-R.stdout/.stderr  each worker's output: created here (O_NOFOLLOW, mode 0600, owned by the
                     run_as account), capped at log_cap_bytes (corral.exec.logcap) while it runs;
                     a torchrun worker's, one pair per process it starts, R its global RANK
                     (PROCESS_RANKS_VARIABLE), the agent's own output in its first process's
  rank-R.progress    the worker's progress reports (docs/progress.md), appended by the job
                     through $CORRAL_PROGRESS_FILE: created and capped like the logs
  result.json        written atomically as the shim ends (see `AttemptResult` fields below), with
                     "leftover": [pids] that could not be ended

Every worker starts inside the attempt's container (corral.exec.contain: a cgroup where the
machine allows it, and this shim as their child subreaper in any case), so processes that leave
the process group (`setsid`, double forks, torchrun's workers) are still the attempt's. With
run_as, the workers run as that account (its uid, gid, no supplementary groups, and its HOME,
USER and LOGNAME); the shim stays root, to kill them and manage the cgroups.

Signals: SIGTERM asks for a stop (stop_signal to the workers' process group, `grace_s`, then
SIGKILL). SIGHUP and SIGINT are ignored. A worker exiting non-zero ends the whole gang the same
way, and the attempt reports that worker's exit code. However the attempt ends (every worker
exited, one failed, a stop, an error of the shim's own), every process left in its container is
killed and gone BEFORE result.json is written: the manager hands the GPUs on only once that file
exists, so they are never handed on while a process of the old attempt lives. What cannot be
ended within `end_timeout_s` (a process stuck in the kernel) is named in result.json's
"leftover" and in its reason.

Only the standard library is imported here: the shim starts once per attempt and must start fast.
"""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.exec import contain, logcap, safefs

#: Where a worker appends its progress reports (corral.progress; the protocol: docs/progress.md).
PROGRESS_VARIABLE = "CORRAL_PROGRESS_FILE"
#: A torchrun worker's variable (corral.exec.local.placement_worker_envs): the global RANKs
#: torchrun gives its processes ("2,3"). Each gets its own rank-<RANK>.stdout and .stderr here
#: (the agent's own output goes to its first process's), and the worker RANK_LOGS_VARIABLE, their
#: directory, where each process sends its output (corral.exec.local._TORCHRUN_PROCESS).
PROCESS_RANKS_VARIABLE = "CORRAL_PROCESS_RANKS"
RANK_LOGS_VARIABLE = "CORRAL_RANK_LOGS"

MAX_TAIL_CHARS = 300
TAIL_BYTES = 64 * 1024
# The longest the wait loop sleeps without a wake-up (SIGCHLD and SIGTERM wake it at once).
MAX_WAIT_S = 1.0
#: How often the workers' log files are capped while they run: at least this often, and more
#: often when a file could pass half its cap sooner, growing at the rate it did or at least at
#: FLOOD_BYTES_PER_S (never more than every MIN_CAP_EVERY_S): a flood overshoots a small cap by
#: little, and a large cap costs no more wake-ups than CAP_EVERY_S.
CAP_EVERY_S = 0.25
MIN_CAP_EVERY_S = 0.005
FLOOD_BYTES_PER_S = 256 << 20
LOG_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC


# ---------------------------------------------------------------------------------------------
# /proc and file helpers (shared with corral.exec.local)


def read_proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of a process, or None when it does not exist."""
    found = contain.proc_stat(pid)
    return None if found is None else (found[1], found[2])


def process_start_time(pid: int) -> int | None:
    stat = read_proc_stat(pid)
    return None if stat is None else stat[1]


def is_alive(pid: int, start_time: int) -> bool:
    """True if `pid` is still the process that started at `start_time` and has not exited."""
    stat = read_proc_stat(pid)
    return stat is not None and stat[1] == start_time and stat[0] not in ("Z", "X")


def write_json_atomic(
    path: Path,
    data: dict[str, Any],
    durable: bool = False,
    replace: bool = True,
    dir_fd: int | None = None,
) -> bool:
    """Write `data` to `path` all at once (mode 0600: a job's environment is no one else's).
    `replace=False` leaves an existing file as it is; returns whether `path` was written. With
    `dir_fd`, `path` is a name in that directory (one checked by corral.exec.safefs)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
    with open(fd, "w", encoding="utf-8") as out:
        json.dump(data, out)
        if durable:
            out.flush()
            os.fsync(out.fileno())
    if replace:
        os.replace(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        return True
    try:
        # Fails if it exists: never clobbers what the shim wrote.
        os.link(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp, dir_fd=dir_fd)


def process_ranks(value: str) -> list[int]:
    """PROCESS_RANKS_VARIABLE's ranks ("2,3"); [] when unset or not such a list."""
    try:
        ranks = [int(part) for part in value.split(",")] if value else []
    except ValueError:
        return []
    return ranks if all(0 <= rank <= 1_000_000 for rank in ranks) else []


def last_line(path: Path, max_chars: int = MAX_TAIL_CHARS, dir_fd: int | None = None) -> str:
    """The last non-empty line of a (possibly large) text file, at most `max_chars` long; "" for
    anything but a regular file (never through a link, never blocking on a FIFO). With `dir_fd`,
    `path` is a name in that directory."""
    try:
        fd = os.open(path, safefs.READ_FLAGS, dir_fd=dir_fd)
    except OSError:
        return ""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return ""
        data = os.pread(fd, TAIL_BYTES, max(0, info.st_size - TAIL_BYTES))
    except OSError:
        return ""
    finally:
        os.close(fd)
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


class LogCapper:
    """Caps a supervisor's log files (corral.exec.logcap) on the schedule CAP_EVERY_S says."""

    def __init__(self, fds: list[int], cap_bytes: int) -> None:
        self.fds = fds
        self.cap_bytes = cap_bytes
        self.sizes: dict[int, int] = {}
        self.last = self.due = time.monotonic()

    def due_in(self) -> float:
        """Seconds until the next cap is due (MAX_WAIT_S when there is nothing to cap)."""
        if self.cap_bytes <= 0 or not self.fds:
            return MAX_WAIT_S
        return max(0.0, self.due - time.monotonic())

    def cap_if_due(self) -> None:
        if self.cap_bytes > 0 and self.fds and time.monotonic() >= self.due:
            self.cap()

    def cap(self) -> None:
        if self.cap_bytes <= 0:
            return
        now = time.monotonic()
        growth = 0
        for fd in self.fds:
            try:
                size = os.fstat(fd).st_size
                growth = max(growth, size - self.sizes.get(fd, 0))
                self.sizes[fd] = size
                logcap.cap_file(fd, self.cap_bytes)
            except OSError:
                continue
        elapsed, self.last = now - self.last, now
        rate = max(FLOOD_BYTES_PER_S, growth / elapsed if elapsed > 0 else 0.0)
        self.due = now + min(CAP_EVERY_S, max(MIN_CAP_EVERY_S, self.cap_bytes / 2 / rate))


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


#: The executor's request to signal the workers without stopping them: FORWARD_SIGNAL to the
#: shim, the signal's number in FORWARD_FILE of the attempt's directory.
FORWARD_SIGNAL = signal.SIGUSR2
FORWARD_FILE = "signal.json"


def _ignore(signum: int, frame: object) -> None:
    # A Python-level handler (not SIG_IGN) so that the workers get the default action back on
    # exec; its only effect is to wake the wait loop through the wake-up fd.
    return None


class Shim:
    def __init__(self, attempt_dir: Path, dir_fd: int) -> None:
        self.attempt_dir = attempt_dir
        #: The attempt's directory, checked from `/` down (corral.exec.safefs): every control
        #: file is read and written relative to it.
        self.dir_fd = dir_fd
        self.stop_requested = False
        self.launch: dict[str, Any] = {}
        self.workers: list[Worker] = []
        self.pgid: int | None = None
        self.failed_rank: int | None = None
        self.kill_deadline: float | None = None
        self.killed_after_grace = False
        self.container: contain.Container | None = None
        #: The workers' stdout/stderr files, kept open to cap them.
        self.log_fds: list[int] = []
        #: Worker rank -> the rank its log files are named by (a torchrun worker's first
        #: process's; the worker's own otherwise).
        self.log_ranks: dict[int, int] = {}
        self.log_cap = logcap.DEFAULT_CAP_BYTES
        self.capper = LogCapper(self.log_fds, self.log_cap)
        self.leftover: list[int] = []
        self.forward_requested = False
        self.wake_read, self.wake_write = os.pipe()
        os.set_blocking(self.wake_read, False)
        os.set_blocking(self.wake_write, False)

    # -- signals -------------------------------------------------------------------------------

    def _on_sigterm(self, signum: int, frame: object) -> None:
        self.stop_requested = True

    def _on_forward(self, signum: int, frame: object) -> None:
        # The executor asks for a signal to the workers without a stop (a job's warning before
        # its time limit): the number is in FORWARD_FILE; the wait loop sends it.
        self.forward_requested = True

    def forward_signal(self) -> None:
        """Send the workers' group the signal the executor wrote to FORWARD_FILE (once)."""
        self.forward_requested = False
        try:
            request = safefs.read_trusted_json(
                self.dir_fd, FORWARD_FILE, self.attempt_dir / FORWARD_FILE
            )
            number = int(request["signal"])
        except (OSError, ValueError, KeyError, TypeError):  # UnsafePath is a ValueError
            return
        if number in (signal.SIGKILL, signal.SIGSTOP) or number not in signal.valid_signals():
            return
        self.signal_group(number)

    def install_signal_handlers(self) -> None:
        signal.set_wakeup_fd(self.wake_write, warn_on_full_buffer=False)
        signal.signal(signal.SIGTERM, self._on_sigterm)
        signal.signal(signal.SIGCHLD, _ignore)
        signal.signal(signal.SIGHUP, _ignore)
        signal.signal(signal.SIGINT, _ignore)
        signal.signal(FORWARD_SIGNAL, self._on_forward)
        # The executor spawns the shim with SIGTERM (and FORWARD_SIGNAL) blocked, so that a
        # stop() arriving before this point stays pending instead of killing the shim with the
        # default action.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, FORWARD_SIGNAL})

    # -- the attempt ---------------------------------------------------------------------------

    def run(self) -> AttemptResult:
        self.install_signal_handlers()
        shim_info: dict[str, Any] = {
            "pid": os.getpid(),
            "start_time": process_start_time(os.getpid()),
        }
        write_json_atomic(Path("shim.json"), shim_info, dir_fd=self.dir_fd)
        # Before any worker exists: every orphan of the attempt is re-parented here.
        contain.become_subreaper()
        try:
            # Root's own file, or nothing runs: its run_as says whose account the workers get.
            launch = safefs.read_trusted_json(
                self.dir_fd, "launch.json", self.attempt_dir / "launch.json"
            )
        except safefs.UnsafePath as exc:
            print(f"corral shim: launch.json refused: {exc}; nothing was run", file=sys.stderr)
            return AttemptResult(None, None, False, f"launch.json refused: {exc}")
        except (OSError, ValueError) as exc:
            return AttemptResult(None, None, False, f"bad launch.json: {exc}")
        try:
            if not isinstance(launch, dict):
                raise TypeError("not a JSON object")
            self.launch = launch
            specs = sorted(self.launch["workers"], key=lambda worker: int(worker["rank"]))
            stop_signal = int(self.launch["stop_signal"])
            grace_s = float(self.launch["grace_s"])
            workdir = str(self.launch["workdir"])
            run_as = _run_as(self.launch.get("run_as"))
            gpu_devices = self.launch.get("gpu_devices")
            gpu_devices = None if gpu_devices is None else [int(gpu) for gpu in gpu_devices]
            device_dir = Path(str(self.launch.get("device_dir") or "/dev"))
            self.log_cap = int(self.launch.get("log_cap_bytes", logcap.DEFAULT_CAP_BYTES))
            self.capper.cap_bytes = self.log_cap
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return AttemptResult(None, None, False, f"bad launch.json: {exc}")
        if not specs or not all(spec.get("argv") for spec in specs):
            return AttemptResult(None, None, False, "bad launch.json: a worker without argv")
        if self.stop_requested:
            return AttemptResult(None, None, True, "stopped before the workers started")
        try:
            limits = contain.Limits.parse(self.launch.get("limits"))
        except ValueError as exc:
            return AttemptResult(None, None, False, f"bad launch.json: {exc}")
        try:
            self.container = contain.Container.create(
                f"{self.launch.get('job_id')}-{self.launch.get('attempt')}",
                self.launch.get("contain"),
                gpu_devices,
                device_dir,
                limits,
            )
        except (contain.ContainError, OSError) as exc:
            return AttemptResult(None, None, False, f"cannot contain the attempt: {exc}")
        for why in self.container.unenforced.values():  # the executor warned at launch too
            print(f"corral: limit not enforced: {why}", file=sys.stderr, flush=True)
        shim_info["container"] = self.container.record()
        write_json_atomic(Path("shim.json"), shim_info, durable=True, dir_fd=self.dir_fd)
        start_error = self.start_workers(specs, workdir, run_as)
        if start_error is not None:
            self.begin_gang_stop(stop_signal, grace_s)
            self.wait(stop_signal, grace_s)
            return start_error
        self.wait(stop_signal, grace_s)
        return out_of_memory(self.container, self.outcome(stop_signal, grace_s))

    def open_log(self, name: str, run_as: dict[str, Any] | None) -> int:
        """A worker's output file in the attempt's directory: never through a link, readable by
        its owner only."""
        fd = os.open(name, LOG_FLAGS, 0o600, dir_fd=self.dir_fd)
        self.log_fds.append(fd)
        if run_as is not None:
            os.fchown(fd, run_as["uid"], run_as["gid"])
        os.fchmod(fd, 0o600)
        return fd

    def start_workers(
        self, specs: list[dict[str, Any]], workdir: str, run_as: dict[str, Any] | None
    ) -> AttemptResult | None:
        assert self.container is not None
        account: dict[str, Any] = {}
        if run_as is not None:
            account = {"user": run_as["uid"], "group": run_as["gid"], "extra_groups": []}
            # The account's own umask, not the manager's 077; the kernel checks that the
            # account may enter the workdir: the shell changes to it after the switch of uid
            # (Popen's cwd would be entered as root, before it).
            account["umask"] = 0o022
        for spec in specs:
            rank = int(spec["rank"])
            env = dict(os.environ) if run_as is None else account_environment(run_as)
            env.update({str(key): str(value) for key, value in spec.get("env", {}).items()})
            env[contain.KEY_VARIABLE] = self.container.name
            progress = f"rank-{rank}.progress"
            self.open_log(progress, run_as)
            env[PROGRESS_VARIABLE] = str(self.attempt_dir / progress)
            argv = [str(arg) for arg in spec["argv"]]
            if run_as is not None:
                argv = ["/bin/sh", "-c", 'cd -- "$0" && exec "$@"', workdir, *argv]
            processes = process_ranks(env.get(PROCESS_RANKS_VARIABLE, ""))
            log_rank = self.log_ranks[rank] = processes[0] if processes else rank
            stdout = self.open_log(f"rank-{log_rank}.stdout", run_as)
            stderr_name = f"rank-{log_rank}.stderr"
            stderr = self.open_log(stderr_name, run_as)
            for process in processes[1:]:  # written by torchrun's processes, capped here
                for stream in ("stdout", "stderr"):
                    self.open_log(f"rank-{process}.{stream}", run_as)
            if processes:
                env[RANK_LOGS_VARIABLE] = str(self.attempt_dir)
            try:
                with self.container.entered():
                    popen = subprocess.Popen(
                        argv,
                        stdin=subprocess.DEVNULL,
                        stdout=stdout,
                        stderr=stderr,
                        cwd=workdir if run_as is None else "/",
                        env=env,
                        # Worker 0 leads a new group; the others join it so that one killpg
                        # reaches the whole gang (the stop signal goes to the group).
                        process_group=0 if self.pgid is None else self.pgid,
                        **account,
                    )
            except OSError as exc:
                message = f"cannot start rank {rank}: {exc}"
                os.write(stderr, f"corral: {message}\n".encode())
                # The shell's conventions: 126 found but not runnable, 127 not found.
                code = 126 if exc.errno in (errno.EACCES, errno.ENOEXEC, errno.EPERM) else 127
                self.failed_rank = rank
                self.record_workers()
                tail = last_line(Path(stderr_name), dir_fd=self.dir_fd)
                return AttemptResult(code, None, False, message, tail)
            if self.pgid is None:
                self.pgid = popen.pid
            self.workers.append(Worker(rank, popen))
        self.record_workers()
        return None

    def record_workers(self) -> None:
        write_json_atomic(
            Path("workers.json"),
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
            dir_fd=self.dir_fd,
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
        """Until every worker has exited (what they started may live on: see `end_all`)."""
        keep = {worker.popen.pid for worker in self.workers}
        while True:
            self.reap()
            if self.stop_requested or self.failed_rank is not None:
                self.begin_gang_stop(stop_signal, grace_s)
            if all(worker.returncode is not None for worker in self.workers):
                break
            self.capper.cap_if_due()
            now = time.monotonic()
            timeout = min(MAX_WAIT_S, self.capper.due_in())
            if self.kill_deadline is not None and not self.killed_after_grace:
                remaining = self.kill_deadline - now
                if remaining <= 0:
                    self.signal_group(signal.SIGKILL)
                    self.killed_after_grace = True
                    continue
                timeout = min(timeout, remaining)
            select.select([self.wake_read], [], [], timeout)
            woken_by = b""
            try:
                while chunk := os.read(self.wake_read, 4096):
                    woken_by += chunk
            except BlockingIOError:
                pass
            if signal.SIGCHLD in woken_by:
                contain.reap_orphans(keep)  # orphans of the attempt, re-parented here
            if self.forward_requested and not self.stop_requested:
                self.forward_signal()

    def end_all(self) -> None:
        """End every process of the attempt and reap the workers: at every end, before
        result.json. What is still alive after `end_timeout_s` goes to `self.leftover`."""
        self.signal_group(signal.SIGKILL)
        for worker in self.workers:
            if worker.popen.returncode is None and worker.returncode is None:
                try:
                    worker.popen.kill()
                except ProcessLookupError:
                    pass
        timeout_s = float(self.launch.get("end_timeout_s", contain.END_TIMEOUT_S))
        keep = {worker.popen.pid for worker in self.workers}
        if self.container is not None:
            self.leftover = self.container.end(keep, timeout_s)
        else:  # no container (a bad launch.json): this shim's descendants all the same
            self.leftover = contain.sweep(keep, time.monotonic() + timeout_s)[1]
        self.capper.cap()
        for worker in self.workers:
            if worker.popen.pid not in self.leftover:
                worker.popen.wait()
        for fd in self.log_fds:
            os.close(fd)
        self.log_fds.clear()

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
            log_rank = self.log_ranks.get(failed.rank, failed.rank)
            tail = last_line(Path(f"rank-{log_rank}.stderr"), dir_fd=self.dir_fd)
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


def out_of_memory(container: contain.Container, result: AttemptResult) -> AttemptResult:
    """A failed attempt whose processes the kernel killed at its memory limit says so first
    (the retry rule sees its own signature; `corral describe` shows it); before the container
    is ended, while its counts can still be read."""
    if result.stopped or (result.exit_code == 0 and result.signal is None):
        return result
    kills = container.oom_kills()
    if kills <= 0 or container.limits.memory_bytes is None:
        return result
    what = "a process" if kills == 1 else f"{kills} processes"
    limit = contain.size_text(container.limits.memory_bytes)
    result.reason = (
        f"out of memory: the kernel killed {what} at the attempt's memory limit {limit}; "
        f"{result.reason}"
    )
    return result


#: What a job running as another account takes from the supervisor's environment (never the
#: manager's own variables: its credentials, its PATH into root's directories).
PASSED_TO_ACCOUNTS = ("LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "TERM")
#: PATH of a job that runs as another account.
ACCOUNT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def account_environment(run_as: dict[str, Any]) -> dict[str, str]:
    """A fresh environment for a worker that runs as `run_as` (corral's and the spec's
    variables are added to it)."""
    env = {key: os.environ[key] for key in PASSED_TO_ACCOUNTS if key in os.environ}
    env.update(
        PATH=ACCOUNT_PATH,
        HOME=str(run_as["home"]),
        USER=str(run_as["user"]),
        LOGNAME=str(run_as["user"]),
        SHELL="/bin/sh",
    )
    return env


def _run_as(value: Any) -> dict[str, Any] | None:
    """launch.json's run_as, checked: {"user", "uid", "gid", "home"} or None."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TypeError("run_as: not an object")
    return {
        "user": str(value["user"]),
        "uid": int(value["uid"]),
        "gid": int(value["gid"]),
        "home": str(value["home"]),
    }


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
    try:
        # Every directory from / down is root's (or the manager's) and no one else may write
        # it: else someone could swap launch.json (run_as null: root) before it is read.
        dir_fd = safefs.open_trusted_dir(attempt_dir)
    except (OSError, safefs.UnsafePath) as exc:
        shown = exc if isinstance(exc, safefs.UnsafePath) else f"{exc.filename}: {exc.strerror}"
        print(f"corral shim: refused {attempt_dir}: {shown}; nothing was run", file=sys.stderr)
        return 2
    shim = Shim(attempt_dir, dir_fd)
    try:
        result = shim.run()
    except Exception as exc:  # the result file must be written whatever went wrong
        result = AttemptResult(None, None, shim.stop_requested, f"shim error: {exc!r}")
    try:
        shim.end_all()  # nothing of the attempt outlives this point: then the result
    except Exception as exc:
        result.reason += f"; cannot end its processes: {exc!r}"
        shim.leftover = sorted(contain.descendants(os.getpid()))
    reason = result.reason
    if shim.leftover:
        reason += f"; {len(shim.leftover)} process(es) could not be ended"
    launch = shim.launch
    write_json_atomic(
        Path("result.json"),
        {
            "job_id": launch.get("job_id"),
            "attempt": launch.get("attempt"),
            "exit_code": result.exit_code,
            "signal": result.signal,
            "stopped": result.stopped,
            "reason": " ".join(reason.split()),
            "error_tail": result.error_tail,
            "ended_at": time.time(),
            "workers": result.workers,
            "leftover": shim.leftover,
        },
        durable=True,
        dir_fd=dir_fd,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
