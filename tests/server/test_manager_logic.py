"""The manager's bookkeeping with an executor whose attempts end as the test scripts them:
what a run of lost attempts, or a relative data directory, leads to."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from corral.core.cluster import Cluster
from corral.exec.local import AttemptEnded, AttemptLaunch, LocalExecutor, make_job_dirs
from corral.server.manager import Manager, ManagerSettings
from corral.server.spec import parse_job_spec
from corral.server.store import Store, StoreUnavailable
from tests.server.helpers import (
    admin_token,
    api,
    manager_settings,
    python_job,
    start_server,
    submit,
    wait_for,
)
from tests.server.inert import Clock, HeldExecutor


class ScriptedExecutor:
    """Every launched attempt ends, at the next poll, the way `outcome` says."""

    def __init__(self, outcome: AttemptEnded, clock: Clock) -> None:
        self.outcome = outcome
        self.clock = clock
        self.launched: list[AttemptLaunch] = []
        self.due: list[AttemptLaunch] = []

    def launch(self, launch: AttemptLaunch) -> None:
        self.launched.append(launch)
        self.due.append(launch)

    def stop(self, job_id: str, attempt: int) -> None:
        pass

    def poll(self) -> list[AttemptEnded]:
        ended = [
            AttemptEnded(
                a.job_id,
                a.attempt,
                self.outcome.exit_code,
                None,
                self.outcome.stopped,
                self.outcome.reason,
                self.outcome.error_tail,
                self.clock(),
            )
            for a in self.due
        ]
        self.due = []
        return ended

    def recover(self, job_id: str, attempt: int, attempt_dir: Path) -> str:
        return "never-started"

    def close(self) -> None:
        pass


def manager_with(tmp_path: Path, outcome: AttemptEnded) -> tuple[Manager, ScriptedExecutor, Clock]:
    clock = Clock()
    executor = ScriptedExecutor(outcome, clock)
    manager = Manager(
        Store(Store.sqlite_url(tmp_path)),
        executor,
        Cluster.shorthand(1, 2),
        tmp_path,
        settings=manager_settings(retry_backoff_s=2.0, fast_fail_s=60.0, fast_fail_repeats=2),
        clock=clock,
    )
    return manager, executor, clock


LOST = AttemptEnded("", 0, None, None, False, "lost: the attempt's supervisor died", "", 0.0)


def test_an_attempt_lost_again_and_again_ends_the_job_with_growing_backoff(tmp_path: Path) -> None:
    manager, executor, clock = manager_with(tmp_path, LOST)
    manager.submit(parse_job_spec(python_job("j", "pass", max_retries=0)), "u")
    starts: list[float] = []
    for _ in range(40):  # 0.5 s steps of the clock
        before = len(executor.launched)
        manager.step()
        if len(executor.launched) > before:
            starts.append(clock.now)
        clock.now += 0.5
    row = manager.store.get_job("1")
    assert row is not None and row.status == "FAILED"
    # max_retries 0 does not count lost attempts (the machine's fault), yet the third identical
    # fast loss ends it; retries waited 2 s, then 4 s (backoff doubling per failure in a row).
    assert len(starts) == 3
    assert [b - a for a, b in zip(starts, starts[1:], strict=False)] == [2.5, 4.5]  # + a step
    assert row.reason.startswith("lost: the same failure 3 times in a row")
    assert row.failures == 0


def test_a_user_error_exit_uses_retries_then_fails(tmp_path: Path) -> None:
    failing = AttemptEnded("", 0, 1, None, False, "exit code 1 (rank 0)", "ValueError: x", 0.0)
    manager, executor, clock = manager_with(tmp_path, failing)
    manager.submit(parse_job_spec(python_job("j", "pass", max_retries=1)), "u")
    for _ in range(20):
        manager.step()
        clock.now += 0.5
    row = manager.store.get_job("1")
    assert row is not None and row.status == "FAILED"
    assert (row.attempts, row.failures) == (2, 2)  # max_retries 1: two attempts in all
    assert row.reason == "exit code 1 (rank 0): ValueError: x"


def test_the_round_makes_no_directory_the_executor_makes_them_at_launch(tmp_path: Path) -> None:
    """A start tells the executor the job's directory and whether the workdir is the job's own;
    the round makes neither (`make_job_dirs`, called by the executors as they launch, does)."""
    manager, executor, _ = manager_with(tmp_path, LOST)
    mine = tmp_path / "mine"
    mine.mkdir()
    manager.submit(parse_job_spec(python_job("own", "pass")), "u")
    manager.submit(parse_job_spec(python_job("named", "pass", workdir=str(mine))), "u")
    manager.step()
    own, named = executor.launched
    jobs = manager.data_dir / "jobs"
    assert (own.job_dir, own.workdir, own.own_workdir) == (jobs / "1", str(jobs / "1/work"), True)
    assert (named.job_dir, named.workdir, named.own_workdir) == (jobs / "2", str(mine), False)
    assert not jobs.exists()  # the round made nothing
    for launch in (own, named):
        make_job_dirs(launch)
    for path in (jobs, jobs / "1", jobs / "1/work", jobs / "2"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path  # single-user: the manager's
    assert not (jobs / "2/work").exists()  # its workdir is its own choice


def test_a_job_directory_the_executor_cannot_make_fails_the_start(tmp_path: Path) -> None:
    """The local executor refuses an attempt whose job directory cannot be made, before anything
    of it runs: the manager records a start that failed, as when the round made it."""
    executor = LocalExecutor()
    clock = Clock()
    manager = Manager(
        Store(Store.sqlite_url(tmp_path)),
        executor,
        Cluster.shorthand(1, 1),
        tmp_path,
        settings=manager_settings(),
        clock=clock,
    )
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "1").write_text("")  # a file in the job directory's place
    ran = tmp_path / "ran"
    manager.submit(parse_job_spec(python_job("j", f"open({str(ran)!r}, 'w')")), "u")
    try:
        manager.step()
        (attempt,) = manager.store.attempts("1")
        assert attempt.outcome == "failed"
        assert attempt.reason == f"cannot start: [Errno 17] File exists: '{tmp_path}/jobs/1'"
        assert executor.active() == set() and not ran.exists()
        assert not (tmp_path / "jobs" / "1" / "attempt-1").exists()
    finally:
        manager.stop()


def test_limits_are_checked_only_for_the_jobs_that_set_one(tmp_path: Path) -> None:
    """Every `progress_check_s` the manager looks for attempts past their time limit or silent
    past their progress timeout: only the attempts of jobs that set one (none while no job
    does), and those it stops at their limit."""
    clock = Clock()
    executor = HeldExecutor()
    manager = Manager(
        Store(Store.sqlite_url(tmp_path)),
        executor,
        Cluster.shorthand(1, 4),
        tmp_path,
        settings=manager_settings(),
        clock=clock,
    )
    for name in ("free", "free-too"):
        manager.submit(parse_job_spec(python_job(name, "pass")), "u")
    manager.step()
    assert len(executor.running) == 2 and manager._limited_attempts() == []
    for name, limit in [("limited", {"time_limit": 10}), ("watched", {"progress_timeout": 30})]:
        manager.submit(parse_job_spec(python_job(name, "pass", **limit)), "u")
    manager.submit(parse_job_spec(python_job("later", "pass", time_limit=5, gpus=2)), "u")
    manager.step()
    assert len(executor.running) == 4  # later waits for GPUs: no attempt to look at
    assert [job for job, _ in manager._limited_attempts()] == ["3", "4"]
    clock.now += 11  # past limited's time limit, within watched's progress timeout
    manager.step()
    assert executor.stopped == [("3", 1)]
    clock.now += 30  # watched has sent no report for 41 s
    manager.step()
    assert executor.stopped == [("3", 1), ("4", 1)]


def test_a_relative_data_dir_works_for_the_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    server = start_server(Path("relative"), gpus=1)
    try:
        client = api(server.url, admin_token(tmp_path / "relative"))
        job_id = submit(client, **python_job("j", "print('ok')"))
        assert wait_for(client, job_id)["status"] == "SUCCEEDED"
        assert (tmp_path / "relative/jobs/1/attempt-1/rank-0.stdout").read_text() == "ok\n"
    finally:
        server.stop()


def test_gittins_learns_job_sizes_from_the_managers_own_history(tmp_path: Path) -> None:
    from corral.server.store import JobRow

    store = Store(Store.sqlite_url(tmp_path))
    for number in range(1, 26):  # 25 finished jobs of 100 GPU-s, one cancelled (not a size)
        store.insert_jobs(
            [
                JobRow.new(
                    number,
                    name="j",
                    user="u",
                    vc="default",
                    priority="guaranteed",
                    gpus=1,
                    spec={},
                    submitted_at=0.0,
                )
            ]
        )
        status = "CANCELLED" if number == 25 else "SUCCEEDED"
        store.update_job(number, status=status, attained_gpu_s=100.0 if number < 25 else 7.0)
    cluster = Cluster.shorthand(1, 2)
    learned = Manager(
        store,
        ScriptedExecutor(LOST, Clock()),
        cluster,
        tmp_path,
        settings=manager_settings(policy="gittins"),
    )
    assert sorted(learned.scheduler.policy.samples) == [100.0] * 24
    fresh_dir = tmp_path / "fresh"
    fresh_dir.mkdir()
    fresh = Manager(
        Store(Store.sqlite_url(fresh_dir)),
        ScriptedExecutor(LOST, Clock()),
        cluster,
        fresh_dir,
        settings=manager_settings(policy="gittins"),
    )
    assert sorted(fresh.scheduler.policy.samples) == [60.0, 600.0, 3600.0, 86400.0]


def test_a_stop_nobody_asked_for_is_not_the_jobs_failure(tmp_path: Path) -> None:
    stopped = AttemptEnded("", 0, 143, None, True, "stopped: exit code 143 after SIGTERM", "", 0.0)
    manager, executor, clock = manager_with(tmp_path, stopped)
    manager.submit(parse_job_spec(python_job("j", "pass", max_retries=0)), "u")
    manager.step()  # started
    clock.now += 1.0
    manager.step()  # its supervisor was stopped by someone else: requeued, no retry used
    row = manager.store.get_job("1")
    assert row is not None and row.status == "PENDING" and row.failures == 0
    assert [a.outcome for a in manager.store.attempts("1")] == ["lost"]


def test_a_round_that_fails_half_way_is_rebuilt_from_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ok = AttemptEnded("", 0, 0, None, False, "exit code 0", "", 0.0)
    manager, executor, clock = manager_with(tmp_path, ok)
    manager.submit(parse_job_spec(python_job("j", "pass")), "u")
    real_add_attempt = manager.store.add_attempt

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(manager.store, "add_attempt", broken)
    with pytest.raises(OSError):
        manager.step()  # the core started the job; the store rolled the round back
    assert executor.launched == []
    row = manager.store.get_job("1")
    assert row is not None and row.status == "PENDING" and row.attempts == 0
    monkeypatch.setattr(manager.store, "add_attempt", real_add_attempt)
    manager.resync()  # what the control loop does after a failed round
    assert manager.scheduler.jobs["1"].status.value == "PENDING"
    assert manager.cluster.free_gpus == 2  # nothing held by the start that never happened
    manager.step()
    assert [launch.attempt for launch in executor.launched] == [1]
    clock.now += 1
    manager.step()
    row = manager.store.get_job("1")
    assert row is not None and row.status == "SUCCEEDED" and row.attempts == 1


def test_failure_history_and_backoff_survive_a_restart(tmp_path: Path) -> None:
    typo = AttemptEnded("", 0, 1, None, False, "exit code 1 (rank 0)", "ModuleNotFoundError", 0.0)
    manager, executor, clock = manager_with(tmp_path, typo)
    manager.submit(parse_job_spec(python_job("typo", "import torchh", max_retries=10)), "u")
    manager.step()  # attempt 1 starts
    clock.now += 0.5
    manager.step()  # it fails: retry held 2 s
    clock.now += 2.5
    manager.step()  # attempt 2 starts
    clock.now += 0.5
    manager.step()  # it fails the same way: held 4 s
    assert manager.store.get_job("1").attempts == 2  # type: ignore[union-attr]
    failed_at = clock.now
    # The manager restarts: a new one on the same store, with no memory of its own.
    again = Manager(
        manager.store,
        ScriptedExecutor(typo, clock),
        Cluster.shorthand(1, 2),
        tmp_path,
        settings=manager.settings,
        clock=clock,
    )
    again.recover()
    clock.now = failed_at + 3.0
    again.step()  # still inside the 4 s backoff
    assert again.executor.launched == []  # type: ignore[attr-defined]
    clock.now = failed_at + 4.0
    again.step()  # attempt 3 starts
    clock.now += 0.5
    again.step()  # the third identical fast failure: a user error, as without the restart
    row = again.store.get_job("1")
    assert row is not None and row.status == "FAILED" and row.attempts == 3
    assert row.reason.startswith("user error: the same failure 3 times in a row")
    history = again.store.attempts("1")
    assert history[0].reason == "exit code 1 (rank 0): ModuleNotFoundError"


class LeavesProcesses(ScriptedExecutor):
    """Attempts end with one process the supervisor could not end, until `left` says 0."""

    def __init__(self, outcome: AttemptEnded, clock: Clock) -> None:
        super().__init__(outcome, clock)
        self.left = 1
        self.asked: list[tuple[str, int]] = []

    def poll(self) -> list[AttemptEnded]:
        ended = super().poll()
        for end in ended:
            end.leftover = 1
        return ended

    def leftover(self, job_id: str, attempt: int, attempt_dir: Path) -> int:
        self.asked.append((job_id, attempt))
        return self.left


def test_gpus_with_processes_left_go_to_no_one_until_they_are_gone(tmp_path: Path) -> None:
    clock = Clock()
    succeeded = AttemptEnded("", 0, 0, None, False, "exit code 0", "", 0.0)
    executor = LeavesProcesses(succeeded, clock)
    manager = Manager(
        Store(Store.sqlite_url(tmp_path)),
        executor,
        Cluster.shorthand(1, 1),  # one GPU: the second job can only have the first one's
        tmp_path,
        settings=ManagerSettings(node_check_s=1.0),
        clock=clock,
    )
    for name in ("first", "second"):
        manager.submit(parse_job_spec(python_job(name, "pass")), "u")
    for _ in range(10):  # 5 s: the first ends at once, one of its processes lives on
        manager.step()
        clock.now += 0.5
    assert [launch.job_id for launch in executor.launched] == ["1"]
    first = manager.store.get_job("1")
    assert first is not None and first.status == "SUCCEEDED"
    assert executor.asked and set(executor.asked) == {("1", 1)}  # asked again, about it alone
    executor.left = 0
    for _ in range(4):  # within a check interval (1 s) the GPU is free again
        manager.step()
        clock.now += 0.5
    assert [launch.job_id for launch in executor.launched] == ["1", "2"]
    assert executor.launched[1].gpu_devices == [0]
    events = [event.message for event in manager.store.events("1")]
    assert "attempt 1's last processes are gone" in events


def test_a_refusal_is_stored_with_the_job_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ElasticFlow refuses a job as it is queued (1 GPU for 3600 s of work, due in 60 s): the
    refusal is written in the transaction that stores the job. When that transaction fails the
    job is neither stored (not even as pending, which a restart would start) nor in the core."""
    manager = Manager(
        Store(Store.sqlite_url(tmp_path)),
        ScriptedExecutor(LOST, Clock()),
        Cluster.shorthand(1, 2),
        tmp_path,
        settings=manager_settings(policy="elasticflow"),
        clock=Clock(),
    )
    late = parse_job_spec(python_job("late", "pass", time_limit=3600, deadline=60))
    real_add_event = manager.store.add_event

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(manager.store, "add_event", broken)
    with pytest.raises(OSError, match="disk full"):
        manager.submit(late, "u")
    assert manager.store.get_job("1") is None
    # The core may have moved: nothing is decided or accepted until it is rebuilt from the store.
    assert manager.degraded is not None
    monkeypatch.setattr(manager.store, "add_event", real_add_event)
    with pytest.raises(StoreUnavailable):
        manager.submit(late, "u")
    manager.step()  # rebuilds the state from the store: the unstored job is gone
    assert manager.degraded is None and "1" not in manager.scheduler.jobs
    row = manager.submit(late, "u")  # (ids 1 and 2 went to the two submissions not stored)
    assert (row.id, row.status) == ("3", "REFUSED")
    stored = manager.store.get_job("3")
    assert stored is not None and stored.status == "REFUSED" and stored.finished_at == 1000.0
    assert stored.reason.startswith("refused: its deadline (in 60s) cannot be met")
    assert [e.kind for e in manager.store.events("3")] == ["submitted", "refused"]
    manager.step()
    assert manager.scheduler.jobs["3"].attempts == 0 and manager.store.unfinished_jobs() == []
    assert [job.id for job in manager.store.list_jobs()] == ["3"]
