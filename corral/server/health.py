"""The nodes' health checks in the live manager: a site's health-check command (Slurm's
`HealthCheckProgram`) run for each node every `every_s` seconds, and NVML's signals of this
machine's GPUs (corral.exec.nvmlhealth).

The command runs once per node, with the node's name in `CORRAL_NODE` and its GPU count in
`CORRAL_NODE_GPUS`, on the manager's machine (the local executor's declared nodes are all here;
on Ray a site's command reaches the node it names itself, e.g. over ssh: docs/server.md). Exit
code 0 is healthy; anything else (a non-zero exit, a signal, no exit within `timeout_s`, a
command that cannot start) is unhealthy, the reason the first line of its output (stdout and
stderr together), made printable and cut to `REASON_CHARS`. The command is split like a shell
line but run without a shell, in an environment of its own (`PATH`, `HOME`, `LANG` and the two
above: nothing of the manager's, such as a database password, reaches it), in a session of its
own that is killed whole when it is done or late (a check cannot leave processes behind), and
only its first `output_cap` bytes are kept (the rest is read and dropped: a check that floods
its output neither blocks nor fills the manager's memory).

The verdicts go to the manager (`NodeLifecycle.health_verdict`), which records a change only
(a node found unhealthy, one found healthy again) and carries it out through the core
(corral.core.nodes): that is what the simulator replays from an exported trace.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Protocol

from corral.exec.nvmlhealth import NvmlReader, node_verdict
from corral.server.store import StoreUnavailable

log = logging.getLogger("corral.health")

#: The longest reason kept from a check's output.
REASON_CHARS = 200
#: The most checks run at once (one per node).
MAX_PARALLEL = 8


@dataclass(frozen=True, slots=True)
class HealthSettings:
    """`corral up --health-check CMD --health-every-s N --health-timeout-s T --nvml-health`,
    or the cluster config's `health_check:` section."""

    #: The command's words (empty: no command).
    command: tuple[str, ...] = ()
    every_s: float = 30.0
    timeout_s: float = 10.0
    #: Read NVML's signals (XID errors, ECC, retired pages, lost GPUs) of this machine's GPUs.
    nvml: bool = False
    output_cap: int = 4096

    def describe(self) -> str:
        """What is checked and how often, in one line (`corral up`'s banner)."""
        checks = []
        if self.nvml:
            checks.append("NVML (XID errors, uncorrectable ECC, pages to retire, lost GPUs)")
        if self.command:
            checks.append(f"`{shlex.join(self.command)}` (killed after {self.timeout_s:g} s)")
        return f"{' and '.join(checks)}, every {self.every_s:g} s"

    @classmethod
    def parse(
        cls, command: str | None, every_s: float, timeout_s: float, nvml: bool = False
    ) -> HealthSettings:
        """From a command line; ValueError naming what is wrong."""
        words: tuple[str, ...] = ()
        if command is not None:
            try:
                words = tuple(shlex.split(command))
            except ValueError as error:
                raise ValueError(f"health check command: {error}") from None
            if not words:
                raise ValueError("health check command: empty")
        if not 0 < every_s < float("inf"):
            raise ValueError(f"health check every_s: must be a positive number, got {every_s:g}")
        if not 0 < timeout_s < float("inf"):
            raise ValueError(f"health check timeout_s: must be positive, got {timeout_s:g}")
        return cls(words, every_s, timeout_s, nvml)


@dataclass(frozen=True, slots=True)
class CheckResult:
    healthy: bool
    reason: str = ""


def first_line(output: bytes | str) -> str:
    """The first non-empty line, printable characters only, at most `REASON_CHARS`."""
    text = output.decode("utf-8", "replace") if isinstance(output, bytes) else output
    for line in text.splitlines():
        shown = "".join(c if c.isprintable() else " " for c in line)
        shown = " ".join(shown.split())
        if shown:
            return shown if len(shown) <= REASON_CHARS else shown[: REASON_CHARS - 3] + "..."
    return ""


