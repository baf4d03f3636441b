"""Run attempts as local processes, each supervised by its own shim (corral.exec.shim).

The executor never waits on a worker itself: it writes `launch.json`, spawns the shim in a new
session and returns. The shim outlives the server, so a server restart loses nothing: `recover`
finds each attempt again from the files in its directory (see corral/exec/shim.py for them).

Every attempt runs in a container of its own (corral.exec.contain: a cgroup as root, the shim as
subreaper always) that the shim ends before it writes the result; when the shim itself died,
`kill_attempt` ends the container it recorded. As root, an attempt may run as a user's account
(`RunAs`) and be kept from the device files of GPUs that are not its own (`gpu_devices`). Its
container caps its memory, CPU time and tasks (`AttemptLaunch`'s limits, `attempt_limits`) where
the machine's cgroups allow it (`unenforced_limits` says which it cannot).
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from corral.exec import contain, logcap, safefs
from corral.exec.shim import (
    FORWARD_FILE,
    FORWARD_SIGNAL,
    PROCESS_RANKS_VARIABLE,
    is_alive,
    last_line,
    process_start_time,
    read_proc_stat,
    write_json_atomic,
)

LOST_REASON = "lost: the attempt's supervisor died"


@dataclass(slots=True)
class WorkerLaunch:
    """One worker process."""

    rank: int
    argv: list[str]
    env: dict[str, str]  # the full extra environment for this worker (added to os.environ)
    node: str = ""  # the node it runs on, as corral names it ("" for this machine)


@dataclass(slots=True, frozen=True)
class RunAs:
    """The Unix account an attempt's workers run as (the supervisor stays root)."""

    user: str
    uid: int
    gid: int
    home: str


@dataclass(slots=True)
class AttemptLaunch:
    job_id: str
    attempt: int
    workers: list[WorkerLaunch]
    workdir: str
    stop_signal: int
    grace_s: float
    attempt_dir: Path
    #: Created before the workers start (it is theirs to write; the same for every attempt).
    checkpoint_dir: Path | None = None
    #: The job's directory, the manager's, which holds its attempts' directories: made by the
    #: executor (`make_job_dirs`), with the directory above it, before the attempt's. None: the
    #: attempt directory's parents are made as they are needed.
    job_dir: Path | None = None
    #: `workdir` is the job's own (its spec names none): made by the executor before the
    #: workers start, the account's (run_as's), 0700.
    own_workdir: bool = False
    #: The account the workers run as; None: the manager's own (single-user mode).
    run_as: RunAs | None = None
    #: The GPU device indexes on this node the attempt may open (its device files); the others'
    #: are denied where the machine allows it. None: no device restriction.
    gpu_devices: list[int] | None = None
    #: Each worker's stdout and stderr keep at most about this many bytes (0: no cap).
    log_cap_bytes: int = logcap.DEFAULT_CAP_BYTES
    #: The spec's `memory` (bytes) and `cpus`: each worker's, with everything it starts. None:
    #: no limit.
    memory_bytes: int | None = None
    cpus: float | None = None
    #: The most tasks (processes and threads) at once: the attempt's on the local executor,
    #: each worker's on Ray (`corral up --job-pids-max`). None: no limit.
    pids_max: int | None = None
    #: When, on the manager's clock, the attempt reaches its spec's `time_limit` (the limit less
    #: what the job's earlier attempts ran): past it the manager stops the attempt, a failure;
    #: the inert executor ends it there, exit 0 (corral.exec.inert). None: no time limit.
    time_limit_at: float | None = None


@dataclass(slots=True)
class AttemptEnded:
    job_id: str
    attempt: int
    exit_code: int | None  # worker 0's, or the first failing worker's; None if ended by a signal
    signal: int | None  # the signal that ended it, if any
    stopped: bool  # ended because stop() asked it to (preemption/cancel)
    reason: str  # one line
    error_tail: str  # last non-empty stderr line of the failing worker ("" if none)
    ended_at: float
    #: Processes of the attempt that could not be ended (stuck in the kernel): the reason says so.
    leftover: int = 0


