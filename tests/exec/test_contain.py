"""Every process of a local attempt is contained and ended with it (corral/exec/contain.py): with
each mechanism, whatever left the process group (`setsid`, a double fork, torchrun's workers),
however the attempt ended. Also: jobs run as a given account, see only their own GPUs' device
files, and their logs are capped. All with real processes; as root on a machine with cgroups
(CI is), else the tests that need them are skipped with the reason."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from corral.exec import contain, logcap
from corral.exec.local import (
    LOST_REASON,
    AttemptLaunch,
    LocalExecutor,
    RunAs,
    WorkerLaunch,
    free_port,
    worker_envs,
)
from corral.exec.shim import is_alive
from tests.accounts import unix_account
from tests.exec.contain_helpers import (
    ESCAPES,
    MECHANISMS,
    escape,
    job_env,
    job_script,
    marked,
    mechanism_or_skip,
    wait_files,
    wait_until_none,
)
from tests.exec.helpers import PYTHON, make_launch, sh, wait_ended, wait_for_text

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


@pytest.fixture(params=MECHANISMS)
def mechanism(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each mechanism in turn, chosen as an operator would: $CORRAL_CONTAIN, which the shim
    inherits from the executor's environment."""
    monkeypatch.setenv(contain.ENV_MECHANISM, mechanism_or_skip(str(request.param)))
    return str(request.param)


