"""What root reads cannot be chosen by another account: a data directory, an attempt directory or
a launch.json that another account made first (or could swap) is refused, and nothing runs.

The attack these tests play, with a real unprivileged account: it creates the data directory
before the manager (the docs use one under /tmp), plants `jobs/1/attempt-1/launch.json` with
`run_as: null` (root's own) and keeps swapping it in a loop, hoping that root's supervisor reads
its file instead of the manager's. Root's `corral up`, the executor and the supervisor each
refuse in one line, and the planted command never runs.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from corral.exec import safefs
from corral.exec.local import (
    AttemptLaunch,
    LaunchRefused,
    LocalExecutor,
    RunAs,
    WorkerLaunch,
    kill_attempt,
    own_directory,
)
from corral.exec.shim import process_start_time
from corral.server.boot import BootError, ServerOptions, build_manager
from corral.server.manager import ManagerSettings
from corral.server.state import CacheSettings
from tests.accounts import unix_account
from tests.server.helpers import REPO, wait_until

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None,
    reason="needs root and useradd: the attacker is a real account the test creates",
)

#: The swap loop, run as the attacker with the system's Python (the venv's is under /root): it
#: writes its own launch.json beside the real one and renames it over it, again and again.
SWAP_LOOP = """\
import json, os, sys, time
attempt, evil = sys.argv[1], sys.argv[2]
os.makedirs(attempt, exist_ok=True)
print("swapping", flush=True)
while True:
    tmp = os.path.join(attempt, ".evil.tmp")
    with open(tmp, "w") as out:
        json.dump(json.loads(evil), out)
    try:
        os.replace(tmp, os.path.join(attempt, "launch.json"))
    except OSError:
        pass
    time.sleep(0.002)