@dataclass(slots=True)
class _Tracked:
    job_id: str
    attempt: int
    attempt_dir: Path
    pid: int
    start_time: int | None
    popen: subprocess.Popen[bytes] | None  # None for a shim found again by recover()


# Shims spawned by executors that were closed since: reaped by any executor's poll() so that they
# do not stay zombies while this process lives on (e.g. in tests that restart an executor).
_unreaped: list[subprocess.Popen[bytes]] = []
_unreaped_lock = threading.Lock()


def attempt_limits(launch: AttemptLaunch) -> contain.Limits:
    """The limits of an attempt whose workers share one container (the local executor's): the
    workers' memory and CPUs added up, and its tasks."""
    workers = len(launch.workers)
    return contain.Limits(
        memory_bytes=None if launch.memory_bytes is None else launch.memory_bytes * workers,
        cpus=None if launch.cpus is None else launch.cpus * workers,
        pids=launch.pids_max,
    )


def command_argv(command: str | list[str]) -> list[str]:
    """A job spec's command as argv: a string runs through /bin/sh -c, a list is argv as is."""
    return ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for MASTER_PORT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def worker_envs(
    job_id: str,
    attempt: int,
    gpus_local: list[int],
    workers: int,
    checkpoint_dir: str | Path,
    port: int,
    extra_env: dict[str, str] | None = None,
    node: str = "localhost",
) -> list[dict[str, str]]:
    """The extra environment of each worker (rank order) of a single-node attempt."""
    if workers < 1:
        raise ValueError(f"workers: must be at least 1 (got {workers})")
    if len(gpus_local) % workers != 0:
        raise ValueError(f"workers: must divide gpus ({workers} does not divide {len(gpus_local)})")
    per_worker = len(gpus_local) // workers
    placement = [
        (node, gpus_local[rank * per_worker : (rank + 1) * per_worker]) for rank in range(workers)
    ]
    return placement_worker_envs(
        job_id, attempt, placement, checkpoint_dir, extra_env, "127.0.0.1", port
    )


def placement_worker_envs(
    job_id: str,
    attempt: int,
    placement: list[tuple[str, list[int]]],
    checkpoint_dir: str | Path,
    extra_env: dict[str, str] | None = None,
    master_addr: str = "",
    master_port: int | None = None,
    launcher: str = "none",
) -> list[dict[str, str]]:
    """The extra environment of each worker (rank order) of an attempt whose worker r runs on
    node placement[r][0] with that node's device indexes placement[r][1].

    A plain worker (`launcher` "none") is what torchrun starts per GPU: CUDA_VISIBLE_DEVICES
    lists all the attempt's devices on that node, in rank order; CORRAL_LOCAL_GPUS names the
    worker's own share as indexes within that list; LOCAL_RANK / LOCAL_WORLD_SIZE count the
    workers on that node; NODE_RANK / NNODES number the attempt's nodes (in rank order).

    A "torchrun" worker is a torchrun agent (`launch_argv`), which starts one process per GPU of
    its own: CUDA_VISIBLE_DEVICES lists only the worker's devices, so that the LOCAL_RANK torchrun
    gives each process (0 to n-1) is its own GPU's index; NODE_RANK / NNODES are the worker's
    rank and the worker count, as torchrun's --node_rank and --nnodes (two workers on one node
    are two of torchrun's "nodes"). torchrun sets RANK, WORLD_SIZE and the LOCAL_ ones of its
    processes itself, over the agent's; CORRAL_PROCESS_RANKS lists the RANKs it will give them
    (the local supervisor makes each its own log files: corral.exec.shim).

    Every worker gets CORRAL_GPUS_PER_WORKER, its own device count. MASTER_ADDR and MASTER_PORT
    left empty are the executor's to fill in (it knows where rank 0 runs). corral's variables win
    over the spec's env: a job must not escape its GPUs by setting them.
    """
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher: must be one of {', '.join(LAUNCHERS)} (got {launcher!r})")
    by_node: dict[str, list[int]] = {}
    for rank, (node, _) in enumerate(placement):
        by_node.setdefault(node, []).append(rank)
    nodes = list(by_node)  # in the order of their first rank
    envs = []
    for rank, (node, devices) in enumerate(placement):
        ranks_here = by_node[node]
        processes: list[int] = []
        if launcher == "torchrun":
            visible = list(devices)
            own = list(range(len(devices)))
            node_rank, nnodes = rank, len(placement)
            # the RANKs torchrun gives this agent's processes: its node's, after the earlier ones'
            first = sum(len(placement[other][1]) for other in range(rank))
            processes = list(range(first, first + len(devices)))
        else:
            visible = [device for other in ranks_here for device in placement[other][1]]
            before = sum(len(placement[other][1]) for other in ranks_here if other < rank)
            own = [before + i for i in range(len(devices))]
            node_rank, nnodes = nodes.index(node), len(nodes)
        env = dict(extra_env or {})
        env.update(
            {
                # NVML's numbering (PCI bus order); CUDA's default is fastest-first
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                "CUDA_VISIBLE_DEVICES": ",".join(str(device) for device in visible),
                "CORRAL_LOCAL_GPUS": ",".join(str(index) for index in own),
                "CORRAL_GPUS_PER_WORKER": str(len(devices)),
                "CORRAL_NODE": node,
                "RANK": str(rank),
                "LOCAL_RANK": str(ranks_here.index(rank)),
                "WORLD_SIZE": str(len(placement)),
                "LOCAL_WORLD_SIZE": str(len(ranks_here)),
                "NODE_RANK": str(node_rank),
                "NNODES": str(nnodes),
                "MASTER_ADDR": master_addr,
                "MASTER_PORT": "" if master_port is None else str(master_port),
                "CORRAL_JOB_ID": str(job_id),
                "CORRAL_ATTEMPT": str(attempt),
                "CORRAL_CHECKPOINT_DIR": str(checkpoint_dir),
            }
        )
        env.pop(PROCESS_RANKS_VARIABLE, None)  # corral's to set, not the spec's
        if processes:
            env[PROCESS_RANKS_VARIABLE] = ",".join(str(process) for process in processes)
        envs.append(env)
    return envs


