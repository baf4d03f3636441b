"""Run attempts on a Ray cluster: one detached Ray actor per worker, pinned to the core's node.

Each actor runs its worker's command as a subprocess in its own process group, with the
environment the manager chose (CUDA_VISIBLE_DEVICES is the core's choice of devices, not Ray's).
The worker writes its stdout/stderr to files on its own node; the executor copies what is new to
the manager's attempt dir about once a second (and once more when the worker ends), so logs need
no storage shared between the machines.

Actors are named `corral-<job>-<attempt>-<rank>` in the manager's Ray namespace (one per
manager's state, so two managers or a fresh start never mistake each other's actors for their
own: see `corral.server.executors.ray.ray_namespace`) and are detached, so
they outlive the manager; a new executor finds them again by name (`recover`). An actor reports
its worker's end through a blocking `wait()` call that `poll()` checks without waiting; the
executor writes each end to `rank-R.result.json` in the attempt dir before it lets the actor go,
so an end is not lost if the manager dies in between. An actor that dies (its node died) ends its
attempt as "lost", after the rest of the gang has been stopped.

Each worker runs under `corral.exec.guard`, in a container of its own (a cgroup when the Ray node
runs as root, the guard as child subreaper always: corral.exec.contain), so that everything the
worker started ends with it: when its command ends, when its actor dies, and after a stop's
grace (the actor asks the guard through a pipe; a SIGKILL to the group would kill the guard
first). The guard caps the worker's log files on the node (corral.exec.logcap); the executor's
copy follows the holes the cap leaves, writing each byte at the same offset in the manager's
copy, which it caps the same way.

Ray workers run as the Ray node's user (`AttemptLaunch.run_as` is not applied here, nor are GPU
device files restricted): a multi-user Ray cluster would need the Ray node to start each worker
under its user's account. Each worker's guard gives its container the attempt's limits: the
spec's `memory` and `cpus` (each worker's, as on the local executor) and `pids_max` (each
worker's here, the attempt's there), where the node's cgroups allow it (a limit it cannot set is
named in the worker's log); a worker the kernel killed at its memory limit fails "out of memory".
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import ray
from ray.exceptions import GetTimeoutError, RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from corral.exec import cachedir, contain, logcap, safefs
from corral.exec.guard import KILL_REQUEST
from corral.exec.healthcheck import CheckResult, check_node, first_line
from corral.exec.local import (
    PRIVATE_VARIABLES,
    AttemptEnded,
    AttemptLaunch,
    WorkerLaunch,
    attempt_directory,
    make_job_dirs,
)
from corral.exec.nvmlhealth import NvmlReader
from corral.exec.shim import PROGRESS_VARIABLE, last_line, signal_name, write_json_atomic

log = logging.getLogger(__name__)

NAMESPACE = "corral"
#: A node declares `--resources='{"corral-node-NAME": 1}'` to be called NAME by corral.
NODE_RESOURCE_PREFIX = "corral-node-"
#: A node declares `--labels corral-rack=NAME` to be in rack NAME.
RACK_LABEL = "corral-rack"
#: How long a node's health probe may take to answer beyond its command's timeout (the actor's
#: start on a busy node included) before the node counts as unhealthy.
HEALTH_ANSWER_S = 30.0
#: The attempt dir's record of what was launched, read by `recover`.
LAUNCH_FILE = "ray-launch.json"
#: What the executor copies from a worker's node: its output and its progress reports.
STREAMS = ("stdout", "stderr", "progress")
#: The most a worker's stream sends the manager per copy.
LOG_CHUNK = 1 << 20
LOG_COPY_EVERY_S = 1.0
#: How long one wait() call holds one of the actor's threads before the executor asks again.
WAIT_S = 10.0
#: How long a worker may take to start (Ray placing its actor included) before it counts as lost.
START_TIMEOUT_S = 120.0
#: The variables Ray sets in its worker processes that a job must not inherit.
RAY_PREFIXES = ("RAY_", "RAYLET_", "__RAY")
RAY_SETS = ("OMP_NUM_THREADS", "SPT_NOENV")


def actor_name(job_id: str, attempt: int, rank: int) -> str:
    return f"corral-{job_id}-{attempt}-{rank}"


@dataclass(slots=True, frozen=True)
class RayNode:
    name: str  # corral's name for the node
    node_id: str  # Ray's
    address: str  # the IP the node's processes are reached at (MASTER_ADDR)
    gpus: int
    gpu_type: str  # from Ray's `accelerator_type:X` resource, lower-cased; "gpu" if none
    rack: str  # from the node's `corral-rack` label; "rack-0" if none


def ray_nodes(known: dict[str, str] | None = None) -> list[RayNode]:
    """The live nodes of the connected Ray cluster that declare GPUs, by name.

    A node's name is the one it declares (`corral-node-NAME`), else its host's short name, else,
    when several undeclared nodes share a host, that name and the start of Ray's node id.
    `known` (Ray's node id -> name, updated here) keeps each node's name for as long as it
    lives, whatever joins later. A name that two nodes claim stays the first one's: the other is
    left out, with a warning, until it is renamed."""
    known = {} if known is None else known
    live = sorted(
        (
            node
            for node in ray.nodes()  # type: ignore[no-untyped-call]
            if node.get("Alive") and int(node.get("Resources", {}).get("GPU", 0)) >= 1
        ),
        key=lambda node: (not known.get(str(node["NodeID"])), str(node["NodeID"])),
    )
    hosts = Counter(
        _host(node) for node in live if not _declared(node) and str(node["NodeID"]) not in known
    )
    taken: dict[str, str] = {}
    found = []
    for node in live:
        node_id = str(node["NodeID"])
        name = known.get(node_id) or _declared(node)
        if not name:
            host = _host(node)
            name = host if hosts[host] == 1 and host not in taken else f"{host}-{node_id[:8]}"
        if name in taken:
            if known.get(node_id) == "":
                continue  # said so already
            known[node_id] = ""
            log.warning(
                "Ray node %s (%s) is left out: node %s is already called %s",
                node_id[:8],
                node["NodeManagerAddress"],
                taken[name][:8],
                name,
            )
            continue
        known[node_id] = name
        taken[name] = node_id
        resources = node["Resources"]
        types = [r.split(":", 1)[1].lower() for r in resources if r.startswith("accelerator_type:")]
        labels = node.get("Labels") or {}
        found.append(
            RayNode(
                name=name,
                node_id=node_id,
                address=str(node["NodeManagerAddress"]),
                gpus=int(resources["GPU"]),
                gpu_type=types[0] if types else "gpu",
                rack=str(labels.get(RACK_LABEL) or "rack-0"),
            )
        )
    for node_id in set(known) - {str(node["NodeID"]) for node in live}:
        del known[node_id]  # gone: a node that comes back is named afresh
    return sorted(found, key=lambda node: node.name)


def _declared(node: dict[str, Any]) -> str:
    names = [
        r[len(NODE_RESOURCE_PREFIX) :]
        for r in node["Resources"]
        if r.startswith(NODE_RESOURCE_PREFIX)
    ]
    return min(names) if names else ""


def _host(node: dict[str, Any]) -> str:
    host = str(node.get("NodeManagerHostname", "")) or str(node["NodeManagerAddress"])
    return host.split(".")[0]


def node_environment(actor_env: Mapping[str, str]) -> dict[str, str]:
    """What a worker starts from: its node's environment as the actor sees it, less what Ray
    set for its own worker processes (RAY_* holds the cluster's auth token, OMP_NUM_THREADS=1
    would slow the job's math) and what is private to corral. A job sets any of them in its
    spec's env if it wants them."""
    return {
        key: value
        for key, value in actor_env.items()
        if not key.startswith(RAY_PREFIXES) and key not in PRIVATE_VARIABLES + RAY_SETS
    }


def node_devices(chosen: str, node_visible: str | None) -> str:
    """The core's devices (0 to N-1 on the node) as this machine names them: a Ray node started
    with CUDA_VISIBLE_DEVICES=4,5,6,7 owns those four, and the core's device 1 is the machine's
    5. `node_visible` is None (or empty) when the node owns all of the machine's GPUs."""
    if not node_visible or not chosen:
        return chosen
    devices = [device.strip() for device in node_visible.split(",")]
    return ",".join(devices[int(index)] for index in chosen.split(","))


def _raylet_devices() -> str | None:
    """The CUDA_VISIBLE_DEVICES this node's Ray was started with (its raylet's), not the one
    Ray set for this actor."""
    try:
        raw = Path(f"/proc/{os.environ['RAY_RAYLET_PID']}/environ").read_bytes()
    except (KeyError, OSError):
        return None
    for item in raw.split(b"\0"):
        if item.startswith(b"CUDA_VISIBLE_DEVICES="):
            return item.split(b"=", 1)[1].decode()
    return None


def access_problem(address: str, timeout_s: float = 5.0) -> str | None:
    """Ask the head's GCS once, as `ray.init` would ask it, whether this process may connect; a
    one-line reason if not (`ray.init` would retry for some 20 s and then not say why).

    Uses the cluster's token as a `ray.init()` without an address would: when RAY_AUTH_MODE is
    not set and a token is at hand (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token)."""
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:  # a Ray without token authentication
        return None
    # Quietly: Ray would log a warning that it did.
    setup_log = logging.getLogger(maybe_enable_token_auth_if_token_available.__module__)
    level = setup_log.level
    setup_log.setLevel(logging.ERROR)
    try:
        maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    finally:
        setup_log.setLevel(level)
    import grpc  # type: ignore[import-untyped]
    from ray._private.authentication.grpc_authentication_client_interceptor import (
        _get_authentication_metadata_tuple,
    )
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    metadata = _get_authentication_metadata_tuple()
    with grpc.insecure_channel(address) as channel:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)  # type: ignore[no-untyped-call]
        try:
            stub.GetClusterId(
                gcs_service_pb2.GetClusterIdRequest(),  # type: ignore[attr-defined]
                timeout=timeout_s,
                metadata=metadata,
            )
        except grpc.RpcError as error:
            code = error.code()
            if code != grpc.StatusCode.UNAUTHENTICATED:
                return f"its GCS does not answer ({code.name.lower()})"
            if not metadata:
                return (
                    "the cluster requires its token: set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH, "
                    "or put it in ~/.ray/auth_token)"
                )
            return (
                "the cluster refused the token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or "
                "~/.ray/auth_token)"
            )
    return None


# ---------------------------------------------------------------------------------------------
# The actor that runs one worker on its node


class WorkerActor:
    """Runs one worker process; methods run on concurrent threads (max_concurrency)."""

    def __init__(self) -> None:
        self.popen: subprocess.Popen[bytes] | None = None
        self.result: dict[str, Any] | None = None
        self.stop_requested = False
        self.killed_after_grace = False
        self.started = threading.Event()
        self.exited = threading.Event()  # the worker exited; maybe not reaped yet (see _reap)
        self.done = threading.Event()  # self.result is final
        self.lock = threading.Lock()
        self.rank = 0
        self.log_dir = Path(tempfile.gettempdir())
        self.kill_requested = threading.Event()
        self.memory_bytes: int | None = None

    def pick_port(self) -> int:
        """A TCP port free on this node a moment ago, for rank 0's MASTER_PORT."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))
            return int(sock.getsockname()[1])

    def start(self, spec: dict[str, Any], master_port: int | None) -> dict[str, Any]:
        self.rank = rank = int(spec["rank"])
        self.memory_bytes = spec.get("memory_bytes")
        # On this node, not the manager's disk: the executor copies the output across. The
        # actor's id keeps apart the same job's attempts of different managers and runs.
        actor_id = ray.get_runtime_context().get_actor_id()
        self.log_dir = Path(tempfile.gettempdir()) / "corral-workers" / f"{spec['name']}-{actor_id}"
        env = node_environment(os.environ)
        env.update({str(k): str(v) for k, v in spec["env"].items()})
        if "CUDA_VISIBLE_DEVICES" in env:
            env["CUDA_VISIBLE_DEVICES"] = node_devices(
                env["CUDA_VISIBLE_DEVICES"], _raylet_devices()
            )
        if not env.get("MASTER_PORT") and master_port is not None:
            env["MASTER_PORT"] = str(master_port)
        info: dict[str, Any] = {"rank": rank, "node_id": ray.get_runtime_context().get_node_id()}
        try:
            with self.lock:
                if self.stop_requested:
                    self._end(self._result(None, "stopped before the worker started"))
                    return info
                self.log_dir.mkdir(parents=True, exist_ok=True)
                progress = self.log_dir / f"rank-{rank}.progress"
                os.close(os.open(progress, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
                env[PROGRESS_VARIABLE] = str(progress)
                stderr_path = self.log_dir / f"rank-{rank}.stderr"
                with (
                    open(self.log_dir / f"rank-{rank}.stdout", "ab") as stdout,
                    open(stderr_path, "ab") as stderr,
                ):
                    try:
                        # The job's own dirs may not exist on this machine yet.
                        Path(spec["workdir"]).mkdir(parents=True, exist_ok=True)
                        if env.get("CORRAL_CHECKPOINT_DIR"):
                            Path(env["CORRAL_CHECKPOINT_DIR"]).mkdir(parents=True, exist_ok=True)
                        if env.get("CORRAL_DATASET_CACHE"):  # this node's cache of its data
                            cache = Path(env["CORRAL_DATASET_CACHE"])
                            cache.mkdir(mode=0o700, parents=True, exist_ok=True)
                        # The guard leads the worker's group, contains everything it starts,
                        # and ends it all if this actor dies (its node's Ray died, the machine
                        # lives on): its stdin is a pipe from here, which ends with the actor.
                        mechanism = (
                            spec.get("contain") or os.environ.get(contain.ENV_MECHANISM) or "auto"
                        )
                        guard = [
                            sys.executable,
                            "-m",
                            "corral.exec.guard",
                            str(os.getpid()),
                            "--contain",
                            str(mechanism),
                            "--name",
                            str(spec["name"]),
                            "--log-cap",
                            str(int(spec.get("log_cap_bytes", logcap.DEFAULT_CAP_BYTES))),
                            "--report",
                            str(self._report_path()),
                            "--control-stdin",
                            *_limit_options(spec),
                            "--",
                        ]
                        self.popen = subprocess.Popen(
                            guard + [str(arg) for arg in spec["argv"]],
                            stdin=subprocess.PIPE,
                            stdout=stdout,
                            stderr=stderr,
                            cwd=spec["workdir"],
                            env=env,
                            process_group=0,
                        )
                    except OSError as exc:
                        stderr.write(f"corral: cannot start rank {rank}: {exc}\n".encode())
                        stderr.flush()
                        self._end(self._result(127, f"cannot start: {exc}"))
                        return info
                threading.Thread(target=self._reap, name="corral-reaper", daemon=True).start()
                info["pid"] = self.popen.pid
                return info
        finally:
            self.started.set()

    def _report_path(self) -> Path:
        return self.log_dir / f"rank-{self.rank}.guard.json"

    def _result(self, returncode: int | None, reason: str = "") -> dict[str, Any]:
        leftover: list[int] = []
        oom_kills = 0
        try:
            with open(self._report_path(), encoding="utf-8") as report:
                guard_report = json.load(report)
            leftover = [int(pid) for pid in guard_report.get("leftover", [])]
            oom_kills = int(guard_report.get("oom_kills", 0))
        except (OSError, ValueError, TypeError, AttributeError):
            pass
        return {
            "rank": self.rank,
            "exit_code": returncode if returncode is not None and returncode >= 0 else None,
            "signal": -returncode if returncode is not None and returncode < 0 else None,
            "stopped": self.stop_requested,
            "killed_after_grace": self.killed_after_grace,
            "reason": reason,
            "error_tail": last_line(self.log_dir / f"rank-{self.rank}.stderr"),
            "ended_at": time.time(),
            "leftover": leftover,
            "oom_kills": oom_kills,
            "memory_bytes": self.memory_bytes,
        }

    def _reap(self) -> None:
        """The worker's end, on a thread of its own (not one of the actor's call threads)."""
        assert self.popen is not None
        # Wait without reaping: while the worker is an unreaped zombie its pid, the group id,
        # cannot be reused, so the killpg below reaches only what it left behind.
        status = os.waitid(os.P_PID, self.popen.pid, os.WEXITED | os.WNOWAIT)
        self.exited.set()
        # A guard that ended of itself did so after its keeper ended the worker's container:
        # whatever is left in the group goes. One that was killed (Ray kills an actor's children
        # as the actor goes) left its keeper to end the container, which the group's SIGKILL
        # would kill half-way, leaving what escaped the group alive.
        killed = status is not None and status.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
        # The keeper writes its report as it ends; a guard ends by a signal of its own accord
        # only after that (as its command did: the OOM killer's SIGKILL, say).
        killed_from_outside = killed and not self._report_path().exists()
        if not killed:
            self._signal_group(signal.SIGKILL)
        returncode = self.popen.wait()
        if self.popen.stdin is not None:
            try:
                self.popen.stdin.close()
            except OSError:
                pass
        result = self._result(returncode)
        if killed_from_outside and not self.stop_requested:
            # Ray kills an actor's children as the actor goes (its node is going down, or
            # someone killed it): the machine's doing, not the job's, as a dead actor is.
            reason = f"lost: rank {self.rank}'s guard was killed (its Ray actor is going away)"
            result.update(lost=True, reason=reason)
        self._end(result)

    def _end(self, result: dict[str, Any]) -> None:
        self.result = result
        self.exited.set()
        self.done.set()

    def wait(self, timeout_s: float) -> dict[str, Any] | None:
        """The worker's result once it ended; None if it has not within `timeout_s`. Bounded, so
        that the calls of a manager that died do not hold the actor's threads for long."""
        if not self.done.wait(timeout_s):
            return None
        return self.result

    def read_output(
        self, offsets: dict[str, int], last: bool = False
    ) -> dict[str, tuple[int, bytes]]:
        """What each stream holds past its offset (at most LOG_CHUNK), and the offset where
        that starts: past what the log cap dropped (a hole), the same offset in the file as
        ever. `last` after the worker ended and everything was read: remove the node's copy."""
        chunks = {stream: (int(offsets.get(stream, 0)), b"") for stream in STREAMS}
        if not self.started.is_set():  # no log dir of its own yet
            return chunks
        for stream in STREAMS:
            try:
                fd = os.open(self.log_dir / f"rank-{self.rank}.{stream}", os.O_RDONLY)
            except OSError:
                continue
            try:
                chunk = logcap.read_range(fd, chunks[stream][0], LOG_CHUNK)
                chunks[stream] = (chunk.next_offset - len(chunk.data), chunk.data)
            except OSError:
                pass
            finally:
                os.close(fd)
        if last and not any(data for _, data in chunks.values()):
            for stream in STREAMS:
                (self.log_dir / f"rank-{self.rank}.{stream}").unlink(missing_ok=True)
            self._report_path().unlink(missing_ok=True)
            try:
                self.log_dir.rmdir()
            except OSError:
                pass
        return chunks

    def state(self) -> str:
        """not-started, running or ended (a start() whose caller died never arrives)."""
        if not self.started.is_set():
            return "not-started"
        return "ended" if self.exited.is_set() else "running"

    def stop(self, stop_signal: int, grace_s: float) -> None:
        """stop_signal to the worker's group, `grace_s`, then SIGKILL. Idempotent."""
        with self.lock:
            if self.stop_requested:
                return
            self.stop_requested = True
        if not self.started.wait(timeout=30) or self.popen is None:
            return
        self._signal_group(stop_signal)
        # _reap is the one that reaps the worker; here only watch for its exit.
        if not self.exited.wait(timeout=grace_s):
            self.killed_after_grace = True
            self._kill_all()

    def signal(self, number: int) -> None:
        """`number` to the worker's group without a stop (the guard outlives it; the command
        gets it): a job's warning before its time limit. A no-op before the start or after."""
        if self.stop_requested or not self.started.is_set():
            return
        self._signal_group(number)

    def _kill_all(self) -> None:
        """Ask the guard to kill everything of the worker; SIGKILL the group (the guard
        included) only if it does not end in good time."""
        popen = self.popen
        if popen is None or popen.stdin is None:
            return
        try:
            popen.stdin.write(KILL_REQUEST)
            popen.stdin.flush()
        except (OSError, ValueError):  # the guard is gone already
            pass
        if not self.exited.wait(timeout=contain.END_TIMEOUT_S + 5.0):
            self._signal_group(signal.SIGKILL)

    def _signal_group(self, number: int) -> None:
        if self.popen is None or self.popen.returncode is not None:
            return  # reaped: its pid (the group id) may belong to someone else by now
        try:
            os.killpg(self.popen.pid, number)
        except ProcessLookupError:
            pass