"""


@dataclass
class Attacker:
    run_as: RunAs

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv,
            user=self.run_as.uid,
            group=self.run_as.gid,
            extra_groups=[],
            cwd="/",
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )

    def start(self, *argv: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            argv,
            user=self.run_as.uid,
            group=self.run_as.gid,
            extra_groups=[],
            cwd="/",
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )


@pytest.fixture
def mallory() -> Iterator[Attacker]:
    """A real unprivileged account; its processes are ended and it is removed afterwards."""
    with unix_account("crl-mal") as run_as:
        yield Attacker(run_as)


@pytest.fixture
def root_dir() -> Iterator[Path]:
    """A directory of root's that others may pass through (pytest's tmp_path is closed)."""
    directory = Path(tempfile.mkdtemp(prefix="corral-planted-"))
    try:
        directory.chmod(0o711)
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def evil_launch(marker: Path) -> dict[str, object]:
    """A launch.json whose worker, were it run, would leave `marker` behind as root."""
    return {
        "job_id": "1",
        "attempt": 1,
        "workdir": "/",
        "stop_signal": 15,
        "grace_s": 1.0,
        "workers": [{"rank": 0, "argv": ["/bin/sh", "-c", f"id -u > {marker}"], "env": {}}],
        "run_as": None,
        "contain": "subreaper",
        "end_timeout_s": 2.0,
    }


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, 9)
    process.wait(timeout=30)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_root_refuses_a_data_dir_another_account_made_first(
    mallory: Attacker, root_dir: Path
) -> None:
    data_dir = Path("/tmp") / f"corral-planted-{uuid.uuid4().hex[:8]}"
    marker = root_dir / "ran-as-root"
    attempt = data_dir / "jobs" / "1" / "attempt-1"
    swapper: subprocess.Popen[str] | None = None
    manager: subprocess.Popen[str] | None = None
    try:
        # The data dir the docs use, made first by mallory, with her launch.json kept swapped in.
        mallory.run("/bin/mkdir", "-p", "-m", "0777", str(attempt))
        mode = stat.S_IMODE(os.stat(data_dir).st_mode)
        swapper = mallory.start(
            "/usr/bin/python3", "-c", SWAP_LOOP, str(attempt), json.dumps(evil_launch(marker))
        )
        assert swapper.stdout is not None and swapper.stdout.readline() == "swapping\n"
        wait_until(lambda: (attempt / "launch.json").exists(), "the planted launch.json")
        command = [sys.executable, "-m", "corral.cli", "up", "--gpus", "1"]
        command += ["--data-dir", str(data_dir), "--port", str(_free_port())]
        manager = subprocess.Popen(
            command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        # It must refuse; an old manager would start instead and write its token there.
        wait_until(
            lambda: manager.poll() is not None or (data_dir / "admin.token").exists(),
            "corral up to refuse or to start",
            timeout=180,
        )
        assert manager.poll() == 2, "corral up started on a data dir another account made"
        out, err = manager.communicate(timeout=30)
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1, err
        assert f"--data-dir {data_dir}: {data_dir} belongs to {mallory.run_as.user}" in lines[0]
        assert "remove it, or choose another" in lines[0]
        # Nothing of root's was written there, nothing ran, the directory's mode is hers still.
        assert not marker.exists()
        assert sorted(os.listdir(data_dir)) == ["jobs"]
        assert stat.S_IMODE(os.stat(data_dir).st_mode) == mode
    finally:
        if manager is not None and manager.poll() is None:
            manager.kill()
            manager.wait(timeout=30)
        if swapper is not None:
            _stop(swapper)
        for found in data_dir.glob("jobs/*/attempt-*"):
            kill_attempt(found)
        shutil.rmtree(data_dir, ignore_errors=True)


def _run_shim(attempt_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "corral.exec.shim", str(attempt_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _refused_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_the_supervisor_runs_nothing_from_an_attempt_dir_that_is_not_roots(
    mallory: Attacker, root_dir: Path
) -> None:
    """Root's supervisor, given the directories and files an attacker could make, refuses each
    one in one line before it runs anything."""
    marker = root_dir / "ran-as-root"
    evil = json.dumps(evil_launch(marker))
    jobs = root_dir / "jobs"
    jobs.mkdir(mode=0o711)
    jobs.chmod(0o711)
    # Hers: an attempt dir (and its launch.json) that she made, where root's should be.
    hers = jobs / "1"
    hers.mkdir(mode=0o711)
    os.chown(hers, mallory.run_as.uid, mallory.run_as.gid)
    mallory.run("/bin/mkdir", str(hers / "attempt-1"))
    mallory.run("/bin/sh", "-c", f"cat > {hers}/attempt-1/launch.json <<'EOF'\n{evil}\nEOF")
    result = _run_shim(hers / "attempt-1")
    assert result.returncode == 2
    line = _refused_line(result)
    assert line.startswith(f"corral shim: refused {hers / 'attempt-1'}: {hers} belongs to")
    assert "nothing was run" in line
    assert not (hers / "attempt-1" / "result.json").exists()
    # A link in place of the attempt dir, to hers.
    link = jobs / "2"
    link.mkdir(mode=0o711)
    (link / "attempt-1").symlink_to(hers / "attempt-1")
    line = _refused_line(_run_shim(link / "attempt-1"))
    assert f"{link / 'attempt-1'} is a symbolic link: not followed" in line
    # A parent others may write (no sticky bit): she could rename root's attempt dir away.
    open_parent = jobs / "3"
    open_parent.mkdir()
    open_parent.chmod(0o777)
    (open_parent / "attempt-1").mkdir(mode=0o700)
    (open_parent / "attempt-1" / "launch.json").write_text(evil)
    line = _refused_line(_run_shim(open_parent / "attempt-1"))
    assert f"{open_parent} is writable by others (mode 0777) and has no sticky bit" in line
    # In root's own attempt dir: a launch.json that is hers, and one that is a link to hers.
    for number, plant in enumerate(("owned", "link"), start=4):
        attempt = jobs / str(number) / "attempt-1"
        attempt.mkdir(parents=True, mode=0o700)
        attempt.parent.chmod(0o711)
        if plant == "owned":
            (attempt / "launch.json").write_text(evil)
            os.chown(attempt / "launch.json", mallory.run_as.uid, mallory.run_as.gid)
            why = f"{attempt / 'launch.json'} belongs to {mallory.run_as.user}"
        else:
            (attempt / "launch.json").symlink_to(hers / "attempt-1" / "launch.json")
            why = f"{attempt / 'launch.json'} is a symbolic link: not followed"
        result = _run_shim(attempt)
        assert why in _refused_line(result), result.stderr
        ended = json.loads((attempt / "result.json").read_text())
        assert ended["reason"].startswith(f"launch.json refused: {why}"), ended
        assert ended["exit_code"] is None and ended["workers"] == []
    assert not marker.exists(), f"the planted command ran as uid {marker.read_text().strip()}"


def _launch(attempt_dir: Path, marker: Path) -> AttemptLaunch:
    return AttemptLaunch(
        job_id="1",
        attempt=1,
        workers=[WorkerLaunch(0, ["/bin/sh", "-c", f"touch {marker}"], {})],
        workdir="/",
        stop_signal=15,
        grace_s=1.0,
        attempt_dir=attempt_dir,
    )


def test_the_executor_never_writes_into_directories_another_account_made(
    mallory: Attacker, root_dir: Path
) -> None:
    """An attempt dir (or a job dir above it) that exists already and is not the manager's is
    refused, not taken over: mkdir on it must not silently succeed."""
    marker = root_dir / "ran"
    executor = LocalExecutor(containment="subreaper")
    try:
        for planted in ("attempt", "job"):
            base = root_dir / planted
            attempt_dir = base / "jobs" / "1" / "attempt-1"
            attempt_dir.mkdir(parents=True, mode=0o700)
            owned = attempt_dir if planted == "attempt" else attempt_dir.parent
            os.chown(owned, mallory.run_as.uid, mallory.run_as.gid)
            expected = f"^{re.escape(str(owned))} belongs to {mallory.run_as.user}"
            with pytest.raises(safefs.UnsafePath, match=expected):
                executor.launch(_launch(attempt_dir, marker))
            assert os.listdir(attempt_dir) == []
            assert executor.active() == set()
        assert not marker.exists()
    finally:
        executor.close()


def test_the_executor_makes_a_jobs_directories_or_refuses_planted_ones(
    mallory: Attacker, root_dir: Path
) -> None:
    """The job's directory and its work dir are made as the attempt launches (not in the
    manager's round), before the workers start, as the job's account's: one another account
    made first, or a link in the work dir's place, is refused and nothing runs."""
    bob = pwd.getpwnam("nobody")
    bobs = RunAs(bob.pw_name, bob.pw_uid, bob.pw_gid, bob.pw_dir)
    jobs = root_dir / "jobs"
    marker = root_dir / "ran"

    def launch(job: str, command: str) -> AttemptLaunch:
        planned = _launch(jobs / job / "attempt-1", marker)
        planned.job_id, planned.run_as, planned.job_dir = job, bobs, jobs / job
        planned.workdir, planned.own_workdir = str(jobs / job / "work"), True
        planned.workers[0].argv = ["/bin/sh", "-c", command]
        return planned

    executor = LocalExecutor(containment="subreaper")
    try:
        hers = jobs / "1"
        hers.mkdir(parents=True, mode=0o700)
        os.chown(hers, mallory.run_as.uid, mallory.run_as.gid)
        with pytest.raises(LaunchRefused, match=f"^{re.escape(str(hers))} belongs to crl-mal"):
            executor.launch(launch("1", f"touch {marker}"))
        assert os.listdir(hers) == []
        (jobs / "2").mkdir(mode=0o700)
        (jobs / "2" / "work").symlink_to(hers, target_is_directory=True)
        linked = f"^{re.escape(str(jobs / '2' / 'work'))} is a symbolic link: not given to"
        with pytest.raises(LaunchRefused, match=linked):
            executor.launch(launch("2", f"touch {marker}"))
        assert os.stat(hers).st_uid == mallory.run_as.uid and executor.active() == set()
        assert not marker.exists()
        executor.launch(launch("3", "pwd; id -u"))  # made first, then the worker runs in it
        ended = wait_until(executor.poll, "job 3's attempt to end")
        assert [(end.job_id, end.exit_code) for end in ended] == [("3", 0)]
        output = (jobs / "3" / "attempt-1" / "rank-0.stdout").read_text().split()
        assert output == [str(jobs / "3" / "work"), str(bob.pw_uid)]
        for path, owner, mode in [
            (jobs, 0, 0o711),
            (jobs / "3", 0, 0o711),
            (jobs / "3" / "work", bob.pw_uid, 0o700),
        ]:
            info = os.lstat(path)
            assert (path, info.st_uid, stat.S_IMODE(info.st_mode)) == (path, owner, mode)
    finally:
        executor.close()


