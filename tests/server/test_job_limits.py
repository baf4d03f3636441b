"""A job's limits through the manager: the spec's `memory` and `cpus` and `corral up
--job-pids-max` reach the attempt's cgroups; a job killed at its memory limit fails "out of
memory" in the API, `corral describe` and the retry rule; a fork bomb stops at its cap while the
manager answers; a limit this machine cannot enforce runs with a warning event. Real manager,
real job processes (as root: the limits are cgroups)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from corral.cli.main import app
from corral.cli.up import limits_line
from corral.exec import contain
from corral.exec.local import LocalExecutor
from corral.server import boot
from corral.server.boot import BootError, RunningServer, ServerOptions
from tests.server.helpers import (
    admin_token,
    api,
    job,
    python_job,
    start_server,
    submit,
    wait_for,
    wait_until,
)

#: Allocates (and so touches) 8 MiB after 8 MiB, 512 MiB in all.
HOG = "chunks = [bytearray(8 << 20) for _ in range(64)]\nprint('survived')\n"
OOM_REASON = (
    "out of memory: the kernel killed a process at the attempt's memory limit 64 MiB; "
    "killed by SIGKILL (rank 0)"
)


def enforceable_or_skip(*names: str) -> None:
    missing = contain.limits_unavailable()
    for name in names:
        if name in missing:
            pytest.skip(missing[name])


def test_corral_up_says_what_caps_each_attempt(data_dir: Path) -> None:
    enforceable_or_skip("memory", "cpus", "pids")
    running = start_server(data_dir, gpus=1, job_pids_max=None)
    try:
        assert limits_line(running.manager) == (
            "limits     each attempt: no task limit (--job-pids-max 0), its spec's memory and cpus"
        )
    finally:
        running.stop()


@pytest.fixture
def server(data_dir: Path) -> Iterator[RunningServer]:
    running = start_server(data_dir, gpus=1, job_pids_max=64)
    try:
        yield running
    finally:
        running.stop()


def test_a_job_killed_at_its_memory_limit_fails_out_of_memory_everywhere(
    server: RunningServer, data_dir: Path
) -> None:
    enforceable_or_skip("memory")
    client = api(server.url, admin_token(data_dir))
    job_id = submit(client, **python_job("hog", HOG, memory="64MiB", max_retries=5))
    done = wait_for(client, job_id)
    # Three alike failures in a row, each fast: the retry rule's user error, by its signature.
    assert done["status"] == "FAILED", done
    assert done["reason"] == (
        f"user error: the same failure 3 times in a row, each within 20 s ({OOM_REASON})"
    )
    history = job(client, job_id)["attempt_history"]
    assert [attempt["reason"] for attempt in history] == [OOM_REASON] * 3
    retries = [e["message"] for e in job(client, job_id)["events"] if e["kind"] == "retrying"]
    assert len(retries) == 2 and all(OOM_REASON in message for message in retries)
    env = {"CORRAL_URL": server.url, "CORRAL_TOKEN": admin_token(data_dir)}
    described = CliRunner().invoke(app, ["describe", job_id], env=env)
    assert described.exit_code == 0, described.output
    assert "out of memory: the kernel killed a process" in described.stdout
    launch = json.loads((data_dir / "jobs" / job_id / "attempt-1" / "launch.json").read_text())
    assert launch["limits"] == {"memory_bytes": 64 << 20, "cpus": None, "pids": 64}


FORKER = """\
import os, time
started = refused = 0
for _ in range(256):
    try:
        os.posix_spawn("/bin/sleep", ["sleep", "600"], os.environ)
        started += 1
    except OSError:
        refused += 1