#: How a job's workers are started: its command itself, or torchrun running it (`launch_argv`).
LAUNCHERS = ("none", "torchrun")

#: torchrun's flags for one corral worker, the agent of torchrun's "node" NODE_RANK of NNODES
#: (static rendezvous at rank 0's MASTER_ADDR:MASTER_PORT: no etcd, no c10d endpoint to choose;
#: no restarts: corral retries an attempt itself). The shell fills in MASTER_ADDR and MASTER_PORT
#: from the worker's environment: an executor may choose them only as the worker starts (Ray's
#: rank 0 picks its port on its node). `exec` leaves torchrun the worker's process.
_TORCHRUN = (
    'exec torchrun --nnodes="$NNODES" --node_rank="$NODE_RANK" '
    '--nproc_per_node="$CORRAL_GPUS_PER_WORKER" --rdzv_backend=static '
    '--master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT" --max_restarts=0 "$@"'
)


#: The same, each of torchrun's processes running `_TORCHRUN_PROCESS` (the shell's $1) with
#: the job's program after it.
_TORCHRUN_BY_RANK = (
    'process=$1; shift; exec torchrun --nnodes="$NNODES" --node_rank="$NODE_RANK" '
    '--nproc_per_node="$CORRAL_GPUS_PER_WORKER" --rdzv_backend=static '
    '--master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT" --max_restarts=0 '
    '--no-python /bin/sh -c "$process" corral-process "$@"'
)

#: What torchrun runs as each of its processes: first its output to its own files where the
#: supervisor made them ($CORRAL_RANK_LOGS/rank-$RANK.stdout and .stderr, by the RANK torchrun
#: gave it), then the job's program: `--no-python PROGRAM ARGS` as is; a script or `-m MODULE`
#: on torchrun's own interpreter with -u, as torchrun itself would run it. That interpreter is
#: the first word of torchrun's command line (the parent's: the kernel puts it there when it
#: runs torchrun's script, the path of a virtualenv's python included).
_TORCHRUN_PROCESS = (
    'if [ -n "$CORRAL_RANK_LOGS" ]; then '
    'exec >>"$CORRAL_RANK_LOGS/rank-$RANK.stdout" 2>>"$CORRAL_RANK_LOGS/rank-$RANK.stderr"; fi; '
    'if [ "$1" = --no-python ]; then shift; exec "$@"; fi; '
    "python=$(tr '\\000' '\\n' < /proc/$PPID/cmdline | head -n 1); "
    'exec "$python" -u "$@"'
)


