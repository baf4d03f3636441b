"""Pre-runs in the simulator: the first progress report passes them, failures drawn inside them
happen there on one worker's GPUs, and the GPU time is accounted to the right attempts."""

from __future__ import annotations

import pytest

from corral.core import Cluster, JobSpec, JobStatus, Scheduler
from corral.core.placement import make_placement
from corral.core.policy import make_policy
from corral.core.precheck import PrecheckState
from corral.sim.engine import Simulation
from corral.sim.failures import PhillyFailures
from corral.sim.metrics import summarize


def simulation(
    specs: list[JobSpec], precheck_s: float | None = 300.0, nodes: int = 1, **kw: object
) -> Simulation:
    scheduler = Scheduler(
        Cluster.shorthand(nodes, 4),
        make_policy("fifo"),
        make_placement("consolidate"),
        restore_s=30.0,
        precheck_s=precheck_s,
    )
    return Simulation(specs, scheduler, **kw)  # type: ignore[arg-type]


def gang(job_id: str = "j", duration: float = 1000.0, submit: float = 0.0) -> JobSpec:
    """4 GPUs, 4 workers of 1 GPU."""
    return JobSpec(id=job_id, submit_time=submit, gpus=4, duration_s=duration)


def user_errors_at(seconds: float) -> PhillyFailures:
    """Every job has a user error `seconds` after each attempt's start; no infrastructure
    failure in practice (one per 10^12 GPU-hours)."""
    return PhillyFailures(
        user_error_share=1.0, user_error_s=(seconds, seconds), infra_mtbf_gpu_h=1e12
    )


def test_the_first_progress_report_passes_the_pre_run_and_the_gang_starts_over() -> None:
    # Pre-run on 1 GPU from 0, reports at 60 (no restore: a pre-run restores nothing): passed.
    # The 4-GPU attempt starts at 60, not resumed (no 30 s restore), and does all 1000 s: JCT
    # 1060 s. GPU time: 60 on 1 GPU + 1000 on 4 = 4060 GPU-s, 60 of them in the pre-run.
    result = simulation([gang()], precheck_report_s=60.0).run()
    (job,) = result.jobs
    assert job.status is JobStatus.SUCCEEDED and job.gpus == 4
    assert job.finished_at == 1060.0 and job.attempts == 2 and job.preemptions == 0
    assert job.attained_gpu_s == 4060.0 and job.lost_gpu_s == 0.0
    summary = summarize(result)
    assert summary["gpu_hours"] == pytest.approx(4060.0 / 3600.0)
    assert summary["prechecks"] == 1 and summary["precheck_passed"] == 1
    assert summary["precheck_failed"] == 0
    assert summary["precheck_gpu_hours"] == pytest.approx(60.0 / 3600.0)
    assert summary["preemptions"] == 0


def test_a_job_that_never_reports_passes_by_the_timer() -> None:
    # Its first report would come at 600 s; the core's timer passes it at 100.
    result = simulation([gang()], precheck_s=100.0, precheck_report_s=600.0).run()
    (job,) = result.jobs
    assert job.peek(PrecheckState).passed_by == "timer"  # type: ignore[union-attr]
    assert job.finished_at == 1100.0 and job.attained_gpu_s == 100.0 + 4000.0


def test_an_early_user_error_is_caught_in_the_pre_run_on_one_gpu() -> None:
    # A user error 30 s into every attempt. Without a pre-run the retry rule ends the job after
    # three alike fast failures, each on 4 GPUs: attempts at 0, 35 (backoff 5) and 75 (10),
    # 3 x 4 x 30 = 360 GPU-s lost. With one, its pre-run fails at 30 on 1 GPU: 30 GPU-s lost,
    # and the job ends at once although max_retries is 3.
    without = simulation([gang()], precheck_s=None, failures=user_errors_at(30.0)).run()
    (job,) = without.jobs
    assert job.status is JobStatus.FAILED and job.finished_at == 105.0
    assert job.lost_gpu_s == 360.0 and job.attempts == 3
    assert summarize(without)["user_error_jobs"] == 1

    with_pre_run = simulation([gang()], failures=user_errors_at(30.0)).run()
    (job,) = with_pre_run.jobs
    assert job.status is JobStatus.FAILED and job.finished_at == 30.0
    assert job.lost_gpu_s == 30.0 and job.attempts == 1 and job.gpus == 4
    summary = summarize(with_pre_run)
    assert summary["gpu_hours_lost"] == pytest.approx(30.0 / 3600.0)
    assert summary["gpu_hours_lost_infra"] == 0.0
    assert summary["user_error_jobs"] == 1 and summary["precheck_failed"] == 1


def test_a_user_error_after_the_first_report_is_not_caught() -> None:
    # The error shows 90 s into each attempt: after the pre-run's report at 60, so it passes.
    # The gang then fails 4 times (90 s is not fast: retried until max_retries 3), on 4 GPUs
    # each time, as without a pre-run; the pre-run's minute on 1 GPU is spent, not lost.
    result = simulation([gang()], failures=user_errors_at(90.0)).run()
    (job,) = result.jobs
    assert job.status is JobStatus.FAILED and job.failures == 4
    assert job.lost_gpu_s == 4 * 4 * 90.0
    assert job.attained_gpu_s == 60.0 + 4 * 4 * 90.0


def test_a_one_worker_job_runs_no_pre_run_in_the_simulator() -> None:
    one = JobSpec(id="one", submit_time=0.0, gpus=4, gpus_per_worker=4, duration_s=100.0)
    result = simulation([one]).run()
    assert result.jobs[0].finished_at == 100.0 and result.jobs[0].attempts == 1
    assert "prechecks" not in summarize(result)
