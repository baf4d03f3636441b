"""A real multi-node Ray cluster on this machine (127.0.0.1), for the Ray executor's tests.

Each node is a `ray start --block` process that this module started: stopping it (SIGTERM) makes
Ray stop that node's own daemons, so no broad `ray stop` is needed and nothing else is touched.
Each node declares GPUs and a `corral-node-NAME` resource that names it for corral.

Every process of a node (its Ray daemons, its workers, the jobs they start) inherits
CORRAL_TEST_NODE=NAME: a test sees where a job ran, and `kill_node` kills all of a node's
processes at once, as a machine that dies would lose them. They also inherit
CORRAL_TEST_CLUSTER=ID, unique to the cluster: `stop` (which also runs when `start` fails half-way)
ends whatever of this cluster is left, and nothing of another test run's clusters.

A node's start is waited for on its "Ray runtime started" line, within a budget that holds on a
loaded 2-core machine (a whole cluster took 57 s to start there).
"""

from __future__ import annotations

import json
import os
import queue
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tests.netns import only_loopback

if TYPE_CHECKING:
    from corral.exec.ray import RayExecutor

RAY = str(Path(sys.executable).with_name("ray"))
READY_LINE = "Ray runtime started"
#: Seconds a cluster (or a joining node) may take to start: generous, the wait ends at the ready
#: line. On a 2-core machine with other load a cluster of three nodes took 57 s.
START_TIMEOUT_S = 240.0
#: Seconds a node's `ray start --block` may take to stop its daemons after SIGTERM.
STOP_TIMEOUT_S = 30.0


def use_token_auth(directory: Path) -> Path:
    """Every Ray process this process starts afterwards, and its own `ray.init`, use token
    authentication with a fresh token kept in `directory`: as a secured cluster would, and
    independent of any ~/.ray/auth_token on the machine (whose presence alone makes a head
    node, but not a joining one, require a token). Returns the token file."""
    token_file = directory / "ray-auth-token"
    token_file.write_text(secrets.token_hex(32))
    token_file.chmod(0o600)
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(token_file)
    return token_file


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _environment(node: str, cluster: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "CORRAL_TEST_NODE": node,
            "CORRAL_TEST_CLUSTER": cluster,
            "RAY_USAGE_STATS_ENABLED": "0",
            # The memory monitor polls /proc often: wasted CPU on a 2-core machine.
            "RAY_memory_monitor_refresh_ms": "0",
            # A dead node is found within about 2 s, not Ray's default of tens of seconds.
            "RAY_health_check_initial_delay_ms": "0",
            "RAY_health_check_period_ms": "500",
            "RAY_health_check_timeout_ms": "500",
            "RAY_health_check_failure_threshold": "3",
        }
    )
    return env


def processes_of(node: str, jobs: bool, cluster: str | None = None) -> list[int]:
    """The pids of the processes that carry CORRAL_TEST_NODE=node in their environment: the
    jobs' (their environment has CORRAL_JOB_ID) or else Ray's own; of one cluster (its `id`) if
    given, so that another test run's node of the same name is never counted."""
    return [
        pid
        for pid, environ in _environments()
        if f"CORRAL_TEST_NODE={node}".encode() in environ
        and (cluster is None or f"CORRAL_TEST_CLUSTER={cluster}".encode() in environ)
        and any(item.startswith(b"CORRAL_JOB_ID=") for item in environ) == jobs
    ]


def processes_of_cluster(cluster: str) -> list[int]:
    """The pids of every process of a cluster (its `id`): nodes, daemons, workers, jobs."""
    marker = f"CORRAL_TEST_CLUSTER={cluster}".encode()
    me = os.getpid()
    return [pid for pid, environ in _environments() if marker in environ and pid != me]


def processes_of_job(job_id: str) -> list[int]:
    """The pids of the processes of a job (CORRAL_JOB_ID=job_id), on any node."""
    return [
        pid for pid, environ in _environments() if f"CORRAL_JOB_ID={job_id}".encode() in environ
    ]