class HealthProbe:
    """A node's health checks, run on the node (one actor per node, kept between checks: its
    NVML reader sees the XID events that arrive between two checks)."""

    def __init__(self, nvml: bool) -> None:
        self.nvml: NvmlReader | None = None
        if nvml:  # a node without NVML is judged by its command alone
            reader = NvmlReader()
            if reader.open():
                self.nvml = reader

    def check(
        self, command: tuple[str, ...], node: str, gpus: int, timeout_s: float, cap: int
    ) -> tuple[bool, str]:
        result = check_node(command, node, gpus, timeout_s, cap, self.nvml)
        return result.healthy, result.reason

    def forget(self) -> None:
        if self.nvml is not None:
            self.nvml.forget()


_RemoteWorker = ray.remote(WorkerActor)
_RemoteHealthProbe = ray.remote(HealthProbe)
_remote_trim = ray.remote(num_cpus=0, max_retries=0)(cachedir.trim)


class RayCacheDirs:
    """Trims and removes data-set cache directories on the Ray nodes (corral.exec.cachedir):
    `cachedir.trim` as a task pinned to the node; a directory is `busy` until its task is done.
    The worker actors make the directories they are given (`CORRAL_DATASET_CACHE`)."""

    local = False

    def __init__(self, executor: RayExecutor) -> None:
        self._executor = executor
        self._running: dict[tuple[str, Path], Any] = {}

    def trim(self, node: str, path: Path, keep_bytes: int) -> None:
        node_ids = {known.name: known.node_id for known in self._executor.nodes()}
        if node not in node_ids:  # gone: its disk is no longer the cluster's
            return
        strategy = NodeAffinitySchedulingStrategy(node_ids[node], soft=False)
        self._running[(node, path)] = _remote_trim.options(scheduling_strategy=strategy).remote(
            str(path), keep_bytes
        )

    def busy(self, node: str, path: Path) -> bool:
        ref = self._running.get((node, path))
        if ref is None:
            return False
        ready, _ = ray.wait([ref], timeout=0)
        if not ready:
            return True
        del self._running[(node, path)]
        try:
            ray.get(ref)
        except RayError as error:
            log.warning("cache directory %s on %s: %s", path, node, _first_line(error))
        return False

    def clear_evicted(self, node_dir: Path) -> None:
        """(What removals left half-done stays on the nodes: they are not listed from here.)"""


