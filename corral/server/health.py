"""The nodes' health checks in the live manager: a site's health-check command (Slurm's
`HealthCheckProgram`) and NVML's signals, for each node every `every_s` seconds
(corral.exec.healthcheck says how one check runs and what it decides).

Where a check runs: an executor that can run it on the node itself (`check_node_health`: the
Ray executor, on each Ray node, NVML there too) does; else it runs on the manager's machine, the
local executor's declared nodes all being here, and NVML's verdict on this machine's GPUs is the
node's where the cluster is this one node.

The verdicts go to the manager (`NodeLifecycle.health_verdict`), which records a change only
(a node found unhealthy, one found healthy again) and carries it out through the core
(corral.core.nodes): that is what the simulator replays from an exported trace.
"""

from __future__ import annotations

import logging
import shlex
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from corral.exec.healthcheck import CheckResult, check_node
from corral.exec.nvmlhealth import NvmlReader
from corral.server.store import StoreUnavailable

log = logging.getLogger("corral.health")

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


class HealthTarget(Protocol):
    def health_verdict(self, name: str, healthy: bool, reason: str) -> bool: ...


@runtime_checkable
class NodeChecker(Protocol):
    """An executor that runs a node's check on the node itself (corral.exec.ray)."""

    def check_node_health(
        self,
        node: str,
        gpus: int,
        command: tuple[str, ...],
        timeout_s: float,
        output_cap: int,
        nvml: bool,
    ) -> CheckResult: ...

    def forget_node_health(self, node: str) -> None: ...


class HealthMonitor:
    """Runs the checks every `every_s` in a thread of its own and hands each node's verdict to
    the manager. A node is unhealthy when the command or NVML says so (the command's reason
    first). With a `remote` checker each node's check runs on the node; else here."""

    def __init__(
        self,
        settings: HealthSettings,
        nodes: Callable[[], list[tuple[str, int]]],
        target: HealthTarget,
        remote: NodeChecker | None = None,
    ) -> None:
        self.settings = settings
        self.nodes = nodes
        self.target = target
        self.remote = remote
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.nvml: NvmlReader | None = None
        self._nvml_skipped = False
        self.checks = 0  # passes done (tests wait on it)

    def start(self) -> None:
        if self.settings.nvml and self.remote is None:
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
        if self.remote is not None:
            self.remote.forget_node_health(node)
        elif self.nvml is not None:
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
        """One pass over every node, the nodes checked side by side."""
        nodes = self.nodes()
        results: dict[str, CheckResult] = {}
        if nodes:
            with ThreadPoolExecutor(min(MAX_PARALLEL, len(nodes))) as pool:
                futures = {
                    name: pool.submit(self._check, name, gpus, len(nodes)) for name, gpus in nodes
                }
                results = {name: future.result() for name, future in futures.items()}
        for name, _ in nodes:
            if self._stopping.is_set():
                return
            result = results[name]
            self.target.health_verdict(name, result.healthy, result.reason)
        self.checks += 1

    def _check(self, name: str, gpus: int, nodes: int) -> CheckResult:
        settings = self.settings
        if self.remote is not None:
            return self.remote.check_node_health(
                name, gpus, settings.command, settings.timeout_s, settings.output_cap, settings.nvml
            )
        return check_node(
            settings.command, name, gpus, settings.timeout_s, settings.output_cap, self._nvml(nodes)
        )

    def _nvml(self, nodes: int) -> NvmlReader | None:
        """This machine's NVML, where the cluster is this one node (with several nodes here
        NVML cannot tell which of them this machine's GPUs are)."""
        if self.nvml is not None and nodes != 1:
            if not self._nvml_skipped:
                self._nvml_skipped = True
                log.warning("NVML health checks skipped: the cluster has %d nodes", nodes)
            return None
        return self.nvml
