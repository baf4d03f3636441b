"""One node's health check, where the node is: a site's health-check command (Slurm's
`HealthCheckProgram`) and NVML's signals of the node's GPUs (corral.exec.nvmlhealth). The
manager's HealthMonitor (corral.server.health) runs it on its own machine for the local
executor's nodes, and the Ray executor runs it on each Ray node (corral.exec.ray).

The command runs with the node's name in `CORRAL_NODE` and its GPU count in `CORRAL_NODE_GPUS`.
Exit code 0 is healthy; anything else (a non-zero exit, a signal, no exit within `timeout_s`, a
command that cannot start) is unhealthy, the reason the first line of its output (stdout and
stderr together), made printable and cut to `REASON_CHARS`. The command is split like a shell
line but run without a shell, in an environment of its own (`PATH`, `HOME`, `LANG` and the two
above: nothing of the manager's, such as a database password, reaches it), in a session of its
own that is killed whole when it is done or late (a check cannot leave processes behind), and
only its first `output_cap` bytes are kept (the rest is read and dropped: a check that floods
its output neither blocks nor fills the manager's memory).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from dataclasses import dataclass
from typing import IO

from corral.exec.nvmlhealth import NvmlReader, node_verdict

#: The longest reason kept from a check's output.
REASON_CHARS = 200


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


def check_node(
    command: tuple[str, ...],
    node: str,
    gpus: int,
    timeout_s: float,
    cap: int,
    nvml: NvmlReader | None,
) -> CheckResult:
    """The node's verdict: its command's (if any), else NVML's on the GPUs `nvml` reads (if
    any), else healthy."""
    result = run_check(command, node, gpus, timeout_s, cap) if command else CheckResult(True)
    if result.healthy and nvml is not None:
        reason = node_verdict(nvml.read(), expected=gpus)
        if reason is not None:
            return CheckResult(False, first_line(f"NVML: {reason}"))
    return result