# ---------------------------------------------------------------------------------------------
# The executor


@dataclass(slots=True)
class _Attempt:
    job_id: str
    attempt: int
    attempt_dir: Path
    stop_signal: int
    grace_s: float
    actors: list[Any]  # ActorHandle per rank (None where it is gone)
    nodes: list[str]  # corral's name of each rank's node
    waiting: dict[Any, int] = field(default_factory=dict)  # wait() ObjectRef -> rank
    starting: dict[Any, int] = field(default_factory=dict)  # start() ObjectRef -> rank
    #: Why a rank could not start, for the lost result its killed actor then gets.
    start_errors: dict[int, str] = field(default_factory=dict)
    launched_at: float = field(default_factory=time.monotonic)
    results: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: Bytes of each (rank, stream) copied to the manager's attempt dir so far.
    copied: dict[tuple[int, str], int] = field(default_factory=dict)
    copy_lock: threading.Lock = field(default_factory=threading.Lock)
    stop_requested: bool = False
    gang_stopping: bool = False
    failed_rank: int | None = None
    #: The cap of the manager's copy of each log (the node's is capped by the guard).
    log_cap: int = logcap.DEFAULT_CAP_BYTES


class RayExecutor:
    """Launches, stops, polls and recovers attempts on a Ray cluster. Thread-safe."""

    #: No shares of a GPU: each worker's actor asks Ray for whole GPUs, so two jobs on one GPU
    #: would wait for each other in Ray's accounting (the manager refuses shares here).
    shares_gpus = False

    def __init__(
        self, address: str, namespace: str = NAMESPACE, containment: str | None = None
    ) -> None:
        """`containment`: the corral.exec.contain mechanism of every worker's guard (None: the
        node's $CORRAL_CONTAIN, else the best the node has)."""
        self.namespace = namespace
        self.containment = containment
        self._owns_connection = not ray.is_initialized()
        if self._owns_connection:
            ray.init(address=address, namespace=namespace, log_to_driver=False)
        self._tracked: dict[tuple[str, int], _Attempt] = {}
        self._lock = threading.Lock()
        self._names: dict[str, str] = {}  # Ray's node id -> corral's name, while it lives
        self._names_lock = threading.Lock()
        self._probes: dict[str, tuple[str, Any]] = {}  # node -> (Ray's node id, its probe)
        self._probes_lock = threading.Lock()
        self._closing = threading.Event()
        self._copier = threading.Thread(target=self._copy_logs, name="corral-ray-logs", daemon=True)
        self._copier.start()

    def limits_text(self, pids_cap: str) -> str:
        """What `corral up` says at its start about the attempts' limits (`pids_cap`: the task
        limit, in words): the Ray nodes tell only in the workers' logs which they cannot set."""
        return (
            f"each worker: {pids_cap}, its spec's memory and cpus, where its Ray node's cgroups "
            "allow (the worker's log says what they do not)"
        )

    def nodes(self) -> list[RayNode]:
        with self._names_lock:
            return ray_nodes(self._names)

    # -- launching and stopping ----------------------------------------------------------------

    def launch(self, launch: AttemptLaunch) -> None:
        """Start one detached actor per worker on its node; returns without waiting."""
        key = (launch.job_id, launch.attempt)
        nodes = {node.name: node for node in self.nodes()}
        placed: list[tuple[WorkerLaunch, RayNode]] = []
        for worker in sorted(launch.workers, key=lambda w: w.rank):
            if worker.node not in nodes:
                raise ValueError(f"rank {worker.rank}: node {worker.node!r} is not a live node")
            placed.append((worker, nodes[worker.node]))
        attempt_dir = Path(launch.attempt_dir).resolve()
        with self._lock:
            if key in self._tracked:
                raise ValueError(f"attempt {launch.attempt} of job {launch.job_id} is running")
            make_job_dirs(launch)  # on this machine: the manager's (each worker makes its own)
            # The manager's, checked as the local executor's are (recover reads it back).
            os.close(attempt_directory(attempt_dir, 0o700))
            if launch.checkpoint_dir is not None:
                Path(launch.checkpoint_dir).mkdir(parents=True, exist_ok=True)
            write_json_atomic(
                attempt_dir / LAUNCH_FILE,
                {
                    "job_id": launch.job_id,
                    "attempt": launch.attempt,
                    "workers": len(placed),
                    "nodes": [node.name for _, node in placed],
                    "stop_signal": int(launch.stop_signal),
                    "grace_s": float(launch.grace_s),
                    "log_cap_bytes": int(launch.log_cap_bytes),
                },
                durable=True,
            )
            actors: list[Any] = []
            try:
                for worker, node in placed:
                    actors.append(self._worker_actor(launch, worker, node))
                tracked = _Attempt(
                    launch.job_id,
                    launch.attempt,
                    attempt_dir,
                    int(launch.stop_signal),
                    float(launch.grace_s),
                    actors,
                    [node.name for _, node in placed],
                    log_cap=int(launch.log_cap_bytes),
                )
                self._start_workers(tracked, placed, launch, self.containment)
            except BaseException:  # nothing of it may linger: no actor holds its GPUs
                for actor in actors:
                    ray.kill(actor, no_restart=True)
                (attempt_dir / LAUNCH_FILE).unlink(missing_ok=True)
                raise
            self._tracked[key] = tracked

    def _worker_actor(self, launch: AttemptLaunch, worker: WorkerLaunch, node: RayNode) -> Any:
        gpus = len([g for g in worker.env.get("CORRAL_LOCAL_GPUS", "").split(",") if g])
        return _RemoteWorker.options(
            name=actor_name(launch.job_id, launch.attempt, worker.rank),
            namespace=self.namespace,
            lifetime="detached",
            max_concurrency=8,
            max_restarts=0,
            num_cpus=0,
            # Ray's accounting agrees with the core's count; the devices themselves are the
            # core's choice, set in the worker's CUDA_VISIBLE_DEVICES.
            num_gpus=gpus,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, False),
        ).remote()

    @staticmethod
    def _start_workers(
        tracked: _Attempt,
        placed: list[tuple[WorkerLaunch, RayNode]],
        launch: AttemptLaunch,
        containment: str | None,
    ) -> None:
        rank0_env = placed[0][0].env
        # Rank 0's node picks the port; Ray hands the result to every start() call.
        port_ref = (
            tracked.actors[0].pick_port.remote() if not rank0_env.get("MASTER_PORT") else None
        )
        for (worker, _), actor in zip(placed, tracked.actors, strict=True):
            env = dict(worker.env)
            if not env.get("MASTER_ADDR"):
                env["MASTER_ADDR"] = placed[0][1].address
            spec = {
                "name": actor_name(tracked.job_id, tracked.attempt, worker.rank),
                "rank": worker.rank,
                "argv": list(worker.argv),
                "env": env,
                "workdir": launch.workdir,
                "log_cap_bytes": tracked.log_cap,
                "contain": containment,
                # each worker's own container: its own limits (the attempt's on one machine)
                "memory_bytes": launch.memory_bytes,
                "cpus": launch.cpus,
                "pids_max": launch.pids_max,
            }
            tracked.starting[actor.start.remote(spec, port_ref)] = worker.rank
            tracked.waiting[actor.wait.remote(WAIT_S)] = worker.rank

    def stop(self, job_id: str, attempt: int) -> None:
        """Ask every worker of an attempt to stop (signal, grace, kill). Idempotent."""
        with self._lock:
            tracked = self._tracked.get((job_id, attempt))
            if tracked is None or tracked.stop_requested:
                return
            tracked.stop_requested = True
            self._stop_workers(tracked)

    def signal(self, job_id: str, attempt: int, number: int) -> None:
        """Send every running worker of the attempt `number`, without stopping it."""
        with self._lock:
            tracked = self._tracked.get((job_id, attempt))
            if tracked is None or tracked.stop_requested:
                return
            for rank, actor in enumerate(tracked.actors):
                if rank not in tracked.results and actor is not None:
                    actor.signal.remote(number)

    @staticmethod
    def _stop_workers(tracked: _Attempt) -> None:
        for rank, actor in enumerate(tracked.actors):
            if rank not in tracked.results and actor is not None:
                actor.stop.remote(tracked.stop_signal, tracked.grace_s)

    # -- observing -----------------------------------------------------------------------------

    def poll(self) -> list[AttemptEnded]:
        """The attempts that ended since the last call; each is reported once."""
        finished = []
        with self._lock:
            pending = [
                ref
                for tracked in self._tracked.values()
                for ref in (*tracked.waiting, *tracked.starting)
            ]
            ready: set[Any] = set()
            if pending:
                ready = set(ray.wait(pending, num_returns=len(pending), timeout=0)[0])
            for key, tracked in list(self._tracked.items()):
                self._check_starts(tracked, ready)
                for ref in [ref for ref in tracked.waiting if ref in ready]:
                    rank = tracked.waiting.pop(ref)
                    result = self._collect(tracked, rank, ref)
                    if result is None:  # still running: ask again
                        tracked.waiting[tracked.actors[rank].wait.remote(WAIT_S)] = rank
                        continue
                    tracked.results[rank] = result
                    self._note_failure(tracked, rank)
                if tracked.failed_rank is not None and not tracked.gang_stopping:
                    tracked.gang_stopping = True  # a failing worker ends its whole gang
                    self._stop_workers(tracked)
                if not tracked.waiting:
                    finished.append(self._tracked.pop(key))
        ended = []
        for tracked in finished:  # without the lock: the last copy of big logs takes a while
            self._copy_attempt_logs(tracked, last=True)
            for rank, result in tracked.results.items():
                write_json_atomic(tracked.attempt_dir / f"rank-{rank}.result.json", result)
            ended.append(_attempt_ended(tracked))
            for actor in tracked.actors:
                if actor is not None:
                    ray.kill(actor, no_restart=True)
        return ended

    @staticmethod
    def _check_starts(tracked: _Attempt, ready: set[Any]) -> None:
        """A worker that cannot start (its actor died first, or rank 0's did before it gave
        the port, or Ray cannot place it) would never end: its actor is killed, which ends its
        wait() as lost, with the reason kept here."""
        failed = []
        for ref in [ref for ref in tracked.starting if ref in ready]:
            rank = tracked.starting.pop(ref)
            try:
                ray.get(ref)
            except RayError as error:
                failed.append((rank, f"its start failed ({_first_line(error)})"))
        if tracked.starting and time.monotonic() - tracked.launched_at > START_TIMEOUT_S:
            for rank in tracked.starting.values():
                why = f"Ray did not place it on node {tracked.nodes[rank]} in {START_TIMEOUT_S:g} s"
                failed.append((rank, why))
            tracked.starting.clear()
        for rank, why in failed:
            tracked.start_errors[rank] = f"lost: rank {rank} could not start: {why}"
            ray.kill(tracked.actors[rank], no_restart=True)

    @staticmethod
    def _collect(tracked: _Attempt, rank: int, ref: Any) -> dict[str, Any] | None:
        """A wait() call's answer: the rank's result, or None while it runs."""
        try:
            result = ray.get(ref)
        except RayError as error:
            return _lost_result(tracked, rank, error)
        return None if result is None else dict(result)

    @staticmethod
    def _note_failure(tracked: _Attempt, rank: int) -> None:
        result = tracked.results[rank]
        failed = (
            result.get("lost")
            or result.get("exit_code") not in (0, None)
            or (result.get("signal") is not None)
        )
        if failed and not tracked.stop_requested and tracked.failed_rank is None:
            tracked.failed_rank = rank

    # -- logs ----------------------------------------------------------------------------------

    def _copy_logs(self) -> None:
        """The log copier's loop: new output of every running worker, about once a second."""
        while not self._closing.wait(LOG_COPY_EVERY_S):
            with self._lock:
                attempts = list(self._tracked.values())
            for tracked in attempts:
                try:
                    self._copy_attempt_logs(tracked)
                except Exception:  # a node going away mid-copy: the next round, or its end
                    continue

    @staticmethod
    def _copy_attempt_logs(tracked: _Attempt, last: bool = False) -> None:
        """Append each worker's new output to the manager's rank-R.stdout/.stderr, until the
        copy has caught up with the worker (`last`: until the worker has nothing more, which
        also removes the node's copy)."""
        with tracked.copy_lock:
            ranks = [rank for rank, actor in enumerate(tracked.actors) if actor is not None]
            while ranks:
                refs = {
                    rank: tracked.actors[rank].read_output.remote(
                        {stream: tracked.copied.get((rank, stream), 0) for stream in STREAMS}, last
                    )
                    for rank in ranks
                }
                ranks = []
                for rank, ref in refs.items():
                    try:
                        chunks = ray.get(ref, timeout=10)
                    except (RayError, GetTimeoutError):
                        continue  # its node is gone: what was copied is what there is
                    for stream, (start, data) in chunks.items():
                        if data:
                            path = tracked.attempt_dir / f"rank-{rank}.{stream}"
                            copied = tracked.copied.get((rank, stream), 0)
                            _write_at(path, start, data, start < copied, tracked.log_cap)
                            tracked.copied[(rank, stream)] = start + len(data)
                    sizes = [len(data) for _, data in chunks.values()]
                    if any(sizes) if last else max(sizes) >= LOG_CHUNK:
                        ranks.append(rank)

    # -- recovery ------------------------------------------------------------------------------

    def recover(
        self, job_id: str, attempt: int, attempt_dir: Path
    ) -> Literal["running", "never-started"] | AttemptEnded:
        """After a manager restart: find the attempt's actors again by name."""
        attempt_dir = Path(attempt_dir).resolve()
        with self._lock:
            if (job_id, attempt) in self._tracked:
                return "running"
        launched = safefs.read_json_in(attempt_dir, LAUNCH_FILE)  # the manager's own, or none
        if launched is None:
            return "never-started"
        tracked = _Attempt(
            job_id,
            attempt,
            attempt_dir,
            int(launched["stop_signal"]),
            float(launched["grace_s"]),
            [],
            list(launched["nodes"]),
            log_cap=int(launched.get("log_cap_bytes", logcap.DEFAULT_CAP_BYTES)),
        )
        for rank in range(int(launched["workers"])):
            for stream in STREAMS:
                copy = attempt_dir / f"rank-{rank}.{stream}"
                tracked.copied[(rank, stream)] = copy.stat().st_size if copy.exists() else 0
            try:
                tracked.actors.append(
                    ray.get_actor(actor_name(job_id, attempt, rank), namespace=self.namespace)
                )
            except ValueError:
                tracked.actors.append(None)
        if None in tracked.actors:
            return self._recover_partial(tracked)
        states = self._states(tracked.actors)
        if "gone" in states:  # died since get_actor found it
            for rank, state in enumerate(states):
                if state == "gone":
                    tracked.actors[rank] = None
            return self._recover_partial(tracked)
        if all(state == "not-started" for state in states):
            # The manager died between creating the actors and starting them: nothing ran.
            for actor in tracked.actors:
                ray.kill(actor, no_restart=True)
            return "never-started"
        if "not-started" in states:  # half a gang started: it can never run as one
            for rank, state in enumerate(states):
                if state == "not-started":
                    ray.kill(tracked.actors[rank], no_restart=True)
                    tracked.actors[rank] = None
            return self._recover_partial(tracked)
        for rank, actor in enumerate(tracked.actors):
            tracked.waiting[actor.wait.remote(WAIT_S)] = rank
        with self._lock:
            self._tracked[(job_id, attempt)] = tracked
        return "running"

    @staticmethod
    def _states(actors: list[Any]) -> list[str]:
        """Each actor's state(); "gone" if it died, "running" if it is too busy to answer
        (a worker that has not started answers at once: it is never mistaken for one)."""
        refs = [actor.state.remote() for actor in actors]
        ready = set(ray.wait(refs, num_returns=len(refs), timeout=30)[0])
        states = []
        for ref in refs:
            if ref not in ready:
                states.append("running")
                continue
            try:
                states.append(str(ray.get(ref)))
            except RayError:
                states.append("gone")
        return states

    def _recover_partial(self, tracked: _Attempt) -> AttemptEnded:
        """Some actors are gone: the attempt ended (results on disk) or was lost."""
        for rank, actor in enumerate(tracked.actors):
            written = safefs.read_json_in(tracked.attempt_dir, f"rank-{rank}.result.json")
            if written is not None:
                tracked.results[rank] = written
            elif actor is None:
                tracked.results[rank] = _lost_result(tracked, rank, "its actor is gone")
            else:  # alive but part of a broken gang: it must not run on alone
                actor.stop.remote(signal.SIGKILL, 0.0)
                result = self._collect(tracked, rank, actor.wait.remote(WAIT_S))
                tracked.results[rank] = result or _lost_result(tracked, rank, "no end")
            self._note_failure(tracked, rank)
        self._copy_attempt_logs(tracked, last=True)
        for actor in tracked.actors:
            if actor is not None:
                ray.kill(actor, no_restart=True)
        return _attempt_ended(tracked)

    def cache_dirs(self) -> RayCacheDirs:
        """What trims the nodes' data-set cache directories (SiloD live)."""
        return RayCacheDirs(self)

    def active(self) -> set[tuple[str, int]]:
        with self._lock:
            return set(self._tracked)

    def leftover(self, job_id: str, attempt: int, attempt_dir: Path) -> int:
        """Processes of an ended attempt that still live: the guards on the nodes report theirs
        as the attempt ends, and cannot be asked again once their actors are gone: 0."""
        return 0

    # -- health checks -------------------------------------------------------------------------

    def check_node_health(
        self,
        node: str,
        gpus: int,
        command: tuple[str, ...],
        timeout_s: float,
        output_cap: int,
        nvml: bool,
    ) -> CheckResult:
        """The node's health check (corral.exec.healthcheck), run on the node by its probe
        actor: the site's command there, NVML of the node's GPUs. A node Ray no longer has, or
        whose probe does not answer within the command's timeout and HEALTH_ANSWER_S, is
        unhealthy."""
        found = next((n for n in self.nodes() if n.name == node), None)
        if found is None:
            return CheckResult(False, f"health check: Ray has no live node {node}")
        probe = self._health_probe(found, nvml)
        wait_s = timeout_s + HEALTH_ANSWER_S
        try:
            healthy, reason = ray.get(
                probe.check.remote(command, node, gpus, timeout_s, output_cap), timeout=wait_s
            )
        except GetTimeoutError:
            self._drop_probe(node)
            return CheckResult(
                False, f"health check: no answer from Ray node {node} in {wait_s:g} s"
            )
        except RayError as error:
            self._drop_probe(node)
            return CheckResult(False, first_line(f"health check on Ray node {node}: {error}"))
        return CheckResult(bool(healthy), str(reason))

    def forget_node_health(self, node: str) -> None:
        """An admin resumed the node: its probe forgets the XID errors NVML reported."""
        with self._probes_lock:
            held = self._probes.get(node)
        if held is not None:
            held[1].forget.remote()

    def _health_probe(self, node: RayNode, nvml: bool) -> Any:
        with self._probes_lock:
            held = self._probes.get(node.name)
            if held is not None and held[0] == node.node_id:
                return held[1]
            probe = _RemoteHealthProbe.options(
                num_cpus=0,
                max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, False),
            ).remote(nvml)
            self._probes[node.name] = (node.node_id, probe)
            return probe

    def _drop_probe(self, node: str) -> None:
        with self._probes_lock:
            held = self._probes.pop(node, None)
        if held is not None:
            try:
                ray.kill(held[1])
            except RayError:
                pass

    def close(self) -> None:
        """Stop tracking. Never kills: the detached actors outlive the manager."""
        self._closing.set()
        for node in list(self._probes):
            self._drop_probe(node)
        self._copier.join(timeout=15)
        with self._lock:
            self._tracked.clear()
        if self._owns_connection:
            ray.shutdown()