def _kill_shim(attempt_dir: Path) -> None:
    shim = json.loads((attempt_dir / "shim.json").read_text())
    os.kill(shim["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while is_alive(shim["pid"], shim["start_time"]):
        assert time.monotonic() < deadline, "the shim survived SIGKILL"
        time.sleep(0.01)


@pytest.mark.parametrize("end", ["stop", "success", "lost"])
@pytest.mark.parametrize("kind", ESCAPES)
def test_nothing_of_an_attempt_outlives_it(
    mechanism: str,
    kind: str,
    end: str,
    mark: str,
    make_executor: Callable[[], LocalExecutor],
    tmp_path: Path,
) -> None:
    ready = tmp_path / "ready"
    ready.mkdir()
    start_escape, names = escape(kind, tmp_path / "scripts")
    launch = make_launch(
        tmp_path, [sh(job_script(start_escape, names, end))], extra_env=job_env(mark, ready)
    )
    executor = make_executor()
    executor.launch(launch)
    wait_files(ready, names)
    assert marked(mark)  # the escaped processes run
    container = json.loads((launch.attempt_dir / "shim.json").read_text())["container"]
    assert container["mechanism"] == mechanism
    if container["cgroup"] is not None:
        assert Path(container["cgroup"]).is_dir()
    if end == "success":
        (ready / "go").touch()  # the worker exits 0; what it started lives on
    elif end == "stop":  # a cancel or a preemption
        executor.stop("1", 1)
    elif end == "lost":  # the supervisor dies: the executor ends what it left
        _kill_shim(launch.attempt_dir)
    ended = wait_ended(executor, timeout=60)
    # The end is reported once every process of the attempt is gone: no waiting here.
    assert marked(mark) == []
    assert ended.leftover == 0
    if end == "stop":
        assert ended.stopped and ended.reason.startswith("stopped: ")
    elif end == "success":
        assert (ended.exit_code, ended.stopped, ended.reason) == (0, False, "exit code 0")
    else:
        assert ended.reason.startswith(LOST_REASON) and "killed" in ended.reason
    if container["cgroup"] is not None:
        assert not Path(container["cgroup"]).exists()  # removed with the attempt
    if end != "lost":
        result = json.loads((launch.attempt_dir / "result.json").read_text())
        assert result["leftover"] == []


def test_an_unknown_mechanism_is_refused_with_its_name(
    executor: LocalExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(contain.ENV_MECHANISM, "jail")
    executor.launch(make_launch(tmp_path, [sh("echo should not run")]))
    ended = wait_ended(executor)
    assert ended.reason.startswith("cannot contain the attempt: unknown mechanism 'jail'")
    assert not (tmp_path / "jobs" / "1" / "attempt-1" / "rank-0.stdout").exists()


@needs_root
def test_a_process_that_cannot_be_ended_is_reported(
    mark: str, make_executor: Callable[[], LocalExecutor], tmp_path: Path
) -> None:
    # A process frozen by someone else (a v1 freezer cgroup of the test's) cannot die until it
    # is thawed: the stop gives up after end_timeout_s and says so.
    mechanism_or_skip("cgroup2")
    mechanism_or_skip("cgroup1")  # the freezer hierarchy that holds it
    ready = tmp_path / "ready"
    ready.mkdir()
    start_escape, names = escape("setsid", tmp_path / "scripts")
    launch = make_launch(
        tmp_path, [sh(job_script(start_escape, names, "stop"))], extra_env=job_env(mark, ready)
    )
    executor = make_executor()
    executor.containment = "cgroup2"
    executor.end_timeout_s = 1.0
    executor.launch(launch)
    wait_files(ready, names)
    held = int((ready / "setsid").read_text())
    freezer = Path("/sys/fs/cgroup/freezer") / f"corral-test-{mark[:8]}"
    freezer.mkdir()
    try:
        (freezer / "cgroup.procs").write_text(str(held))
        (freezer / "freezer.state").write_text("FROZEN")
        deadline = time.monotonic() + 10
        while (freezer / "freezer.state").read_text().strip() != "FROZEN":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        executor.stop("1", 1)
        ended = wait_ended(executor, timeout=30)
        assert ended.stopped and ended.leftover == 1
        assert ended.reason.endswith("; 1 process(es) could not be ended")
        result = json.loads((launch.attempt_dir / "result.json").read_text())
        assert result["leftover"] == [held]
        assert marked(mark) == [held]
    finally:
        (freezer / "freezer.state").write_text("THAWED")  # the SIGKILL it holds lands now
        wait_until_none(mark)
        freezer.rmdir()


# ---------------------------------------------------------------------------------------------
# Run as a user's account


@pytest.fixture
def account() -> Iterator[RunAs]:
    if os.geteuid() != 0:
        pytest.skip("creating an account needs root")
    if shutil.which("useradd") is None:
        pytest.skip("no useradd here")
    with unix_account("corral-test") as run_as:
        yield run_as


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory that any account can reach (pytest's tmp_path is under a 0700 one)."""
    directory = Path(tempfile.mkdtemp(prefix="corral-run-as-"))
    directory.chmod(0o711)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


RUN_AS_JOB = """\
id -u; id -g; id -G
echo "$HOME $USER $LOGNAME"
touch "$CORRAL_CHECKPOINT_DIR/mine" && echo checkpoint-writable
ls "$ATTEMPT" > /dev/null 2>&1 || echo attempt-dir-not-listable
cat "$ATTEMPT/launch.json" > /dev/null 2>&1 || echo launch-json-unreadable
echo appended >> "$ATTEMPT/rank-0.stdout" && echo own-log-reachable
setsid sleep 600 &
touch "$READY/escaped"
exec sleep 600
"""


def test_a_job_runs_as_its_account_and_its_files_are_its_own(
    account: RunAs, open_dir: Path, mark: str, executor: LocalExecutor
) -> None:
    workdir = open_dir / "work"
    workdir.mkdir(mode=0o755)
    ready = open_dir / "ready"
    ready.mkdir(mode=0o777)
    ready.chmod(0o777)
    attempt_dir = open_dir / "jobs" / "5" / "attempt-1"
    checkpoint = open_dir / "jobs" / "5" / "checkpoint"
    env = worker_envs("5", 1, [0], 1, checkpoint, free_port(), job_env(mark, ready))[0]
    env["ATTEMPT"] = str(attempt_dir)
    launch = AttemptLaunch(
        "5",
        1,
        [WorkerLaunch(0, ["/bin/sh", "-c", RUN_AS_JOB], env)],
        str(workdir),
        signal.SIGTERM,
        0.5,
        attempt_dir,
        checkpoint_dir=checkpoint,
        run_as=account,
    )
    executor.launch(launch)
    wait_files(ready, ["escaped"])
    processes = marked(mark)
    assert len(processes) >= 2  # the job and what it started with setsid
    assert {os.stat(f"/proc/{pid}").st_uid for pid in processes} == {account.uid}
    out = wait_for_text(attempt_dir / "rank-0.stdout", "own-log-reachable")
    lines = out.splitlines()
    assert lines[:3] == [str(account.uid), str(account.gid), str(account.gid)]  # no other group
    assert lines[3] == f"{account.home} {account.user} {account.user}"
    assert lines[4:] == [
        "checkpoint-writable",
        "attempt-dir-not-listable",
        "launch-json-unreadable",
        "appended",
        "own-log-reachable",
    ]
    for name in ("rank-0.stdout", "rank-0.stderr"):
        info = os.stat(attempt_dir / name)
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (account.uid, 0o600), name
    info = os.stat(attempt_dir)
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o711)
    for name in ("launch.json", "shim.json", "workers.json", "shim.log"):
        info = os.stat(attempt_dir / name)
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o600), name
    info = os.stat(checkpoint)
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (
        account.uid,
        account.gid,
        0o700,
    )
    assert os.stat(checkpoint / "mine").st_uid == account.uid
    executor.stop("5", 1)
    ended = wait_ended(executor)
    assert ended.stopped and ended.leftover == 0
    assert marked(mark) == []  # the account's escaped process too
    info = os.stat(attempt_dir / "result.json")
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o600)


def test_without_run_as_the_attempt_dir_is_closed(executor: LocalExecutor, tmp_path: Path) -> None:
    launch = make_launch(tmp_path, [sh("echo hi")])
    executor.launch(launch)
    assert wait_ended(executor).exit_code == 0
    assert stat.S_IMODE(os.stat(launch.attempt_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(launch.attempt_dir / "rank-0.stdout").st_mode) == 0o600


def test_a_checkpoint_dir_that_is_a_link_is_refused_with_run_as(
    account: RunAs, executor: LocalExecutor, tmp_path: Path
) -> None:
    launch = make_launch(tmp_path, [sh("echo hi")])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "link"
    link.symlink_to(elsewhere)
    launch.checkpoint_dir = link
    launch.run_as = account
    with pytest.raises(ValueError, match="is a symbolic link"):
        executor.launch(launch)
    assert os.stat(elsewhere).st_uid == 0  # not handed over through the link
    assert executor.active() == set()


# ---------------------------------------------------------------------------------------------
# GPU device files

OPEN_DEVICES = """\
import errno, os, sys
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_RDWR))
        outcome = "opened"
    except OSError as error:
        outcome = errno.errorcode[error.errno]
    print(os.path.basename(path), outcome)
"""


@pytest.fixture
def device_dir(tmp_path: Path) -> Path:
    """Device files of four GPUs and nvidiactl, for a machine without them (no driver: opening
    one that is allowed fails with ENXIO, one that is denied with EPERM)."""
    why = contain.devices_unavailable()
    if why is not None:
        pytest.skip(why)
    devices = tmp_path / "dev"
    devices.mkdir()
    try:
        for index in range(4):
            os.mknod(devices / f"nvidia{index}", 0o666 | stat.S_IFCHR, os.makedev(195, index))
        os.mknod(devices / "nvidiactl", 0o666 | stat.S_IFCHR, os.makedev(195, 255))
    except OSError as error:
        pytest.skip(f"cannot make device files here: {error}")
    return devices


def _opened(
    executor: LocalExecutor, tmp_path: Path, devices: Path, job_id: str, gpus: list[int] | None
) -> dict[str, str]:
    names = [str(devices / f"nvidia{index}") for index in range(4)] + [str(devices / "nvidiactl")]
    launch = make_launch(tmp_path, [[PYTHON, "-c", OPEN_DEVICES, *names]], job_id=job_id)
    launch.gpu_devices = gpus
    executor.launch(launch)
    ended = wait_ended(executor)
    assert ended.exit_code == 0, ended
    output = (launch.attempt_dir / "rank-0.stdout").read_text()
    return dict(line.split() for line in output.splitlines())


@pytest.mark.parametrize("kill_mechanism", MECHANISMS)
def test_a_job_opens_only_its_own_gpus_device_files(
    kill_mechanism: str,
    device_dir: Path,
    make_executor: Callable[[], LocalExecutor],
    tmp_path: Path,
) -> None:
    executor = make_executor()
    executor.device_dir = device_dir
    executor.containment = mechanism_or_skip(kill_mechanism)
    assert _opened(executor, tmp_path, device_dir, "1", [1]) == {
        "nvidia0": "EPERM",
        "nvidia1": "ENXIO",  # permitted: there is no driver behind it here
        "nvidia2": "EPERM",
        "nvidia3": "EPERM",
        "nvidiactl": "ENXIO",
    }
    shim = json.loads((tmp_path / "jobs" / "1" / "attempt-1" / "shim.json").read_text())
    assert shim["container"]["denied"] == ["c 195:0 rwm", "c 195:2 rwm", "c 195:3 rwm"]
    assert not Path(shim["container"]["devices"]).exists()  # removed with the attempt
    two = _opened(executor, tmp_path, device_dir, "2", [0, 3])
    assert [two[f"nvidia{index}"] for index in range(4)] == ["ENXIO", "EPERM", "EPERM", "ENXIO"]
    unrestricted = _opened(executor, tmp_path, device_dir, "3", None)
    assert set(unrestricted.values()) == {"ENXIO"}


def test_without_gpu_device_files_nothing_is_denied(
    make_executor: Callable[[], LocalExecutor], tmp_path: Path
) -> None:
    executor = make_executor()
    executor.device_dir = tmp_path / "no-devices-here"
    launch = make_launch(tmp_path, [sh("echo hi")])
    launch.gpu_devices = [0]
    executor.launch(launch)
    assert wait_ended(executor).exit_code == 0
    shim = json.loads((launch.attempt_dir / "shim.json").read_text())
    assert (shim["container"]["devices"], shim["container"]["denied"]) == (None, [])


# ---------------------------------------------------------------------------------------------
# Log cap

LINE = b"corral-flood\n"
FLOOD_BYTES = len(LINE) * (32 << 20)  # whole lines, some 416 MiB: 2 s or so of `yes`
CAP = 2 << 20


def test_a_log_flood_is_capped_while_it_floods_and_its_end_is_intact(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    launch = make_launch(tmp_path, [sh(f"yes corral-flood | head -c {FLOOD_BYTES}; echo THE-END")])
    launch.log_cap_bytes = CAP
    executor.launch(launch)
    log = launch.attempt_dir / "rank-0.stdout"
    most = 0
    samples = 0
    deadline = time.monotonic() + 120
    while not (ended := executor.poll()):
        assert time.monotonic() < deadline, "the flood did not end"
        if log.exists():
            most = max(most, os.stat(log).st_blocks * 512)
            samples += 1
        time.sleep(0.002)
    assert ended[0].exit_code == 0
    info = os.stat(log)
    print(f"{samples} samples; at most {most / (1 << 20):.1f} MiB allocated while flooding")
    assert samples > 10
    # A few times the cap, however fast it writes (the margin is for a busy machine, where the
    # shim may wake some tens of milliseconds late).
    assert most <= 8 * CAP
    assert info.st_size == FLOOD_BYTES + len("THE-END\n")  # offsets kept: holes, not moves
    assert info.st_blocks * 512 <= 2 * CAP
    with open(log, "rb") as handle:
        start = logcap.data_start(handle.fileno())
        assert start > 0
        kept = os.pread(handle.fileno(), info.st_size - start, start)
    assert kept.endswith(b"corral-flood\nTHE-END\n")
    lines = kept.split(b"\n")
    # Every line kept is whole, but the first (the cap cuts at a block boundary).
    assert set(lines[1:-2]) == {b"corral-flood"} and lines[-2:] == [b"THE-END", b""]
    assert len(kept) >= CAP // 2


def test_no_cap_when_it_is_zero(executor: LocalExecutor, tmp_path: Path) -> None:
    launch = make_launch(tmp_path, [sh("yes corral-flood | head -c 3000000")])
    launch.log_cap_bytes = 0
    executor.launch(launch)
    assert wait_ended(executor).exit_code == 0
    with open(launch.attempt_dir / "rank-0.stdout", "rb") as handle:
        assert logcap.data_start(handle.fileno()) == 0
        assert os.fstat(handle.fileno()).st_size == 3000000


def test_log_files_are_never_opened_through_a_link(executor: LocalExecutor, tmp_path: Path) -> None:
    launch = make_launch(tmp_path, [sh("echo secret")])
    launch.attempt_dir.mkdir(parents=True)
    target = tmp_path / "elsewhere"
    (launch.attempt_dir / "rank-0.stdout").symlink_to(target)
    executor.launch(launch)
    ended = wait_ended(executor)
    assert ended.reason.startswith("shim error: ") and str(errno.ELOOP) in ended.reason
    assert not target.exists()
