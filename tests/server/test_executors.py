"""Executors come from a registry: one registered by this test module alone runs under `corral
up` with its generated flag; the inert executor ends each attempt at its time limit, exit 0, on
the manager's clock (in-process, then under a real `corral up`), and ends it at once when stopped.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from corral.cli.main import app
from corral.core.cluster import Cluster
from corral.core.framework import STAGES
from corral.core.options import option
from corral.core.stages import Stage
from corral.exec.inert import PRERUN_REASON, STOPPED_REASON, TIME_LIMIT_REASON, InertExecutor
from corral.exec.local import AttemptEnded, AttemptLaunch, WorkerLaunch
from corral.server.boot import RunningServer, ServerOptions
from corral.server.executors import EXECUTORS, Boot, ExecutorEntry, Started
from corral.server.executors.local import declared_cluster
from corral.server.manager import Manager, ManagerSettings
from corral.server.spec import parse_job_spec
from corral.server.state import CacheSettings, Executor
from corral.server.store import Store
from tests.server.helpers import (
    Corral,
    admin_token,
    api,
    job,
    manager_settings,
    python_job,
    submit,
    wait_for,
)
from tests.server.inert import Clock

# -- an executor registered here, run by `corral up` -----------------------------------------


@dataclass(frozen=True, slots=True)
class RecordingOptions:
    exit_code: int = option(0, help="the exit code every attempt ends with", low=0, high=255)


class RecordingExecutor:
    """Records every launch; each attempt ends at the next poll with the configured exit code."""

    def __init__(self, exit_code: int) -> None:
        self.exit_code = exit_code
        self.launched: list[AttemptLaunch] = []
        self.due: list[AttemptLaunch] = []

    def launch(self, launch: AttemptLaunch) -> None:
        self.launched.append(launch)
        self.due.append(launch)

    def stop(self, job_id: str, attempt: int) -> None:
        pass

    def signal(self, job_id: str, attempt: int, number: int) -> None:
        pass

    def poll(self) -> list[AttemptEnded]:
        due, self.due = self.due, []
        reason = f"exit code {self.exit_code} (recording executor)"
        return [
            AttemptEnded(a.job_id, a.attempt, self.exit_code, None, False, reason, "", 0.0)
            for a in due
        ]

    def recover(self, job_id: str, attempt: int, attempt_dir: Path) -> str:
        return "never-started"

    def leftover(self, job_id: str, attempt: int, attempt_dir: Path) -> int:
        return 0

    def close(self) -> None:
        pass


class Recording(ExecutorEntry):
    name = "recording"
    summary = "records what it is asked to run"
    Options = RecordingOptions

    @classmethod
    def start(cls, options: Any, boot: Boot, given: Executor | None) -> Started:
        cluster, quota, cells, _ = declared_cluster(boot)
        return Started(RecordingExecutor(options.exit_code), cluster, quota, cells)


@pytest.fixture
def recording(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(EXECUTORS, "recording", Recording)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.usefixtures("recording")
def test_corral_up_runs_an_executor_registered_by_a_test_with_its_generated_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shown = CliRunner().invoke(app, ["up", "--help"], terminal_width=300)
    assert "one of: local, ray, inert, recording" in " ".join(shown.output.replace("│", "").split())
    assert "--recording-exit-code" in shown.output
    unknown = CliRunner().invoke(app, ["up", "--gpus", "1", "--executor", "slurm"])
    assert unknown.exit_code == 2
    assert "--executor: unknown 'slurm'; choose one of: local, ray, inert, recording" in (
        " ".join(unknown.output.split())
    )
    foreign = CliRunner().invoke(app, ["up", "--gpus", "1", "--recording-exit-code", "3"])
    assert foreign.exit_code == 2
    assert (
        "--recording-exit-code: an option of --executor recording (this is --executor local)"
        in (" ".join(foreign.output.split()))
    )
    bad = CliRunner().invoke(
        app, ["up", "--gpus", "1", "--executor", "recording", "--recording-exit-code", "300"]
    )
    assert bad.exit_code == 2
    assert "--recording-exit-code: must be in [0, 255], got 300" in " ".join(bad.output.split())

    # `corral up` itself, up to the point where it would serve in the foreground: here the API
    # server runs in a thread instead.
    served: list[RunningServer] = []

    def serve(manager: Manager, options: ServerOptions) -> None:
        served.append(RunningServer(manager, options.host, options.port).start())

    monkeypatch.setattr("corral.cli.up.serve", serve)
    data_dir = tmp_path / "state"
    args = ["up", "--executor", "recording", "--recording-exit-code", "3", "--gpus", "2"]
    args += ["--single-user", "--data-dir", str(data_dir), "--port", str(free_port())]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (server,) = served
    try:
        executor = server.manager.executor
        assert isinstance(executor, RecordingExecutor)
        assert executor.exit_code == 3  # the flag reached the entry's options
        with api(server.url, admin_token(data_dir)) as client:
            first = submit(client, **python_job("a", "pass"))
            second = submit(client, **python_job("b", "pass", gpus=2))
            for job_id, gpus in ((first, 1), (second, 2)):
                ended = wait_for(client, job_id)
                assert ended["status"] == "FAILED"  # exit 3, no retries
                assert ended["exit_code"] == 3
                (attempt,) = job(client, job_id)["attempt_history"]
                assert attempt["reason"] == "exit code 3 (recording executor)"
                assert len(attempt["gpus"]) == gpus
        assert sorted((launch.job_id, launch.attempt) for launch in executor.launched) == [
            (first, 1),
            (second, 1),
        ]
    finally:
        server.stop()


# -- the inert executor on its own, on a fake clock ------------------------------------------


def launch_of(
    job_id: str, limit_at: float | None, env: dict[str, str] | None = None
) -> AttemptLaunch:
    return AttemptLaunch(
        job_id=job_id,
        attempt=1,
        workers=[WorkerLaunch(0, ["true"], dict(env or {}))],
        workdir="/",
        stop_signal=15,
        grace_s=1.0,
        attempt_dir=Path("/nonexistent"),
        time_limit_at=limit_at,
    )


def ends(executor: InertExecutor) -> list[tuple[str, int | None, bool, str, float]]:
    return [(e.job_id, e.exit_code, e.stopped, e.reason, e.ended_at) for e in executor.poll()]


def test_inert_attempts_end_at_their_limits_in_order_or_when_stopped() -> None:
    clock = Clock()
    inert = InertExecutor(clock)
    inert.launch(launch_of("late", 1030.0))
    inert.launch(launch_of("early", 1010.0))
    inert.launch(launch_of("stopped", 1020.0))
    inert.launch(launch_of("unlimited", None))
    inert.launch(launch_of("prerun", None, {"CORRAL_PRECHECK": "1"}))
    assert ends(inert) == [("prerun", 0, False, PRERUN_REASON, 1000.0)]
    clock.now = 1009.999
    assert ends(inert) == []
    clock.now = 1015.0
    inert.stop("stopped", 1)
    inert.stop("stopped", 1)  # again: nothing more
    # The end is the instant of the limit, not the poll's.
    assert ends(inert) == [
        ("stopped", None, True, STOPPED_REASON, 1015.0),
        ("early", 0, False, TIME_LIMIT_REASON, 1010.0),
    ]
    assert inert.recover("late", 1, Path("/nonexistent")) == "running"
    assert inert.recover("early", 1, Path("/nonexistent")) == "never-started"
    clock.now = 1e9
    assert ends(inert) == [("late", 0, False, TIME_LIMIT_REASON, 1030.0)]
    assert inert.active() == {("unlimited", 1)}  # no limit: it runs until it is stopped
    with pytest.raises(ValueError, match="is running"):
        inert.launch(launch_of("unlimited", None))


def test_the_manager_gives_an_attempt_the_time_left_of_its_limit(tmp_path: Path) -> None:
    """One GPU. `a` (level 0, time_limit 10) starts at 1000; `b` (level 1, time_limit 3) comes at
    1004 and preempts it; `b` runs 1004-1007; `a` resumes at 1007 with 10 - 4 = 6 s left, to
    1013, and succeeds: its time limit is the job's, over its attempts. Steps land past each
    limit (the manager's own check would fail the job there): the inert end comes first."""
    clock = Clock()
    inert = InertExecutor(clock)
    manager = Manager(
        Store(Store.sqlite_url(tmp_path)),
        inert,
        Cluster.shorthand(1, 1),
        tmp_path,
        settings=ManagerSettings(progress_check_s=0.0),
        clock=clock,
    )
    launched: list[AttemptLaunch] = []
    launch = inert.launch

    def record(attempt: AttemptLaunch) -> None:
        launched.append(attempt)
        launch(attempt)

    inert.launch = record  # type: ignore[method-assign]

    def settle(at: float) -> None:
        clock.now = at
        for _ in range(10):
            manager.step()

    try:
        a = manager.submit(parse_job_spec(python_job("a", "pass", time_limit=10)), "u").id
        settle(1000.0)
        b = manager.submit(parse_job_spec(python_job("b", "pass", time_limit=3, level=1)), "u").id
        settle(1004.0)
        settle(1007.5)
        settle(1013.5)
        assert [(x.job_id, x.attempt, x.time_limit_at) for x in launched] == [
            (a, 1, 1010.0),
            (b, 1, 1007.0),
            (a, 2, 1007.5 + 6.0),
        ]
        statuses = [manager.store.get_job(job_id) for job_id in (a, b)]
        assert [row.status if row else None for row in statuses] == ["SUCCEEDED", "SUCCEEDED"]
    finally:
        manager.stop()


# -- `corral up --executor inert` ------------------------------------------------------------


def test_corral_up_with_the_inert_executor(tmp_path: Path) -> None:
    """As root and without --single-user: the inert executor needs no account. A job with a
    time_limit of 2 s succeeds 2 s after it starts (its attempt's end is its limit's instant);
    one without runs until it is cancelled, and ends at once then."""
    corral = Corral(tmp_path / "state", "--executor", "inert", "--gpus", "2", "--multi-user")
    client = corral.start()
    try:
        limited = submit(client, **python_job("limited", "raise SystemExit(1)", time_limit=2))
        unlimited = submit(client, **python_job("unlimited", "raise SystemExit(1)"))
        done = wait_for(client, limited)
        assert done["status"] == "SUCCEEDED", done
        (attempt,) = job(client, limited)["attempt_history"]
        assert attempt["reason"] == TIME_LIMIT_REASON
        assert attempt["ended_at"] - attempt["started_at"] == pytest.approx(2.0, abs=0.01)
        assert job(client, unlimited)["status"] == "RUNNING"  # 2 s on, still
        assert client.post(f"/api/v1/jobs/{unlimited}/cancel").status_code == 200
        assert wait_for(client, unlimited)["status"] == "CANCELLED"
        (attempt,) = job(client, unlimited)["attempt_history"]
        assert attempt["reason"].startswith(STOPPED_REASON)
        log = " ".join(corral.log().read_text().split())
        assert "(inert executor: no job runs)" in log
        assert "jobs none runs: the inert executor starts no process" in log
        assert "limits none: the inert executor runs no process" in log
        assert not list((tmp_path / "state").glob("jobs/*/attempt-*/*"))  # no file either
    finally:
        client.close()
        corral.stop()


class Cohabit(Stage):
    """A stage of this test's that lets jobs share GPUs (and does nothing else)."""

    name = "cohabit"
    shares_gpus = True


def test_a_stage_that_lets_jobs_share_gpus_is_refused_where_they_cannot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray's executor (one actor a GPU) and the live data caches refuse any stage that shares
    GPUs, naming it, not only Gandiva's packing; a stage that shares none (migration) passes."""
    monkeypatch.setitem(STAGES, "cohabit", Cohabit)
    ray = EXECUTORS["ray"]
    options = ray.Options(address="127.0.0.1:1")

    def ray_refusal(*stages: str) -> str | None:
        boot = Boot(tmp_path, manager_settings(stages=list(stages)))
        return ray.refusal(options, boot)

    assert ray_refusal("migration") is None
    assert ray_refusal("migration", "cohabit") == (
        "--stages cohabit: runs with the local executor only (the stage lets jobs share GPUs; "
        "Ray lets one actor hold a GPU)"
    )
    with pytest.raises(ValueError) as refused:
        Manager(
            Store(Store.sqlite_url(tmp_path)),
            InertExecutor(),
            Cluster.shorthand(1, 2),
            tmp_path,
            settings=manager_settings(stages=["cohabit"], cache=CacheSettings(1.0)),
        )
    assert str(refused.value) == (
        "--cache-gb-per-node: not supported with the cohabit stage (it lets jobs share GPUs, "
        "at speeds it sets)"
    )
