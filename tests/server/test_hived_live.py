"""`corral up --admission hived` end to end: VCs own cells, idle cells are lent and reclaimed."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.core.admission.hived import HivedScheduler
from corral.server.boot import RunningServer
from tests.server.helpers import (
    TWO_VCS,
    admin_token,
    api,
    job,
    python_job,
    start_server,
    submit,
    train_job,
    wait_for,
)


def hived_server(data_dir: Path) -> RunningServer:
    return start_server(data_dir, gpus=2, config=TWO_VCS, admission="hived")


def clients(server: RunningServer, data_dir: Path) -> tuple[httpx.Client, ...]:
    admin = api(server.url, admin_token(data_dir))
    users = [
        api(server.url, admin.post("/api/v1/tokens", json={"user": u, "vc": vc}).json()["token"])
        for u, vc in (("alice", "a"), ("bob", "b"))
    ]
    return admin, *users


def vc_of(server: RunningServer, job_id: str) -> str:
    scheduler = server.manager.scheduler
    assert isinstance(scheduler, HivedScheduler)
    with server.manager.lock:
        return scheduler.vc_of(job_id)


def resumed_step(data_dir: Path, job_id: str, attempt: int) -> int:
    text = (data_dir / "jobs" / job_id / f"attempt-{attempt}" / "rank-0.stdout").read_text()
    return int(text.split("resumed from step ")[1].split()[0])


def assert_no_gpu_ran_two_attempts_at_once(admin: httpx.Client, job_ids: list[str]) -> None:
    spans: dict[str, list[tuple[float, float]]] = {}
    for job_id in job_ids:
        for attempt in job(admin, job_id)["attempt_history"]:
            for gpu in attempt["gpus"]:
                spans.setdefault(gpu, []).append((attempt["started_at"], attempt["ended_at"]))
    for gpu, intervals in spans.items():
        intervals.sort()
        for (_, end), (start, _) in zip(intervals, intervals[1:], strict=False):
            assert start >= end, f"{gpu}: an attempt started before the previous one ended"


def wait_for_steps(data_dir: Path, job_id: str, steps: int, timeout: float = 60) -> None:
    """Until the job's first attempt has checkpointed `steps` steps (a stop before its signal
    handler is set would kill it with nothing saved)."""
    stdout = data_dir / "jobs" / job_id / "attempt-1" / "rank-0.stdout"
    deadline = time.monotonic() + timeout
    while not (stdout.is_file() and f"step {steps}/" in stdout.read_text()):
        assert time.monotonic() < deadline, f"job {job_id} made no progress"
        time.sleep(0.05)


def wait_until_lent(server: RunningServer, job_id: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while vc_of(server, job_id) != "opportunistic":
        assert time.monotonic() < deadline, f"job {job_id} was never lent b's cell"
        time.sleep(0.05)


def check_reclaimed(
    data_dir: Path, admin: httpx.Client, lent: str, owner_job: str, ended: dict[str, Any]
) -> None:
    """The lent job was preempted for b's job on b's GPU, and resumed from its checkpoint."""
    victim = ended[lent]
    assert (victim["preemptions"], victim["attempts"]) == (1, 2)
    history = job(admin, lent)["attempt_history"]
    assert history[0]["outcome"] == "preempted" and history[1]["outcome"] == "succeeded"
    bobs = job(admin, owner_job)["attempt_history"]
    assert [a["gpus"] for a in bobs] == [history[0]["gpus"]]  # b took back its own cell
    assert bobs[0]["started_at"] >= history[0]["ended_at"]
    assert resumed_step(data_dir, lent, 2) > 0  # resumed, not restarted
    events = [e["message"] for e in job(admin, lent)["events"]]
    assert f"preempted by job {owner_job}" in events


def test_a_lent_cell_is_reclaimed_by_its_vc_and_the_job_resumes(data_dir: Path) -> None:
    server = hived_server(data_dir)
    try:
        admin, alice, bob = clients(server, data_dir)
        first = submit(alice, **train_job("first", steps=40))
        second = submit(alice, **train_job("second", steps=40))
        wait_for(alice, first, ["RUNNING"])
        wait_for(alice, second, ["RUNNING"])
        # VC a owns one 1-GPU cell: its first job runs there, the second on b's idle cell.
        assert vc_of(server, first) == "a"
        assert vc_of(server, second) == "opportunistic"
        wait_for_steps(data_dir, second, 5)  # some steps done, each checkpointed
        mine = submit(bob, **python_job("bob", "import time; time.sleep(0.5)"))
        ids = [first, second, mine]
        ended = {j: wait_for(admin, j) for j in ids}
        assert [e["status"] for e in ended.values()] == ["SUCCEEDED"] * 3
        assert (ended[first]["preemptions"], ended[first]["attempts"]) == (0, 1)
        assert ended[mine]["preemptions"] == 0
        check_reclaimed(data_dir, admin, second, mine, ended)
        assert_no_gpu_ran_two_attempts_at_once(admin, ids)
    finally:
        server.stop()


def test_after_a_restart_cells_are_bound_again_and_a_lent_job_is_still_reclaimed(
    data_dir: Path,
) -> None:
    server = hived_server(data_dir)
    try:
        _, alice, _ = clients(server, data_dir)
        # 10 s of steps: both still run once the restarted server is up, even on a loaded machine
        first = submit(alice, **train_job("first", steps=200))
        second = submit(alice, **train_job("second", steps=200))
        wait_for(alice, first, ["RUNNING"])
        wait_for(alice, second, ["RUNNING"])
        wait_until_lent(server, second)
        wait_for_steps(data_dir, second, 3)
    finally:
        server.stop()  # the jobs keep running under their supervisors
    server = hived_server(data_dir)
    try:
        admin, _, bob = clients(server, data_dir)
        for job_id in (first, second):
            events = [e["message"] for e in job(admin, job_id)["events"]]
            assert "attempt 1 found running" in events, events
        # Found in id order: the first job binds a's cell again on its GPU, the second is lent.
        assert vc_of(server, first) == "a"
        assert vc_of(server, second) == "opportunistic"
        mine = submit(bob, **python_job("bob", "import time; time.sleep(0.5)"))
        ids = [first, second, mine]
        ended = {j: wait_for(admin, j) for j in ids}
        assert [e["status"] for e in ended.values()] == ["SUCCEEDED"] * 3
        # The guaranteed job ran once, through the restart: one attempt, never started again.
        assert (ended[first]["attempts"], ended[first]["preemptions"]) == (1, 0)
        stdout = (data_dir / "jobs" / first / "attempt-1" / "rank-0.stdout").read_text()
        assert stdout.count("starting from step 0") == 1 and "done:" in stdout
        assert not (data_dir / "jobs" / first / "attempt-2").exists()
        check_reclaimed(data_dir, admin, second, mine, ended)
        assert_no_gpu_ran_two_attempts_at_once(admin, ids)
    finally:
        server.stop()


ONE_NODE_NO_VCS = """\
cell_types:
  NODE: {child: gpu, count: 2, node: true}
physical_cells:
  - {type: NODE, count: 1}
"""


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (None, "--admission hived: needs --config FILE whose virtual_clusters give the VCs' cells"),
        (ONE_NODE_NO_VCS, "admission hived: the VCs need guaranteed cells"),
        (
            "admission-typo",
            "--admission: unknown admission 'hive'; choose one of auto, none, quota",
        ),
    ],
)
def test_up_refuses_hived_without_vcs_in_one_line(
    tmp_path: Path, config: str | None, message: str
) -> None:
    from click.testing import CliRunner

    from corral.cli.main import app

    with socket.socket() as probe:  # a port nothing listens on: the refusal must come first
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    args = ["up", "--data-dir", str(tmp_path / "d"), "--gpus", "2", "--port", port]
    args += ["--admission", "hived"]
    if config == "admission-typo":
        args[-1] = "hive"
    elif config is not None:
        path = tmp_path / "cluster.yaml"
        path.write_text(config)
        args += ["--config", str(path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