def launch_argv(command: str | list[str], launcher: str = "none") -> list[str]:
    """A worker's argv for a job spec's command under `launcher` (LAUNCHERS).

    "none": `command_argv`. "torchrun": torchrun, found on the worker's PATH, with the flags
    of `_TORCHRUN`, then the command as torchrun's own arguments: the script and its arguments
    (a list as is; a string split as the shell splits words, without running one), or
    `-m package.module ARGS`, `--no-python PROGRAM ARGS`. Each of torchrun's processes writes
    its output to its own files (`_TORCHRUN_PROCESS`); a command that starts with any other of
    torchrun's flags is passed to torchrun as it is, its processes' output all in the agent's."""
    if launcher == "none":
        return command_argv(command)
    if launcher != "torchrun":
        raise ValueError(f"launcher: must be one of {', '.join(LAUNCHERS)} (got {launcher!r})")
    arguments = shlex.split(command) if isinstance(command, str) else list(command)
    first = arguments[0] if arguments else ""
    if first in ("--no-python", "--no_python"):
        program = ["--no-python", *arguments[1:]]
    elif first in ("-m", "--module"):
        program = ["-m", *arguments[1:]]
    elif first.startswith("-") or not first:
        return ["/bin/sh", "-c", _TORCHRUN, "torchrun", *arguments]
    else:
        program = arguments
    return ["/bin/sh", "-c", _TORCHRUN_BY_RANK, "torchrun", _TORCHRUN_PROCESS, *program]