def _environments() -> list[tuple[int, list[bytes]]]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found.append((int(entry.name), (entry / "environ").read_bytes().split(b"\0")))
            except OSError:
                continue
    return found


@dataclass(slots=True)
class RayCluster:
    gpus_per_node: int = 2
    node_names: tuple[str, ...] = ("a", "b")
    #: The head node: it declares no GPUs when set, as a CPU-only head would.
    head: str | None = None
    #: Node name -> the GPU type it declares (Ray's `accelerator_type:X` resource); "gpu" else.
    gpu_types: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=_free_port)
    #: Marks every process of this cluster (CORRAL_TEST_CLUSTER), for `stop` to sweep.
    id: str = field(default_factory=lambda: secrets.token_hex(8))
    temp_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="corral-ray-")))
    nodes: list[subprocess.Popen[str]] = field(default_factory=list)
    names: list[str] = field(default_factory=list)  # of the nodes, in the same order
    started_in_s: float = 0.0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        """Start every node, or none: a start that fails (or is interrupted) half-way stops the
        nodes it began before it raises."""
        if not only_loopback():
            raise RuntimeError(
                "the Ray tests need a network namespace with only loopback (tests/conftest.py "
                "makes one as root); run pytest as root or under `unshare -rn`"
            )
        began = time.monotonic()
        try:
            if self.head is not None:
                self._start_node(self.head, gpus=0, rack=None, head=True, deadline=began + timeout)
            for name in self.node_names:
                head = not self.nodes
                self._start_node(name, self.gpus_per_node, None, head, began + timeout)
        except BaseException:
            self.stop()
            raise
        self.started_in_s = time.monotonic() - began

    def add_node(
        self,
        name: str,
        gpus: int | None = None,
        rack: str | None = None,
        named: bool = True,
        timeout: float = START_TIMEOUT_S,
        devices: str | None = None,
    ) -> None:
        """A node that joins; `named=False` declares no corral-node resource; `devices` is the
        CUDA_VISIBLE_DEVICES its `ray start` runs with (the machine's GPUs it owns). A node that
        fails to start is stopped again, and is not one of the cluster's."""
        gpus = self.gpus_per_node if gpus is None else gpus
        self._start_node(name, gpus, rack, False, time.monotonic() + timeout, named, devices)

    def stop_node(self, name: str) -> None:
        """Stop a node as an operator would (`ray start --block` ended by SIGTERM)."""
        index = self.names.index(name)
        node = self.nodes.pop(index)
        del self.names[index]
        self._stop(node)

    def _start_node(
        self,
        name: str,
        gpus: int,
        rack: str | None,
        head: bool,
        deadline: float,
        named: bool = True,
        devices: str | None = None,
    ) -> None:
        argv = [
            RAY,
            "start",
            "--block",
            "--node-ip-address=127.0.0.1",
            "--num-cpus=1",
            f"--num-gpus={gpus}",
            "--object-store-memory=100000000",
            "--disable-usage-stats",
        ]
        if gpus and named:
            resources = {f"corral-node-{name}": 1}
            if name in self.gpu_types:
                resources[f"accelerator_type:{self.gpu_types[name]}"] = 1
            argv.append(f"--resources={json.dumps(resources)}")
        if rack is not None:
            argv.append(f"--labels=corral-rack={rack}")
        if head:
            argv += [
                "--head",
                f"--port={self.port}",
                "--include-dashboard=false",
                f"--temp-dir={self.temp_dir}",
            ]
        else:
            argv.append(f"--address={self.address}")
        env = _environment(name, self.id) | ({"CUDA_VISIBLE_DEVICES": devices} if devices else {})
        node = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )
        self.nodes.append(node)
        self.names.append(name)
        try:
            self._wait_ready(node, deadline)
        except BaseException:
            # Its `ray start` may die of the SIGTERM before it can stop the daemons it began.
            try:
                self.stop_node(name)
            finally:
                self._sweep(node=name)
            raise

    def kill_node(self, name: str) -> int:
        """SIGKILL every Ray process of the node (not the head), but not the jobs' processes:
        these must die by themselves (their guard sees its actor die)."""
        killed = 0
        for pid in processes_of(name, jobs=False, cluster=self.id):
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        return killed

    @staticmethod
    def _wait_ready(node: subprocess.Popen[str], deadline: float) -> None:
        """Until the node prints its ready line; raises if it ends first or the deadline passes
        (a thread reads its output: a node that prints nothing cannot hold the wait up)."""
        stdout = node.stdout
        assert stdout is not None
        lines: queue.Queue[str | None] = queue.Queue()

        def read() -> None:
            # To the end, so that a full pipe never blocks the node's process; then it closes
            # the pipe (a close from another thread would wait for a blocked read).
            with stdout:
                for line in stdout:
                    lines.put(line)
            lines.put(None)

        threading.Thread(target=read, name="ray-node-output", daemon=True).start()
        seen: list[str] = []
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                raise RuntimeError(
                    f"ray node ended (exit code {node.wait()}) before it started:\n"
                    + "".join(seen[-20:])
                )
            seen.append(line)
            if READY_LINE in line:
                return
        raise RuntimeError("ray node did not start in time:\n" + "".join(seen[-20:]))

    def stop(self) -> None:
        """Stop every node, then kill whatever of this cluster is left (a daemon, a worker or a
        job that outlived its node's stop); safe to call again, and after a failed start."""
        try:
            # Workers before the head, so that no node waits for a vanished head.
            while self.nodes:
                self._stop(self.nodes.pop())
                self.names.pop()
        finally:
            self._sweep()
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def _sweep(self, node: str | None = None) -> None:
        """SIGKILL every process left of this cluster (or of one of its nodes), until none is."""

        def left_over() -> list[int]:
            if node is None:
                return processes_of_cluster(self.id)
            return [pid for jobs in (False, True) for pid in processes_of(node, jobs, self.id)]

        deadline = time.monotonic() + STOP_TIMEOUT_S
        while left := left_over():
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes of a stopped Ray cluster live on: {left}")
            time.sleep(0.1)

    @staticmethod
    def _stop(node: subprocess.Popen[str]) -> None:
        if node.poll() is None:
            node.send_signal(signal.SIGTERM)
        try:
            node.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(node.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            node.wait()
        # Its output's reader (see _wait_ready) closes the pipe once the node's processes are gone.


def kill_named_actors(namespace: str | None = None) -> None:
    """Kill the named actors of `namespace` (None: of every namespace) on the cluster this
    process is connected to: a job's detached actors outlive the manager that started them, and
    a node whose actors still run holds its shutdown up for the whole stop timeout."""
    import ray

    for actor in ray.util.list_named_actors(all_namespaces=True):
        if namespace is None or actor["namespace"] == namespace:
            ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]), no_restart=True)


@contextmanager
def stopped_at_the_end(cluster: RayCluster) -> Iterator[RayCluster]:
    """Start `cluster`; at the end kill every named actor the tests left on it (connecting for
    that), then stop it."""
    import ray

    try:
        cluster.start()
        yield cluster
    finally:
        try:
            if cluster.nodes:
                connects = not ray.is_initialized()
                if connects:
                    ray.init(address=cluster.address, log_to_driver=False)
                try:
                    kill_named_actors()
                finally:
                    if connects:
                        ray.shutdown()
        finally:
            cluster.stop()


@contextmanager
def executor_on(cluster: RayCluster) -> Iterator[RayExecutor]:
    """A RayExecutor connected to `cluster`; at the end the actors a failed test left behind
    (they would hold the nodes' shutdown up) are killed, and it is closed."""
    from corral.exec.ray import RayExecutor

    ray_executor = RayExecutor(cluster.address)
    try:
        yield ray_executor
    finally:
        try:
            kill_named_actors("corral")
        finally:
            ray_executor.close()
