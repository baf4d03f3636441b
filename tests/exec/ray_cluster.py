"""A real multi-node Ray cluster on this machine (127.0.0.1), for the Ray executor's tests.

Each node is a `ray start --block` process that this module started: stopping it (SIGTERM) makes
Ray stop that node's own daemons, so no broad `ray stop` is needed and nothing else is touched.
Each node declares GPUs and a `corral-node-NAME` resource that names it for corral.

Every process of a node (its Ray daemons, its workers, the jobs they start) inherits
CORRAL_TEST_NODE=NAME: a test sees where a job ran, and `kill_node` kills all of a node's
processes at once, as a machine that dies would lose them.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.netns import only_loopback

RAY = str(Path(sys.executable).with_name("ray"))
READY_LINE = "Ray runtime started"


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


def _environment(node: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "CORRAL_TEST_NODE": node,
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


def processes_of(node: str, jobs: bool) -> list[int]:
    """The pids of the processes that carry CORRAL_TEST_NODE=node in their environment: the
    jobs' (their environment has CORRAL_JOB_ID) or else Ray's own."""
    return [
        pid
        for pid, environ in _environments()
        if f"CORRAL_TEST_NODE={node}".encode() in environ
        and any(item.startswith(b"CORRAL_JOB_ID=") for item in environ) == jobs
    ]


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
    port: int = field(default_factory=_free_port)
    temp_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="corral-ray-")))
    nodes: list[subprocess.Popen[str]] = field(default_factory=list)
    names: list[str] = field(default_factory=list)  # of the nodes, in the same order
    started_in_s: float = 0.0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> None:
        if not only_loopback():
            raise RuntimeError(
                "the Ray tests need a network namespace with only loopback (tests/conftest.py "
                "makes one as root); run pytest as root or under `unshare -rn`"
            )
        began = time.monotonic()
        if self.head is not None:
            self._start_node(self.head, gpus=0, rack=None, head=True, deadline=began + timeout)
        for name in self.node_names:
            head = not self.nodes
            self._start_node(name, self.gpus_per_node, None, head, began + timeout)
        self.started_in_s = time.monotonic() - began

    def add_node(
        self,
        name: str,
        gpus: int | None = None,
        rack: str | None = None,
        named: bool = True,
        timeout: float = 60.0,
        devices: str | None = None,
    ) -> None:
        """A node that joins; `named=False` declares no corral-node resource; `devices` is the
        CUDA_VISIBLE_DEVICES its `ray start` runs with (the machine's GPUs it owns)."""
        gpus = self.gpus_per_node if gpus is None else gpus
        self._start_node(name, gpus, rack, False, time.monotonic() + timeout, named, devices)

    def stop_node(self, name: str) -> None:
        """Stop a node as an operator would (`ray start --block` ended by SIGTERM)."""
        self._stop(self.nodes.pop(self.names.index(name)))
        self.names.remove(name)

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
            argv.append(f'--resources={{"corral-node-{name}": 1}}')
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
        node = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=_environment(name) | ({"CUDA_VISIBLE_DEVICES": devices} if devices else {}),
            start_new_session=True,
        )
        self.nodes.append(node)
        self.names.append(name)
        self._wait_ready(node, deadline)

    def kill_node(self, name: str) -> int:
        """SIGKILL every Ray process of the node (not the head), but not the jobs' processes:
        these must die by themselves (their guard sees its actor die)."""
        killed = 0
        for pid in processes_of(name, jobs=False):
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        return killed

    @staticmethod
    def _wait_ready(node: subprocess.Popen[str], deadline: float) -> None:
        assert node.stdout is not None
        seen: list[str] = []
        while time.monotonic() < deadline:
            line = node.stdout.readline()
            if not line:
                break
            seen.append(line)
            if READY_LINE in line:
                # Keep reading, or a full pipe would one day block the node's process.
                threading.Thread(target=node.stdout.read, daemon=True).start()
                return
        raise RuntimeError("ray node did not start:\n" + "".join(seen[-20:]))

    def stop(self) -> None:
        # Workers before the head, so that no node waits for a vanished head.
        for node in reversed(self.nodes):
            self._stop(node)
        self.nodes.clear()
        self.names.clear()
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    @staticmethod
    def _stop(node: subprocess.Popen[str]) -> None:
        if node.poll() is None:
            node.send_signal(signal.SIGTERM)
        try:
            node.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(node.pid, signal.SIGKILL)
            node.wait()
        if node.stdout is not None:
            node.stdout.close()