def test_a_job_directory_another_account_made_first_is_not_handed_over(
    mallory: Attacker, root_dir: Path
) -> None:
    """Under a shared checkpoint root, mallory makes job 7's checkpoint dir before job 7 (bob's)
    starts, with a checkpoint of her choosing in it: the manager refuses it instead of giving
    it (and what she put there) to bob."""
    bob = pwd.getpwnam("nobody")
    bobs = RunAs(bob.pw_name, bob.pw_uid, bob.pw_gid, bob.pw_dir)
    checkpoint = root_dir / "7"
    checkpoint.mkdir()
    (checkpoint / "model.pt").write_text("hers")
    os.chown(checkpoint, mallory.run_as.uid, mallory.run_as.gid)
    expected = f"^{re.escape(str(checkpoint))} belongs to {mallory.run_as.user}"
    with pytest.raises(ValueError, match=expected):
        own_directory(checkpoint, bobs)
    assert os.stat(checkpoint).st_uid == mallory.run_as.uid
    own_directory(root_dir / "8", bobs)  # a new one is made and given to bob
    assert os.stat(root_dir / "8").st_uid == bob.pw_uid
    own_directory(root_dir / "8", bobs)  # and is his again at his next attempt


@pytest.mark.parametrize("flag", ["--data-dir", "--cache-dir", "--checkpoint-root"])
def test_directories_others_may_write_are_refused_at_start(root_dir: Path, flag: str) -> None:
    open_dir = root_dir / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)  # no sticky bit: anyone may rename what root makes there
    data_dir = root_dir / "state" if flag != "--data-dir" else open_dir / "state"
    settings = ManagerSettings()
    if flag == "--cache-dir":
        settings.cache = CacheSettings(1.0, 1.0, "lru", open_dir / "cache")
    elif flag == "--checkpoint-root":
        settings.checkpoint_root = open_dir / "checkpoints"
    with pytest.raises(BootError) as refused:
        build_manager(ServerOptions(data_dir=data_dir, gpus=1, settings=settings))
    message = str(refused.value)
    assert message.startswith(f"{flag} {open_dir}/")
    assert f"{open_dir} is writable by others (mode 0777) and has no sticky bit" in message
    assert "\n" not in message


