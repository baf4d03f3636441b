"""Each attempt's container caps what its processes use together (corral/exec/contain.py,
`Limits`): its tasks (pids.max: a job that forks without bound stops at its own cap), its memory
(the kernel kills at the limit, and the attempt's reason says so) and its CPU time. With real
processes under the real shim, as root, with each mechanism; the fork bomb runs as a real Unix
account. The cgroup v2 controllers are tested where this machine's unified hierarchy has them,
and skipped, saying why, where it does not (a hybrid machine keeps them in v1)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.exec import contain
from corral.exec.local import LocalExecutor, RunAs, kill_attempt
from tests.accounts import unix_account
from tests.exec.contain_helpers import MARK, job_env, marked, mechanism_or_skip, wait_until_none
from tests.exec.helpers import PYTHON, make_launch, sh, wait_ended, wait_for_text

CONTROLLERS = ("memory", "cpu", "pids")
#: cgroup2-v2: the cgroup2 mechanism with the limits in the v2 hierarchy itself (skipped where
#: it lacks the controllers); cgroup2 alone may put them in v1 (a hybrid machine).
LIMIT_MECHANISMS = ("cgroup2", "cgroup1", "subreaper", "cgroup2-v2")


def v2_controllers_or_skip() -> None:
    """Skip unless the writable cgroup v2 hierarchy offers memory, cpu and pids."""
    why = contain.unavailable("cgroup2")
    if why is not None:
        pytest.skip(f"cgroup2: {why}")
    hierarchy = contain._hierarchy("")
    assert hierarchy is not None
    offered = (hierarchy.mount / "cgroup.controllers").read_text().split()
    missing = [name for name in CONTROLLERS if name not in offered]
    if missing:
        pytest.skip(
            f"the cgroup v2 hierarchy at {hierarchy.mount} offers {' '.join(offered) or 'none'}, "
            f"not {' '.join(missing)} (bound to v1 hierarchies on this hybrid machine)"
        )


@pytest.fixture(params=LIMIT_MECHANISMS)
def mechanism(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each mechanism in turn, as an operator picks it ($CORRAL_CONTAIN)."""
    name = str(request.param)
    if name == "cgroup2-v2":
        v2_controllers_or_skip()
        name = "cgroup2"
    if os.geteuid() != 0:
        pytest.skip("limits are cgroups: they need root")
    monkeypatch.setenv(contain.ENV_MECHANISM, mechanism_or_skip(name))
    return str(request.param)


def in_v2(mechanism: str, controller: str) -> bool:
    """Whether the limit of `controller` belongs in the container's own v2 cgroup."""
    if not mechanism.startswith("cgroup2"):
        return False
    hierarchy = contain._hierarchy("")
    assert hierarchy is not None
    return controller in (hierarchy.mount / "cgroup.controllers").read_text().split()


def container_of(attempt_dir: Path) -> dict[str, Any]:
    record = json.loads((attempt_dir / "shim.json").read_text())["container"]
    assert isinstance(record, dict)
    return record


def limit_cgroup(record: dict[str, Any], name: str, mechanism: str) -> Path:
    """The cgroup that holds limit `name`, checked to be where it belongs."""
    assert record.get("unenforced") == {}, record
    cgroups = record.get("limit_cgroups") or {}
    assert name in cgroups, f"no cgroup holds the {name} limit: {record}"
    path = Path(cgroups[name])
    controller = contain.LIMIT_CONTROLLERS[name]
    if in_v2(mechanism, controller):
        assert path == Path(record["cgroup"])
    else:
        hierarchy = contain._hierarchy(controller)
        assert hierarchy is not None and path.parent.parent == hierarchy.mount
    return path


def assert_removed(record: dict[str, Any]) -> None:
    paths = [record["cgroup"], *(record.get("limit_cgroups") or {}).values()]
    left = [path for path in paths if path is not None and Path(path).exists()]
    assert left == [], f"cgroups left behind: {left}"


# ---------------------------------------------------------------------------------------------
# Tasks