print(f"started {started} refused {refused}", flush=True)
time.sleep(600)
"""


def test_a_fork_bomb_stops_at_the_managers_pids_max_and_the_manager_answers(
    server: RunningServer, data_dir: Path
) -> None:
    enforceable_or_skip("pids")
    client = api(server.url, admin_token(data_dir))
    job_id = submit(client, **python_job("bomb", FORKER, cpus=0.5))
    stdout = data_dir / "jobs" / job_id / "attempt-1" / "rank-0.stdout"
    wait_until(lambda: stdout.is_file() and "refused" in stdout.read_text(), "the forker's tally")
    started, refused = (int(word) for word in stdout.read_text().split()[1::2])
    assert started + 1 <= 64 and refused >= 256 - 64
    shim = json.loads((data_dir / "jobs" / job_id / "attempt-1" / "shim.json").read_text())
    record = shim["container"]
    assert record["limits"] == {"memory_bytes": None, "cpus": 0.5, "pids": 64}
    assert int(Path(record["limit_cgroups"]["pids"], "pids.current").read_text()) <= 64
    # The manager, and the machine, carry on: the API answers, a process can be started.
    assert client.get("/api/v1/jobs").status_code == 200
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    assert client.post(f"/api/v1/jobs/{job_id}/cancel").json()["status"] == "CANCELLED"
    wait_until(
        lambda: job(client, job_id)["attempt_history"][0]["state"] == "ended", "the attempt's end"
    )
    assert not any(Path(path).exists() for path in record["limit_cgroups"].values())
    assert not [
        pid
        for pid in os.listdir("/proc")
        if pid.isdigit() and _environ_has(int(pid), f"CORRAL_CONTAINER={record['name']}")
    ]


def _environ_has(pid: int, item: str) -> bool:
    try:
        return item.encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def test_a_limit_this_machine_cannot_enforce_runs_with_a_warning_event(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As on a machine without the memory controller (the probe's answer, as the executor gives
    # it): the job runs, and its events say what it runs without.
    why = "memory: no writable cgroup v1 memory hierarchy"
    monkeypatch.setattr(LocalExecutor, "unenforced_limits", lambda self: {"memory": why})
    running = start_server(data_dir, gpus=1, job_pids_max=100)
    try:
        assert limits_line(running.manager) == (  # what `corral up` says once at its start
            "limits     each attempt: at most 100 tasks, its spec's memory and cpus; "
            "unavailable here: memory (no writable cgroup v1 memory hierarchy)"
        )
        client = api(running.url, admin_token(data_dir))
        limited = submit(client, **python_job("limited", "pass", memory="1GiB", cpus=2))
        plain = submit(client, **python_job("plain", "pass"))
        assert wait_for(client, limited)["status"] == "SUCCEEDED"
        assert wait_for(client, plain)["status"] == "SUCCEEDED"
        events = [(e["kind"], e["message"]) for e in job(client, limited)["events"]]
        assert ("limits", f"attempt 1 runs without: {why}") in events
        assert "limits" not in [e["kind"] for e in job(client, plain)["events"]]
    finally:
        running.stop()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("memory", "16G", "memory: must be a size such as 8GiB or 512MiB"),
        ("memory", 0, "memory: must be at least 1MiB"),
        ("cpus", "4", "cpus: must be a number of CPUs such as 4 or 0.5 (got '4')"),
        ("cpus", 0.001, "cpus: must be at least 0.01 (got 0.001)"),
    ],
)
def test_a_bad_limit_is_refused_with_422_naming_its_field(
    server: RunningServer, data_dir: Path, field: str, value: object, message: str
) -> None:
    client = api(server.url, admin_token(data_dir))
    response = client.post("/api/v1/jobs", json=python_job("bad", "pass", **{field: value}))
    assert response.status_code == 422
    assert response.json()["detail"].startswith(message)
    assert client.get("/api/v1/jobs").json() == []


def test_the_default_pids_max_is_a_quarter_of_pid_max_at_most(tmp_path: Path) -> None:
    small = tmp_path / "pid_max"
    small.write_text("4096\n")
    assert contain.default_pids_max(small) == 1024
    small.write_text("4194304\n")
    assert contain.default_pids_max(small) == contain.DEFAULT_PIDS_MAX == 8192
    assert contain.default_pids_max(tmp_path / "none") == 8192
    real = int(Path("/proc/sys/kernel/pid_max").read_text())
    assert contain.default_pids_max() == min(8192, real // 4)


@pytest.mark.parametrize(
    ("given", "settled"), [([], contain.default_pids_max()), (["--job-pids-max", "500"], 500)]
)
def test_corral_up_hands_its_job_pids_max_to_the_manager(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: list[str], settled: int
) -> None:
    seen: list[int | None] = []

    def build_manager(options: ServerOptions) -> None:
        seen.append(options.settings.job_pids_max)
        raise BootError("stopped here by the test")

    monkeypatch.setattr(boot, "build_manager", build_manager)
    result = CliRunner().invoke(
        app, ["up", "--data-dir", str(tmp_path / "d"), "--gpus", "1", *given]
    )
    assert "stopped here by the test" in result.output
    assert seen == [settled]


def test_a_negative_job_pids_max_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["up", "--data-dir", str(tmp_path / "d"), "--gpus", "1", "--job-pids-max", "-1"]
    )
    assert result.exit_code == 2
    assert "Invalid value for '--job-pids-max'" in result.output
    assert "Traceback" not in result.output
