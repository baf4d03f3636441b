"""The discrete-event simulator on scenarios whose timeline is worked out by hand."""

from __future__ import annotations

import pytest

from corral.core import Cluster, JobSpec, JobStatus, Scheduler
from corral.core.placement import make_placement
from corral.core.policy import make_policy
from corral.sim.engine import FailureModel, Simulation


def run(specs, policy="fifo", placement="consolidate", nodes=1, gpus=4, **kw):
    cluster = Cluster.shorthand(nodes, gpus)
    speed = kw.pop("speed_model", None)
    scheduler = Scheduler(
        cluster,
        make_policy(policy, **kw.pop("policy_options", {})),
        make_placement(placement),
        speed_model=speed,
        backfill=kw.pop("backfill", False),
        restore_s=kw.pop("restore_s", 0.0),
    )
    sim = Simulation(specs, scheduler, **kw)
    result = sim.run()
    return result, {j.id: j for j in result.jobs}


def spec(job_id, gpus, submit, duration, **kw):
    return JobSpec(id=job_id, submit_time=submit, gpus=gpus, duration_s=duration, **kw)


def test_fifo_runs_jobs_back_to_back():
    _, jobs = run([spec("a", 4, 0, 100), spec("b", 4, 10, 50)])
    assert jobs["a"].finished_at == 100
    assert jobs["b"].first_started_at == 100 and jobs["b"].finished_at == 150


def test_srtf_preempts_and_the_resumed_job_pays_its_restore_time():
    # b (50 s) arrives at 10 while a has 90 s left: b runs 10..60, a resumes at 60 and, after a
    # 5 s restore, does its remaining 90 s: it ends at 155.
    result, jobs = run([spec("a", 4, 0, 100), spec("b", 4, 10, 50)], policy="srtf", restore_s=5)
    assert jobs["b"].finished_at == pytest.approx(60)
    assert jobs["a"].finished_at == pytest.approx(155)
    assert jobs["a"].preemptions == 1 and result.preemptions == 1


def test_las_timer_preempts_at_the_queue_crossing():
    # Threshold 100 GPU-s: the 4-GPU job a crosses it at t=25 and b (queue 0) preempts it.
    # b crosses too at t=50, into a's queue: only a higher queue preempts (the default, as in
    # Tiresias), so b runs its last 25 s (50..75) and a then its remaining 75 s (75..150).
    _, jobs = run(
        [spec("a", 4, 0, 100), spec("b", 4, 5, 50)],
        policy="las",
        policy_options={"thresholds_gpu_s": [100]},
    )
    assert jobs["b"].first_started_at == pytest.approx(25)
    assert jobs["b"].finished_at == pytest.approx(75)
    assert jobs["a"].finished_at == pytest.approx(150)
    assert jobs["a"].preemptions == 1 and jobs["b"].preemptions == 0
    # With preemption inside a queue, the earlier arrival a goes first in queue 1 at t=50 and
    # runs its remaining 75 s (50..125); b then does its last 25 s (125..150).
    _, jobs = run(
        [spec("a", 4, 0, 100), spec("b", 4, 5, 50)],
        policy="las",
        policy_options={"thresholds_gpu_s": [100], "preempt_within_queue": True},
    )
    assert jobs["a"].finished_at == pytest.approx(125)
    assert jobs["b"].finished_at == pytest.approx(150)
    assert jobs["a"].preemptions == 1 and jobs["b"].preemptions == 1


def test_spread_jobs_run_slower_by_their_slowdown():
    def speed(job, gpus):
        nodes = {g // 2 for g in gpus}
        return 1.0 / job.spec.spread_slowdown if len(nodes) > 1 else 1.0

    _, jobs = run(
        [spec("wide", 4, 0, 100, spread_slowdown=2.0)],
        placement="any",
        nodes=2,
        gpus=2,
        speed_model=speed,
    )
    assert jobs["wide"].finished_at == pytest.approx(200)


def test_failures_are_retried_up_to_the_limit_then_marked_failed():
    failures = FailureModel(rate=1.0, max_retries=2, cap=1.0)  # every attempt fails
    _, jobs = run([spec("flaky", 1, 0, 100)], failures=failures)
    assert jobs["flaky"].status is JobStatus.FAILED
    assert jobs["flaky"].attempts == 3 and jobs["flaky"].failures == 3


def test_same_seed_same_run_and_window_stops_when_measured_jobs_finish():
    specs = [spec(f"j{i}", 1 + i % 4, i * 7.0, 50.0 + 13 * (i % 5)) for i in range(40)]
    first, _ = run(specs, policy="las", failures=FailureModel(rate=0.2), seed=3)
    second, _ = run(specs, policy="las", failures=FailureModel(rate=0.2), seed=3)
    assert [(j.id, j.finished_at, j.attempts) for j in first.jobs] == [
        (j.id, j.finished_at, j.attempts) for j in second.jobs
    ]
    windowed, jobs = run(specs, measured={"j0", "j1"})
    assert jobs["j0"].finished_at is not None and jobs["j1"].finished_at is not None
    assert any(j.finished_at is None for j in windowed.jobs)  # stopped before the rest ended


def test_empty_trace_and_a_job_that_never_fits_end_cleanly():
    result, _ = run([])
    assert result.jobs == [] and result.rounds == 0


class _Rounds:
    def __init__(self) -> None:
        self.at: list[float] = []

    def after_round(self, now: float, arrived: object) -> None:
        self.at.append(now)


def test_an_event_that_changes_nothing_holds_no_round():
    # LAS at 10 GPU-s on one 2-GPU node. a (100 s) starts at 0 and drops a queue at t=5, while
    # no job waits: no round; b (30 s) arrives at 20 and preempts it; b drops at t=25 (a's
    # queue: no preemption, but a job waits: a round), ends at 50, and a resumes with 80 s left:
    # it ends at 130. a's first attempt would have ended at t=100: that stale end holds no
    # round.
    rounds = _Rounds()
    _, jobs = run(
        [spec("a", 2, 0, 100), spec("b", 2, 20, 30)],
        policy="las",
        policy_options={"thresholds_gpu_s": [10]},
        gpus=2,
        observer=rounds,
    )
    assert jobs["a"].finished_at == pytest.approx(130) and jobs["a"].preemptions == 1
    assert rounds.at == pytest.approx([0, 20, 25, 50, 130])
