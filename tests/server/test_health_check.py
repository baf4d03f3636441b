"""One run of a site's health-check command (corral.exec.healthcheck.run_check), with real
processes: its verdict and reason, and the bounds that keep a check from hanging or flooding the
manager or reading its secrets; and a pass of the monitor with NVML's verdict."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from corral.exec.healthcheck import REASON_CHARS, CheckResult, first_line, run_check
from corral.exec.nvmlhealth import GpuSignals
from corral.server.health import HealthMonitor, HealthSettings


def py(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)


def test_exit_0_is_healthy_and_anything_else_names_its_first_line() -> None:
    assert run_check(py("print('all fine')"), "n0", 2, 10.0) == CheckResult(True)
    failed = run_check(
        py("print('\\n  ECC\\tdouble bit \\x1b[31m\\nmore'); exit(3)"), "n0", 2, 10.0
    )
    assert failed == CheckResult(False, "ECC double bit [31m")  # control characters made spaces
    assert run_check(py("exit(4)"), "n0", 2, 10.0) == CheckResult(False, "health check exited 4")
    killed = run_check(py("import os; os.kill(os.getpid(), 9)"), "n0", 2, 10.0)
    assert killed == CheckResult(False, "health check killed by signal 9")
    missing = run_check(("/no/such/check",), "n0", 2, 10.0)
    assert not missing.healthy and missing.reason.startswith("health check could not start")


def test_the_check_sees_its_node_and_nothing_of_the_managers_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PGPASSWORD", "secret")
    monkeypatch.setenv("CORRAL_TOKEN", "secret")
    code = "import os, sys; print(sorted(os.environ), os.environ['CORRAL_NODE'], os.environ['CORRAL_NODE_GPUS']); exit(1)"
    seen = run_check(py(code), "gpu-07", 8, 10.0)
    assert seen.reason == (
        "['CORRAL_NODE', 'CORRAL_NODE_GPUS', 'HOME', 'LANG', 'PATH'] gpu-07 8"
    ), seen


def test_a_check_that_hangs_is_killed_with_what_it_started(tmp_path: Path) -> None:
    pid_file = tmp_path / "child"
    code = (
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(600)\n"
    )
    began = time.monotonic()
    result = run_check(py(code), "n0", 1, 1.5)
    assert result == CheckResult(False, "health check timed out after 1.5 s")
    assert time.monotonic() - began < 30
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # killed with its session (reaped by init)
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        if Path(f"/proc/{child}/stat").read_text().split()[2] == "Z":
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the check's child {child} outlived it")


def test_a_check_that_floods_its_output_is_read_to_its_end_keeping_only_the_cap() -> None:
    code = "import sys\nfor _ in range(20000): sys.stdout.write('x' * 999 + '\\n')\nexit(1)"
    result = run_check(py(code), "n0", 1, 60.0, cap=4096)  # 20 MB written, 4 KiB kept
    assert not result.healthy and len(result.reason) == REASON_CHARS
    assert result.reason.endswith("...")


def test_first_line_takes_the_first_non_empty_line_cut_to_its_bound() -> None:
    assert first_line(b"\n \n  a  b \nc") == "a b"
    assert first_line(b"\xff\xfeoops") == "\ufffd\ufffdoops"
    assert len(first_line("y" * 1000)) == REASON_CHARS


def test_health_settings_refuse_what_cannot_run() -> None:
    assert HealthSettings.parse("check --all 'a b'", 5, 2).command == ("check", "--all", "a b")
    for command, every, timeout, message in (
        ("check 'open", 5, 2, "health check command: No closing quotation"),
        ("  ", 5, 2, "health check command: empty"),
        ("check", 0, 2, "every_s: must be a positive number"),
        ("check", 5, -1, "timeout_s: must be positive"),
    ):
        with pytest.raises(ValueError, match=message):
            HealthSettings.parse(command, every, timeout)


def test_the_banner_line_says_what_is_checked_and_how_often() -> None:
    assert HealthSettings.parse("check --all 'a b'", 5, 2).describe() == (
        "`check --all 'a b'` (killed after 2 s), every 5 s"
    )
    assert HealthSettings.parse(None, 30, 10, nvml=True).describe() == (
        "NVML (XID errors, uncorrectable ECC, pages to retire, lost GPUs), every 30 s"
    )
    both = HealthSettings.parse("check", 30, 10, nvml=True).describe()
    assert both.startswith("NVML (") and " and `check` (killed after 10 s), every 30 s" in both


class Verdicts:
    def __init__(self) -> None:
        self.seen: list[tuple[str, bool, str]] = []

    def health_verdict(self, name: str, healthy: bool, reason: str) -> bool:
        self.seen.append((name, healthy, reason))
        return True


class FakeNvml:
    def __init__(self, gpus: list[GpuSignals]) -> None:
        self.gpus = gpus

    def read(self) -> list[GpuSignals]:
        return self.gpus


def test_a_pass_gives_each_node_its_verdict_the_commands_reason_before_nvmls() -> None:
    target = Verdicts()
    settings = HealthSettings.parse(f"{sys.executable} -c 'exit(0)'", 30, 10, nvml=True)
    monitor = HealthMonitor(settings, lambda: [("local", 2)], target)
    monitor.nvml = FakeNvml([GpuSignals(0), GpuSignals(1, xids=(79,))])  # type: ignore[assignment]
    monitor.check_once()
    assert target.seen == [("local", False, "NVML: GPU 1 XID 79 (GPU has fallen off the bus)")]
    monitor.nvml = FakeNvml([GpuSignals(0)])  # type: ignore[assignment]
    monitor.check_once()  # one GPU of the two: the other is lost
    assert target.seen[-1] == (
        "local",
        False,
        "NVML: NVML sees 1 of the node's 2 GPUs: the others are lost",
    )
    monitor.nvml = FakeNvml([GpuSignals(0), GpuSignals(1)])  # type: ignore[assignment]
    monitor.check_once()
    assert target.seen[-1] == ("local", True, "")
    # With several nodes NVML cannot tell which this machine's GPUs are: only the command.
    two = HealthMonitor(settings, lambda: [("n0", 1), ("n1", 1)], target)
    two.nvml = FakeNvml([GpuSignals(0, lost=True)])  # type: ignore[assignment]
    two.check_once()
    assert target.seen[-2:] == [("n0", True, ""), ("n1", True, "")]