def check_environment(node: str, gpus: int) -> dict[str, str]:
    """The command's whole environment: nothing of the manager's but where to find programs."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/"),
        "LANG": "C.UTF-8",
        "CORRAL_NODE": node,
        "CORRAL_NODE_GPUS": str(gpus),
    }
    return env


def _read_capped(stream: IO[bytes], cap: int, into: bytearray) -> None:
    """Read the stream to its end, keeping its first `cap` bytes."""
    try:
        while chunk := stream.read(65536):
            if len(into) < cap:
                into += chunk[: cap - len(into)]
    except (OSError, ValueError):  # closed under us after a kill
        pass


def _kill_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_check(
    command: tuple[str, ...], node: str, gpus: int, timeout_s: float, cap: int = 4096
) -> CheckResult:
    """Run the command once for the node (see the module): its verdict."""
    try:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=check_environment(node, gpus),
            start_new_session=True,
            close_fds=True,
        )
    except OSError as error:
        return CheckResult(False, first_line(f"health check could not start: {error}"))
    assert process.stdout is not None
    output = bytearray()
    reader = threading.Thread(
        target=_read_capped,
        args=(process.stdout, cap, output),
        name="corral-health-output",
        daemon=True,
    )
    reader.start()
    try:
        code: int | None = process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        code = None
    _kill_session(process.pid)  # late, or left processes behind: none of it stays
    if code is None:
        process.wait()
    reader.join(1.0)
    process.stdout.close()
    reader.join(1.0)
    if code is None:
        return CheckResult(False, f"health check timed out after {timeout_s:g} s")
    if code == 0:
        return CheckResult(True)
    line = first_line(bytes(output))
    if line:
        return CheckResult(False, line)
    if code < 0:
        return CheckResult(False, f"health check killed by signal {-code}")
    return CheckResult(False, f"health check exited {code}")


class HealthTarget(Protocol):
    def health_verdict(self, name: str, healthy: bool, reason: str) -> bool: ...


class HealthMonitor:
    """Runs the checks every `every_s` in a thread of its own and hands each node's verdict to
    the manager. A node is unhealthy when the command or NVML says so (the command's reason
    first)."""

    def __init__(
        self,
        settings: HealthSettings,
        nodes: Callable[[], list[tuple[str, int]]],
        target: HealthTarget,
    ) -> None:
        self.settings = settings
        self.nodes = nodes
        self.target = target
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.nvml: NvmlReader | None = None
        self._nvml_skipped = False
        self.checks = 0  # passes done (tests wait on it)

    def start(self) -> None:
        if self.settings.nvml:
            reader = NvmlReader()
            if reader.open():
                self.nvml = reader
            else:
                log.warning("NVML health checks skipped: %s", reader.unavailable)
        self._thread = threading.Thread(target=self._run, name="corral-health", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:  # a check under way ends by its timeout at the latest
            self._thread.join(self.settings.timeout_s + 5.0)
        if self.nvml is not None:
            self.nvml.close()

    def forget(self, node: str) -> None:
        """An admin resumed the node: the XID errors NVML reported are forgotten."""
        if self.nvml is not None:
            self.nvml.forget()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.check_once()
            except StoreUnavailable as error:  # the manager says so too; the next pass retries
                log.warning("a health check pass was not recorded: %s", error)
            except Exception:
                log.exception("a health check pass failed")
            self._stopping.wait(self.settings.every_s)

    def check_once(self) -> None:
        """One pass over every node."""
        nodes = self.nodes()
        results: dict[str, CheckResult] = {name: CheckResult(True) for name, _ in nodes}
        command = self.settings.command
        if command and nodes:
            with ThreadPoolExecutor(min(MAX_PARALLEL, len(nodes))) as pool:
                futures = {
                    name: pool.submit(
                        run_check,
                        command,
                        name,
                        gpus,
                        self.settings.timeout_s,
                        self.settings.output_cap,
                    )
                    for name, gpus in nodes
                }
                results = {name: future.result() for name, future in futures.items()}
        self._add_nvml(nodes, results)
        for name, _ in nodes:
            if self._stopping.is_set():
                return
            result = results[name]
            self.target.health_verdict(name, result.healthy, result.reason)
        self.checks += 1

    def _add_nvml(self, nodes: list[tuple[str, int]], results: dict[str, CheckResult]) -> None:
        """NVML's verdict on this machine's GPUs: the node's, where the cluster is this one
        node (with several nodes NVML cannot tell which of them this machine's GPUs are)."""
        if self.nvml is None:
            return
        if len(nodes) != 1:
            if not self._nvml_skipped:
                self._nvml_skipped = True
                log.warning("NVML health checks skipped: the cluster has %d nodes", len(nodes))
            return
        name, gpus = nodes[0]
        reason = node_verdict(self.nvml.read(), expected=gpus)
        if reason is not None and results[name].healthy:
            results[name] = CheckResult(False, first_line(f"NVML: {reason}"))