def _write_at(path: Path, offset: int, data: bytes, restart: bool, cap: int) -> None:
    """Write `data` at `offset` of the manager's copy of a log: past a hole in the node's file
    (what its cap dropped), a hole here too, so offsets agree and the copy stays small.
    `restart`: the node's file started over (a filesystem without holes truncates instead)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        if restart:
            os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            written = os.pwrite(fd, view, offset)
            view = view[written:]
            offset += written
        logcap.cap_file(fd, cap)
    finally:
        os.close(fd)


def _first_line(error: object) -> str:
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:200]


def _lost_result(tracked: _Attempt, rank: int, error: object) -> dict[str, Any]:
    died = f"lost: rank {rank}'s Ray actor died ({_first_line(error)})"
    return {
        "rank": rank,
        "exit_code": None,
        "signal": None,
        "stopped": tracked.stop_requested,
        "lost": True,
        "reason": tracked.start_errors.get(rank, died),
        "error_tail": "",
        "ended_at": time.time(),
    }


def _limit_options(spec: Mapping[str, Any]) -> list[str]:
    """The guard's options for a worker's limits (`corral.exec.guard`)."""
    options = []
    for key, option in (
        ("memory_bytes", "--memory"),
        ("cpus", "--cpus"),
        ("pids_max", "--pids-max"),
    ):
        if spec.get(key) is not None:
            options += [option, str(spec[key])]
    return options


def _out_of_memory(result: Mapping[str, Any]) -> str:
    """ "out of memory: ...; " for a worker the kernel killed at its memory limit, else ""."""
    kills, limit = int(result.get("oom_kills") or 0), result.get("memory_bytes")
    if kills <= 0 or limit is None:
        return ""
    what = "a process" if kills == 1 else f"{kills} processes"
    return (
        f"out of memory: the kernel killed {what} at the worker's memory limit "
        f"{contain.size_text(int(limit))}; "
    )


def _attempt_ended(tracked: _Attempt) -> AttemptEnded:
    """The attempt's end from its workers' results, by the shim's rules."""
    results = tracked.results
    ended_at = max(float(r.get("ended_at", 0.0)) for r in results.values()) or time.time()

    leftover = sum(len(r.get("leftover") or []) for r in results.values())

    def make(
        code: int | None, sig: int | None, stopped: bool, reason: str, tail: str = ""
    ) -> AttemptEnded:
        if leftover:
            reason += f"; {leftover} process(es) could not be ended"
        return AttemptEnded(
            tracked.job_id, tracked.attempt, code, sig, stopped, reason, tail, ended_at, leftover
        )

    lost = [r for r in sorted(results) if results[r].get("lost")]
    if lost:
        return make(None, None, False, str(results[lost[0]]["reason"]))
    if tracked.failed_rank is not None:
        failed = results[tracked.failed_rank]
        rank = tracked.failed_rank
        if failed.get("exit_code") is not None:
            reason = f"exit code {failed['exit_code']} (rank {rank})"
        elif failed.get("signal") is not None:
            reason = f"killed by {signal_name(int(failed['signal']))} (rank {rank})"
        else:
            reason = f"{failed.get('reason') or 'failed'} (rank {rank})"
        reason = _out_of_memory(failed) + reason
        return make(
            failed.get("exit_code"), failed.get("signal"), False, reason, failed["error_tail"]
        )
    first = results[0]
    if tracked.stop_requested:
        if any(
            r.get("killed_after_grace") and r.get("signal") == signal.SIGKILL
            for r in results.values()
        ):
            reason = f"stopped: killed by SIGKILL after {tracked.grace_s:g} s grace"
            return make(None, int(signal.SIGKILL), True, reason)
        if first.get("exit_code") is not None:
            reason = (
                f"stopped: exit code {first['exit_code']} after {signal_name(tracked.stop_signal)}"
            )
        elif first.get("signal") is not None:
            reason = f"stopped: ended by {signal_name(int(first['signal']))}"
        else:
            reason = f"stopped: {first.get('reason') or 'before it started'}"
        return make(first.get("exit_code"), first.get("signal"), True, reason)
    return make(first.get("exit_code"), None, False, f"exit code {first.get('exit_code')}")