@pytest.fixture
def account() -> Iterator[RunAs]:
    if shutil.which("useradd") is None:
        pytest.skip("no useradd here")
    with unix_account("corral-lim") as run_as:
        yield run_as


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory any account may pass through (pytest's tmp_path is under a 0700 one); what
    the attempts in it left is ended afterwards."""
    directory = Path(tempfile.mkdtemp(prefix="corral-limits-"))
    directory.chmod(0o711)
    try:
        yield directory
    finally:
        for attempt_dir in directory.rglob("attempt-*"):
            kill_attempt(attempt_dir)
        shutil.rmtree(directory, ignore_errors=True)


#: Starts `sleep` after `sleep` (each a task of its own), TRIES times whatever fails, says how
#: many started and how many the kernel refused, and stays. Unbounded, it would take the host's
#: pids; bounded at TRIES (four times the cap), it fails safely where no cap holds it.
FORKER = """\
import os, sys, time
started = refused = 0
for _ in range(int(sys.argv[1])):
    try:
        os.posix_spawn("/bin/sleep", ["sleep", "600"], os.environ)
        started += 1
    except OSError:
        refused += 1
print(f"started {started} refused {refused}", flush=True)
time.sleep(600)
"""
PIDS_MAX = 64
SYSTEM_PYTHON = "/usr/bin/python3"  # the venv's lies under root's home, closed to accounts


def test_a_job_that_forks_without_bound_stops_at_its_pids_max(
    mechanism: str,
    account: RunAs,
    open_dir: Path,
    mark: str,
    make_executor: Callable[[], LocalExecutor],
) -> None:
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"no {SYSTEM_PYTHON} for the account to run")
    launch = make_launch(
        open_dir,
        [[SYSTEM_PYTHON, "-c", FORKER, str(4 * PIDS_MAX)]],
        extra_env=job_env(mark, open_dir),
    )
    launch.run_as = account
    launch.pids_max = PIDS_MAX
    executor = make_executor()
    executor.launch(launch)
    out = wait_for_text(launch.attempt_dir / "rank-0.stdout", "refused")
    started, refused = (int(word) for word in out.split()[1::2])
    tasks = marked(mark)
    assert {os.stat(f"/proc/{pid}").st_uid for pid in tasks} == {account.uid}
    # The forker itself and what it started: never more than the cap, and it was refused more.
    assert started + 1 <= PIDS_MAX and len(tasks) <= PIDS_MAX, (started, len(tasks))
    assert refused >= 4 * PIDS_MAX - PIDS_MAX
    record = container_of(launch.attempt_dir)
    cgroup = limit_cgroup(record, "pids", mechanism)
    assert int((cgroup / "pids.max").read_text()) == PIDS_MAX
    assert int((cgroup / "pids.current").read_text()) <= PIDS_MAX
    # The manager's side and the host fork as ever; the attempt still ends as asked.
    subprocess.run(["true"], check=True)
    assert executor.poll() == []
    executor.stop(launch.job_id, launch.attempt)
    ended = wait_ended(executor)
    assert ended.stopped and ended.leftover == 0
    assert marked(mark) == []
    assert_removed(record)


def test_a_lost_attempts_limit_cgroups_are_ended_and_removed(
    mechanism: str, mark: str, make_executor: Callable[[], LocalExecutor], tmp_path: Path
) -> None:
    # The shim dies (SIGKILL): the executor ends what it recorded, the limits' cgroups too.
    script = 'setsid sleep 600 & echo $! > "$READY/escaped"; exec sleep 600'
    launch = make_launch(tmp_path, [sh(script)], extra_env=job_env(mark, tmp_path))
    launch.pids_max, launch.memory_bytes, launch.cpus = PIDS_MAX, 256 << 20, 1.0
    executor = make_executor()
    executor.launch(launch)
    wait_for_text(tmp_path / "escaped", "\n")
    record = container_of(launch.attempt_dir)
    for name in ("pids", "memory", "cpus"):
        limit_cgroup(record, name, mechanism)
    shim = json.loads((launch.attempt_dir / "shim.json").read_text())
    os.kill(shim["pid"], 9)
    ended = wait_ended(executor)
    assert ended.reason.startswith("lost") and ended.leftover == 0, ended
    assert marked(mark) == []
    assert_removed(record)


# ---------------------------------------------------------------------------------------------
# Memory

#: Allocates (and so touches) 8 MiB after 8 MiB, 512 MiB in all.
HOG = """\
chunks = []
for _ in range(64):
    chunks.append(bytearray(8 << 20))
print("survived", flush=True)
"""


def test_a_job_beyond_its_memory_is_killed_and_its_reason_says_out_of_memory(
    mechanism: str, executor: LocalExecutor, tmp_path: Path
) -> None:
    launch = make_launch(tmp_path, [[PYTHON, "-c", HOG]])
    launch.memory_bytes = 64 << 20
    executor.launch(launch)
    ended = wait_ended(executor)
    record = container_of(launch.attempt_dir)
    assert ended.reason == (
        "out of memory: the kernel killed a process at the attempt's memory limit 64 MiB; "
        "killed by SIGKILL (rank 0)"
    ), (ended, record)
    assert (ended.exit_code, ended.signal, ended.stopped, ended.leftover) == (None, 9, False, 0)
    assert "survived" not in (launch.attempt_dir / "rank-0.stdout").read_text()
    assert record["limits"]["memory_bytes"] == 64 << 20
    limit_cgroup(record, "memory", mechanism)
    assert_removed(record)


def test_the_workers_limits_add_up_in_their_attempts_container(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    # Two workers of 48 MiB share one container of 96 MiB: one that takes 64 MiB lives.
    if contain.limits_unavailable().get("memory"):
        pytest.skip(contain.limits_unavailable()["memory"])
    take = "import sys; held = bytearray(int(sys.argv[1]) << 20); print('held', flush=True)"
    launch = make_launch(tmp_path, [[PYTHON, "-c", take, "64"], [PYTHON, "-c", take, "1"]])
    launch.memory_bytes = 48 << 20
    launch.cpus = 0.25
    executor.launch(launch)
    ended = wait_ended(executor)
    assert (ended.exit_code, ended.reason) == (0, "exit code 0")
    limits = json.loads((launch.attempt_dir / "launch.json").read_text())["limits"]
    assert limits == {"memory_bytes": 96 << 20, "cpus": 0.5, "pids": None}


# ---------------------------------------------------------------------------------------------
# CPU

#: Two processes that spin, at nice -10 (the test runs as root).
SPIN = ["nice", "-n", "-10", "/bin/sh", "-c", "spin() { while :; do :; done; }; spin & spin & wait"]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> float:
    """The CPU time the processes used so far (their threads' included)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / CLOCK_TICKS


def cpu_stat(cgroup: Path) -> dict[str, int]:
    lines = (cgroup / "cpu.stat").read_text().splitlines()
    return {key: int(value) for key, value in (line.split() for line in lines)}


def test_a_busy_job_uses_at_most_its_cpus(
    mechanism: str, executor: LocalExecutor, tmp_path: Path, mark: str
) -> None:
    launch = make_launch(tmp_path, [SPIN], extra_env=job_env(mark, tmp_path))
    launch.cpus = 0.5
    executor.launch(launch)
    deadline = time.monotonic() + 60
    while len([pid for pid in marked(mark) if cpu_seconds([pid]) > 0]) < 2:
        assert time.monotonic() < deadline, "the spinners did not start"
        time.sleep(0.05)
    spinners = marked(mark)  # the shell and its two spinning subshells
    # Without a quota they must take well over half a CPU, also on a machine that others keep
    # busy: where the kernel shares the CPUs between sessions (autogroups) whatever a process's
    # nice, the job's session (the shim's) gets the weight of nice -10 too. (A task in a cpu
    # cgroup of its own, as the job is under a quota, is not in an autogroup at all.)
    for pid in spinners:
        try:
            Path(f"/proc/{pid}/autogroup").write_text("-10")
        except OSError:  # no autogroups here: the processes' nice is what counts
            pass
    # Over a wall interval long enough for 1.5 CPU seconds at the cap (3 s), on any machine:
    # the cap can only be slower on a loaded one, never faster.
    used_before, began = cpu_seconds(spinners), time.monotonic()
    while (used := cpu_seconds(spinners) - used_before) < 1.5:
        assert time.monotonic() - began < 120, f"only {used:.2f} CPU s in 120 s"
        time.sleep(0.05)
    rate = used / (time.monotonic() - began)
    assert rate <= 0.5 * 1.25, f"{rate:.2f} CPUs for a cap of 0.5"
    record = container_of(launch.attempt_dir)
    cgroup = limit_cgroup(record, "cpus", mechanism)
    if in_v2(mechanism, "cpu"):
        assert (cgroup / "cpu.max").read_text().split() == ["50000", "100000"]
    else:
        assert int((cgroup / "cpu.cfs_quota_us").read_text()) == 50_000
        assert int((cgroup / "cpu.cfs_period_us").read_text()) == 100_000
    # The kernel ran its bandwidth timer for the group (only a quota starts it): the cap was
    # in force all along, also where a loaded machine gave the job less than the cap anyway.
    assert cpu_stat(cgroup)["nr_periods"] >= 10
    executor.stop(launch.job_id, launch.attempt)
    assert wait_ended(executor).stopped
    wait_until_none(mark)
    assert_removed(record)


# ---------------------------------------------------------------------------------------------
# On a Ray node: the guard gives each worker's container the same limits


def run_guard(
    tmp_path: Path, limits: list[str], *argv: str, mark: str = ""
) -> tuple[int, str, dict[str, Any]]:
    """The guard (as a Ray worker's actor starts it) with `limits`, its command's processes
    marked with `mark`; its returncode, its output and its report."""
    report = tmp_path / "guard.json"
    command = [
        PYTHON,
        "-m",
        "corral.exec.guard",
        str(os.getpid()),
        "--name",
        "limits-test",
        "--report",
        str(report),
        *limits,
        "--",
        *argv,
    ]
    env = {**os.environ, MARK: mark}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    return done.returncode, done.stdout + done.stderr, json.loads(report.read_text())


def test_the_guard_kills_at_the_memory_limit_and_reports_it(mechanism: str, tmp_path: Path) -> None:
    code, output, report = run_guard(tmp_path, ["--memory", str(64 << 20)], PYTHON, "-c", HOG)
    assert (code, report["oom_kills"], report["leftover"]) == (-9, 1, []), output
    assert "survived" not in output


def test_the_guard_caps_the_tasks_of_its_worker(mechanism: str, tmp_path: Path, mark: str) -> None:
    # The forker says what it could start and exits; the guard ends its sleepers with it.
    forker = FORKER.replace("time.sleep(600)", "")
    code, output, report = run_guard(
        tmp_path, ["--pids-max", str(PIDS_MAX)], PYTHON, "-c", forker, str(4 * PIDS_MAX), mark=mark
    )
    started, refused = (int(word) for word in output.split()[1:4:2])
    assert code == 0 and report["leftover"] == [], output
    assert started + 1 <= PIDS_MAX and refused >= 3 * PIDS_MAX, output
    assert marked(mark) == []