def share_env(milli: int, memory_mib: int | None = None, device: int = 0) -> dict[str, str]:
    """What a worker holding a share of one GPU (`milli` of 1000) gets besides the GPU itself:
    CORRAL_GPU_SHARE (0.5), and NVIDIA MPS's per-client limits from the share, which an MPS
    server on the node enforces (docs/fgd.md#live): CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, the
    share of the GPU's threads in percent (rounded down, at least 1), and, when the GPU's memory
    is known, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, the share of its memory as `DEVICE=NM` (MiB,
    rounded down), DEVICE being the index the job sees (0: its one visible GPU)."""
    if not 0 < milli < 1000:
        raise ValueError(f"a share of a GPU is 1..999 milli-GPU, got {milli}")
    env = {
        "CORRAL_GPU_SHARE": f"{milli / 1000:.3f}".rstrip("0"),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(max(1, milli * 100 // 1000)),
    }
    if memory_mib:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"{device}={max(1, memory_mib * milli // 1000)}M"
    return env


#: The manager's own variables that its jobs must not inherit: an admin's token above all, the
#: database's password (libpq reads PGPASSWORD; docs/server.md#the-database) and the Ray
#: cluster's token.
PRIVATE_VARIABLES = ("CORRAL_TOKEN", "CORRAL_URL", "PGPASSWORD", "RAY_AUTH_TOKEN")


def job_environment() -> dict[str, str]:
    """The environment the supervisor (and so every worker) starts from: the manager's, less
    what is private to it."""
    return {k: v for k, v in os.environ.items() if k not in PRIVATE_VARIABLES}


def _read_json(path: Path) -> dict[str, Any] | None:
    """An attempt's control file (shim.json, workers.json, result.json): None when it is
    missing, not JSON, or not the manager's own in a directory only the manager may write
    (corral.exec.safefs): the pids and cgroups it names are killed."""
    return safefs.read_json_in(path.parent, path.name)


def _ended_from_result(job_id: str, attempt: int, result: dict[str, Any]) -> AttemptEnded:
    def optional_int(value: Any) -> int | None:
        return None if value is None else int(value)

    return AttemptEnded(
        job_id=job_id,
        attempt=attempt,
        exit_code=optional_int(result.get("exit_code")),
        signal=optional_int(result.get("signal")),
        stopped=bool(result.get("stopped", False)),
        reason=str(result.get("reason", "")),
        error_tail=str(result.get("error_tail", "")),
        ended_at=float(result.get("ended_at", time.time())),
        leftover=len(result.get("leftover") or []),
    )


def kill_attempt(attempt_dir: Path) -> int:
    """SIGKILL an attempt's shim and every process of its attempt if they still run; returns
    how many were killed. For a lost attempt (shim gone, workers orphaned) and for cleaning up."""
    return _kill_attempt(attempt_dir)[0]


def _kill_attempt(
    attempt_dir: Path, timeout_s: float = contain.END_TIMEOUT_S
) -> tuple[int, list[int]]:
    """`kill_attempt`, and the pids that could not be ended within contain.END_TIMEOUT_S.

    The container the shim recorded goes first and whole (its cgroup; or, without one, the
    processes that carry its key in their environment); then the recorded workers and their
    group. Every recorded pid is checked against its start time, so a pid reused by an unrelated
    process is left alone."""
    killed: set[int] = set()
    left: list[int] = []
    shim = _read_json(attempt_dir / "shim.json")
    if shim is not None and shim.get("start_time") is not None:
        if is_alive(int(shim["pid"]), int(shim["start_time"])):
            os.kill(int(shim["pid"]), signal.SIGKILL)
            killed.add(int(shim["pid"]))
    if shim is not None and isinstance(shim.get("container"), dict):
        ended, left = contain.end_recorded(shim["container"], timeout_s)
        killed |= ended
    info = _read_json(attempt_dir / "workers.json")
    if info is None:
        return len(killed), left
    recorded = [w for w in info.get("workers", []) if w.get("start_time") is not None]
    alive = [w for w in recorded if is_alive(int(w["pid"]), int(w["start_time"]))]
    if not alive or info.get("pgid") is None:
        return len(killed), left
    pgid = int(info["pgid"])
    leader = next((w for w in recorded if int(w["pid"]) == pgid), None)
    leader_start = process_start_time(pgid)
    # The group id is worker 0's pid: while that pid is unused or still worker 0, it is ours.
    if leader_start is None or (leader is not None and leader_start == int(leader["start_time"])):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for worker in alive:
        try:
            os.kill(int(worker["pid"]), signal.SIGKILL)
            killed.add(int(worker["pid"]))
        except ProcessLookupError:
            pass
    return len(killed), left


def own_directory(path: Path, run_as: RunAs | None, mode: int = 0o700) -> None:
    """Create `path` (and its parents) and give it `mode` and, with run_as, to that account.
    An existing directory is kept (a job's checkpoint or work dir across attempts) when it is
    the manager's or, with run_as, that account's; one that belongs to anyone else is refused
    (made first by another account: it may hold what they put there), and with run_as so is a
    link in its place, so a job cannot have a path of its choosing given to it. The mode is set
    explicitly: the manager's umask may be 077."""
    path.mkdir(parents=True, exist_ok=True)
    if run_as is not None and stat.S_ISLNK(os.lstat(path).st_mode):
        raise ValueError(f"{path} is a symbolic link: not given to account {run_as.user}")
    # Without run_as, the manager's own: a link an admin made (to another disk) is followed.
    nofollow = os.O_NOFOLLOW if run_as is not None else 0
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | nofollow | os.O_CLOEXEC)
    try:
        owner = os.fstat(fd).st_uid
        allowed = safefs.trusted_uids() | ({run_as.uid} if run_as is not None else set())
        if owner not in allowed:
            mine = f"the manager's or account {run_as.user}'s" if run_as else "the manager's"
            raise safefs.UnsafePath(
                f"{path} belongs to {safefs.owner_name(owner)}, not {mine}: not used"
            )
        if run_as is not None:
            os.fchown(fd, run_as.uid, run_as.gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


class LaunchRefused(ValueError):
    """An attempt that cannot start because of what is in its place (its job's directories are
    another account's, or a link): nothing of it ran. One line naming the path."""


def make_job_dirs(launch: AttemptLaunch) -> None:
    """The job's directory and the one above it (the manager's: passable by the job's account,
    0711, never listable; 0700 in single-user mode) and, when the job has no workdir of its own
    choosing, its work dir (the account's, 0700), each checked as `own_directory` checks it.
    Called by the executors as an attempt launches (not in the manager's round): LaunchRefused
    for what cannot be made or used."""
    if launch.job_dir is None:
        return
    passable = 0o711 if launch.run_as is not None else 0o700
    job_dir = Path(launch.job_dir)
    try:
        own_directory(job_dir.parent, None, passable)
        own_directory(job_dir, None, passable)
        if launch.own_workdir:
            own_directory(Path(launch.workdir), launch.run_as)
    except (OSError, ValueError) as error:
        raise LaunchRefused(str(error)) from error


def attempt_directory(attempt_dir: Path, mode: int) -> int:
    """A descriptor of an attempt's directory (absolute), made with `mode` (its parents too,
    when missing); it and every directory above it must be the manager's (or root's) and
    writable by no one else (corral.exec.safefs), an existing one too: a directory someone else
    made first, or one they could swap entries in, would let them choose what the supervisor
    (root) reads from launch.json. UnsafePath (a ValueError) names what failed."""
    attempt_dir.parent.mkdir(parents=True, exist_ok=True)
    parent_fd = safefs.open_trusted_dir(attempt_dir.parent)
    try:
        return safefs.make_dir_at(parent_fd, attempt_dir.name, mode, str(attempt_dir))
    finally:
        os.close(parent_fd)


def _fill_master(workers: list[WorkerLaunch], address: str) -> None:
    """MASTER_ADDR / MASTER_PORT the manager left empty: rank 0's address, a port free there."""
    port = ""
    for worker in workers:
        if not worker.env.get("MASTER_ADDR"):
            worker.env["MASTER_ADDR"] = address
        if not worker.env.get("MASTER_PORT"):
            port = port or str(free_port())
            worker.env["MASTER_PORT"] = port


class LocalExecutor:
    """Launches, stops, polls and recovers attempts on this machine. Thread-safe.

    `device_dir` holds the GPUs' device files (`nvidia<N>`); `containment` picks the
    mechanism (corral.exec.contain.MECHANISMS; None: $CORRAL_CONTAIN in the shim's environment,
    else the best available); `end_timeout_s` bounds how long a shim tries to end its attempt's
    processes."""

    #: Several attempts may run on one GPU at once (shares of it: `share_env`).
    shares_gpus = True
    #: A job's workdir is a path on this machine: the API checks it at submission.
    workdirs_here = True

    def __init__(
        self,
        shim_python: str = sys.executable,
        device_dir: Path = Path("/dev"),
        containment: str | None = None,
        end_timeout_s: float = contain.END_TIMEOUT_S,
    ) -> None:
        self.shim_python = shim_python
        self.device_dir = Path(device_dir)
        self.containment = containment
        self.end_timeout_s = end_timeout_s
        self._tracked: dict[tuple[str, int], _Tracked] = {}
        self._lock = threading.Lock()
        self._unenforced: dict[str, str] | None = None

    def unenforced_limits(self) -> dict[str, str]:
        """The limits (memory, cpus, pids) an attempt's container cannot have on this machine,
        each with its one-line reason; found once, by trying (contain.limits_unavailable)."""
        with self._lock:
            if self._unenforced is None:
                self._unenforced = contain.limits_unavailable(self.containment)
            return dict(self._unenforced)

    # -- launching and stopping ----------------------------------------------------------------

    def launch(self, launch: AttemptLaunch) -> None:
        """Write launch.json and spawn the attempt's shim; returns at once."""
        key = (launch.job_id, launch.attempt)
        attempt_dir = Path(launch.attempt_dir).resolve()  # the shim runs in it: no relative path
        with self._lock:
            if key in self._tracked:
                raise ValueError(f"attempt {launch.attempt} of job {launch.job_id} is running")
            make_job_dirs(launch)
            # The control files are the manager's. With run_as, the account may reach its own
            # log files (made by the shim, owned by it) but not list the directory.
            mode = 0o711 if launch.run_as is not None else 0o700
            dir_fd = attempt_directory(attempt_dir, mode)
            try:
                self._launch_in(launch, key, attempt_dir, dir_fd)
            finally:
                os.close(dir_fd)

    def _launch_in(
        self, launch: AttemptLaunch, key: tuple[str, int], attempt_dir: Path, dir_fd: int
    ) -> None:
        """`launch` with the attempt's checked directory `dir_fd`: every control file is written
        relative to it."""
        if launch.checkpoint_dir is not None:
            own_directory(Path(launch.checkpoint_dir), launch.run_as)
        _fill_master(launch.workers, "127.0.0.1")
        run_as = launch.run_as
        write_json_atomic(
            Path("launch.json"),
            {
                "job_id": launch.job_id,
                "attempt": launch.attempt,
                "workdir": launch.workdir,
                "stop_signal": int(launch.stop_signal),
                "grace_s": float(launch.grace_s),
                "workers": [
                    {"rank": worker.rank, "argv": list(worker.argv), "env": dict(worker.env)}
                    for worker in launch.workers
                ],
                "run_as": None
                if run_as is None
                else {
                    "user": run_as.user,
                    "uid": run_as.uid,
                    "gid": run_as.gid,
                    "home": run_as.home,
                },
                "gpu_devices": None
                if launch.gpu_devices is None
                else [int(gpu) for gpu in launch.gpu_devices],
                "device_dir": str(self.device_dir),
                "log_cap_bytes": int(launch.log_cap_bytes),
                "contain": self.containment,
                "end_timeout_s": float(self.end_timeout_s),
                "limits": attempt_limits(launch).record(),
            },
            durable=True,
            dir_fd=dir_fd,
        )
        # SIGTERM stays blocked in the shim until its handler is installed, so a stop()
        # right after launch() is a clean stop, not a dead shim. The mask is per thread and
        # inherited by the child.
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, FORWARD_SIGNAL})
        try:
            log_fd = os.open(
                "shim.log",
                os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=dir_fd,
            )
            with open(log_fd, "ab") as shim_log:
                popen = subprocess.Popen(
                    [self.shim_python, "-m", "corral.exec.shim", str(attempt_dir)],
                    stdin=subprocess.DEVNULL,
                    stdout=shim_log,
                    stderr=shim_log,
                    cwd=attempt_dir,
                    start_new_session=True,
                    env=job_environment(),
                )
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        start_time = process_start_time(popen.pid)
        # The shim writes the same file as it starts; writing it here as well closes the
        # window in which a server crash would make a started attempt look never-started.
        # Never over the shim's own (which records its container).
        if start_time is not None:
            write_json_atomic(
                Path("shim.json"),
                {"pid": popen.pid, "start_time": start_time},
                replace=False,
                dir_fd=dir_fd,
            )
        self._tracked[key] = _Tracked(
            launch.job_id, launch.attempt, attempt_dir, popen.pid, start_time, popen
        )

    def stop(self, job_id: str, attempt: int) -> None:
        """Ask an attempt's shim to stop its workers. Idempotent; a no-op once the shim is gone."""
        with self._lock:
            tracked = self._tracked.get((job_id, attempt))
            if tracked is None:
                return
            if tracked.popen is not None:
                # send_signal checks that the child has not been reaped yet.
                tracked.popen.send_signal(signal.SIGTERM)
            elif tracked.start_time is not None and is_alive(tracked.pid, tracked.start_time):
                try:
                    os.kill(tracked.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass

    def signal(self, job_id: str, attempt: int, number: int) -> None:
        """Send the attempt's workers `number` without stopping them (a warning before the time
        limit): the shim forwards it to their process group. A no-op once the shim is gone."""
        with self._lock:
            tracked = self._tracked.get((job_id, attempt))
            if tracked is None:
                return
            write_json_atomic(tracked.attempt_dir / FORWARD_FILE, {"signal": int(number)})
            if tracked.popen is not None:
                tracked.popen.send_signal(FORWARD_SIGNAL)
            elif tracked.start_time is not None and is_alive(tracked.pid, tracked.start_time):
                try:
                    os.kill(tracked.pid, FORWARD_SIGNAL)
                except ProcessLookupError:
                    pass

    # -- observing -----------------------------------------------------------------------------

    def poll(self) -> list[AttemptEnded]:
        """The attempts that ended since the last call; each is reported once."""
        _reap_unreaped()
        ended: list[AttemptEnded] = []
        with self._lock:
            for key, tracked in list(self._tracked.items()):
                if self._shim_running(tracked):
                    continue
                ended.append(self._ended(tracked))
                del self._tracked[key]
        return ended

    def recover(
        self, job_id: str, attempt: int, attempt_dir: Path
    ) -> Literal["running", "never-started"] | AttemptEnded:
        """Find an attempt again after a server restart (see the executor contract)."""
        attempt_dir = Path(attempt_dir)
        with self._lock:
            existing = self._tracked.pop((job_id, attempt), None)
            if existing is not None and self._shim_running(existing):
                self._tracked[(job_id, attempt)] = existing
                return "running"
        result = _read_json(attempt_dir / "result.json")
        if result is not None:
            return _ended_from_result(job_id, attempt, result)
        shim = _read_json(attempt_dir / "shim.json")
        if shim is None:
            return "never-started"
        pid = int(shim["pid"])
        start_time = None if shim.get("start_time") is None else int(shim["start_time"])
        tracked = _Tracked(job_id, attempt, attempt_dir, pid, start_time, None)
        if self._shim_running(tracked):
            with self._lock:
                self._tracked[(job_id, attempt)] = tracked
            return "running"
        return self._ended(tracked)

    def leftover(self, job_id: str, attempt: int, attempt_dir: Path) -> int:
        """How many processes of an ended attempt still live, after one more quick try to end
        them (for an attempt that ended with `leftover`: its GPUs wait until this is 0)."""
        return len(_kill_attempt(Path(attempt_dir), timeout_s=0.2)[1])

    def active(self) -> set[tuple[str, int]]:
        """Attempts whose processes may still hold GPUs (including ended but not yet polled)."""
        with self._lock:
            return set(self._tracked)

    def close(self) -> None:
        """Stop tracking. Never kills anything: the attempts outlive a server restart."""
        with self._lock:
            with _unreaped_lock:
                _unreaped.extend(t.popen for t in self._tracked.values() if t.popen is not None)
            self._tracked.clear()

    # -- internals -----------------------------------------------------------------------------

    @staticmethod
    def _shim_running(tracked: _Tracked) -> bool:
        if tracked.popen is not None:
            return tracked.popen.poll() is None
        if tracked.start_time is None:
            return False
        stat = read_proc_stat(tracked.pid)
        if stat is None or stat[1] != tracked.start_time:
            return False
        if stat[0] in ("Z", "X"):
            # Still our child when the executor that spawned it was replaced in this process.
            try:
                os.waitpid(tracked.pid, os.WNOHANG)
            except ChildProcessError:
                pass
            return False
        return True

    @staticmethod
    def _ended(tracked: _Tracked) -> AttemptEnded:
        result = _read_json(tracked.attempt_dir / "result.json")
        if result is not None:
            return _ended_from_result(tracked.job_id, tracked.attempt, result)
        # The shim died without a result (e.g. SIGKILL, OOM killer): its workers may live on,
        # holding GPUs, and must not run alongside a retry of the same job.
        killed, left = _kill_attempt(tracked.attempt_dir)
        reason = LOST_REASON
        if killed:
            reason += f"; killed {killed} orphaned worker process(es)"
        if left:
            reason += f"; {len(left)} process(es) could not be ended"
        return AttemptEnded(
            job_id=tracked.job_id,
            attempt=tracked.attempt,
            exit_code=None,
            signal=None,
            stopped=False,
            reason=reason,
            error_tail=last_line(tracked.attempt_dir / "shim.log"),
            ended_at=time.time(),
            leftover=len(left),
        )


def _reap_unreaped() -> None:
    with _unreaped_lock:
        if _unreaped:
            _unreaped[:] = [popen for popen in _unreaped if popen.poll() is None]