def test_a_sticky_parent_like_tmp_is_passed_through(root_dir: Path) -> None:
    sticky = root_dir / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    manager = build_manager(ServerOptions(data_dir=sticky / "state", gpus=1, single_user=True))
    manager.stop()
    info = os.stat(sticky / "state")
    assert info.st_uid == 0 and stat.S_IMODE(info.st_mode) & 0o022 == 0
    # A jobs/ tree under it that is not root's is refused at the next start.
    os.chown(sticky / "state", 0, 0)
    (sticky / "state" / "jobs").mkdir()
    (sticky / "state" / "jobs").chmod(0o777)
    with pytest.raises(BootError, match=r"^--data-dir .*/jobs: .*writable by others"):
        build_manager(ServerOptions(data_dir=sticky / "state", gpus=1, single_user=True))


def test_the_manager_kills_nothing_a_planted_record_names(
    mallory: Attacker, root_dir: Path
) -> None:
    """shim.json and workers.json name the processes the manager kills (and the cgroup it
    ends): one that is not the manager's own is ignored, as if missing."""
    victim = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        started = process_start_time(victim.pid)
        attempt = root_dir / "jobs" / "1" / "attempt-1"
        attempt.mkdir(parents=True, mode=0o700)
        record = {"pid": victim.pid, "start_time": started}
        workers = {"pgid": victim.pid, "workers": [{"rank": 0, **record}]}
        (attempt / "shim.json").write_text(json.dumps(record))
        (attempt / "workers.json").write_text(json.dumps(workers))
        for name in ("shim.json", "workers.json"):
            os.chown(attempt / name, mallory.run_as.uid, mallory.run_as.gid)
        assert kill_attempt(attempt) == 0
        assert LocalExecutor().recover("1", 1, attempt) == "never-started"
        assert victim.poll() is None, "a record another account wrote was obeyed"
    finally:
        victim.kill()
        victim.wait(timeout=30)
