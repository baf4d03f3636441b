"""A real two-node Ray cluster on this machine, for the Ray executor's tests.

Each node is a `ray start --block` process that this module started: stopping it (SIGTERM) makes
Ray stop that node's own daemons, so no broad `ray stop` is needed and nothing else is touched.
Each node declares GPUs and a `corral-node-NAME` resource that names it for corral.
"""

from __future__ import annotations

import os
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

RAY = str(Path(sys.executable).with_name("ray"))
READY_LINE = "Ray runtime started"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "RAY_USAGE_STATS_ENABLED": "0",
            # The memory monitor polls /proc often: wasted CPU on a 2-core machine.
            "RAY_memory_monitor_refresh_ms": "0",
        }
    )
    return env


@dataclass(slots=True)
class RayCluster:
    gpus_per_node: int = 2
    node_names: tuple[str, ...] = ("a", "b")
    port: int = field(default_factory=_free_port)
    temp_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="corral-ray-")))
    nodes: list[subprocess.Popen[str]] = field(default_factory=list)
    started_in_s: float = 0.0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> None:
        began = time.monotonic()
        for index, name in enumerate(self.node_names):
            argv = [
                RAY,
                "start",
                "--block",
                "--node-ip-address=127.0.0.1",
                "--num-cpus=1",
                f"--num-gpus={self.gpus_per_node}",
                f'--resources={{"corral-node-{name}": 1}}',
                "--object-store-memory=100000000",
                "--disable-usage-stats",
            ]
            if index == 0:
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
                env=_environment(),
                start_new_session=True,
            )
            self.nodes.append(node)
            self._wait_ready(node, began + timeout)
        self.started_in_s = time.monotonic() - began

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
            if node.poll() is None:
                node.send_signal(signal.SIGTERM)
            try:
                node.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(node.pid, signal.SIGKILL)
                node.wait()
            if node.stdout is not None:
                node.stdout.close()
        self.nodes.clear()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
