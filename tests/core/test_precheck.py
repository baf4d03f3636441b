"""Philly's pre-run ("precheck", corral.core.precheck) on hand-worked scenarios: a job of more
than one worker first runs as one worker, and holds its gang only once that pre-run passed."""

from __future__ import annotations

import pytest

from corral.core import Cluster, JobRefused, JobSpec, JobStatus, Preempt, Scheduler, Start
from corral.core.admission.hived import HivedScheduler
from corral.core.config import parse_cluster_config
from corral.core.elastic import ElasticScheduler
from corral.core.framework import build_scheduler, config_from_mapping
from corral.core.job import Elastic, Job
from corral.core.options import OptionError
from corral.core.placement import make_placement
from corral.core.plugin import PluginError, Services
from corral.core.policy import make_policy
from corral.core.precheck import PRECHECK_PASSED, PrecheckState
from corral.core.retry import FailureReport
from tests.core.helpers import scheduler, spec


def starts(actions: list) -> list[Start]:
    return [a for a in actions if isinstance(a, Start)]


def stops(actions: list) -> list[Preempt]:
    return [a for a in actions if isinstance(a, Preempt)]


def counters(s: object) -> tuple[int, int, int]:
    c = s.counters()  # type: ignore[attr-defined]
    return c["prechecks"], c["precheck_passed"], c["precheck_failed"]


def two_by_four(policy: str = "fifo", **kw: object) -> Scheduler:
    return scheduler(2, 4, policy=policy, **kw)


# -- the pre-run and its three ways to pass --------------------------------------------------------


def test_a_four_worker_job_starts_on_one_gpu_and_restarts_on_four_after_progress() -> None:
    # 2 nodes x 4 GPUs, fifo, consolidated. The 4-GPU job of 4 workers (1 GPU each) first runs
    # one worker: 1 GPU, WORLD_SIZE 1. It reports progress at 60 s: its pre-run passed, the
    # attempt is stopped (1 GPU-minute attained, no work kept) and it waits for its 4 GPUs, which
    # the round at 60 gives it on one node: node 1 (GPUs 4-7), as both are wholly free and the
    # placement's buckets keep nodes in the order they became free. Its 1000 s of work start
    # over, not resumed.
    s = two_by_four(restore_s=30)
    s.submit(spec("j", 4, precheck_s=300.0), 0)
    first = s.decide(0)
    assert first.actions == [Start("j", (0,), precheck=True)]
    assert first.wake_at == 300.0  # the pre-run's timer
    job = s.jobs["j"]
    assert job.gpus == 1 and job.peek(PrecheckState) is not None
    assert s.cluster.free_gpus == 7

    stop = s.progressed("j", 60)
    assert stop == Preempt("j", (0,), PRECHECK_PASSED, precheck=True)
    assert job.status is JobStatus.PENDING and job.gpus == 4
    assert job.attained_gpu_s == 60.0 and job.work_done_s == 0.0
    assert job.preemptions == 0 and s.preemptions == 0  # a pre-run's end is no preemption
    assert s.cluster.free_gpus == 8

    second = s.decide(60)
    assert second.actions == [Start("j", (4, 5, 6, 7))]  # not a pre-run; not resumed
    assert second.wake_at is None  # the pre-run's timer is gone
    assert job.stall_until == 60.0  # no restore: it starts over
    assert job.attempts == 2
    assert s.progressed("j", 120) is None  # later progress reports change nothing
    s.finished("j", 1060)
    assert job.status is JobStatus.SUCCEEDED
    assert job.attained_gpu_s == 60.0 + 4 * 1000.0
    assert job.peek(PrecheckState).passed_by == "progress"  # type: ignore[union-attr]
    assert counters(s) == (1, 1, 0)


def test_a_pre_run_passes_by_its_timer_at_exactly_start_plus_precheck_s() -> None:
    # Submitted at 10, its pre-run starts at 10 and reports nothing: the round asks to be called
    # at 10 + 300 = 310, and that round stops the pre-run first, then starts the whole gang
    # (on node 1, free longer than node 0).
    s = two_by_four()
    s.submit(spec("j", 4, submit=10.0, precheck_s=300.0), 10)
    assert s.decide(10).wake_at == 310.0
    assert s.decide(200).wake_at == 310.0  # a round in between does not move it
    assert s.decide(309.0).actions == []
    due = s.decide(310.0)
    assert due.actions == [
        Preempt("j", (0,), PRECHECK_PASSED, precheck=True),
        Start("j", (4, 5, 6, 7)),
    ]
    assert s.jobs["j"].attained_gpu_s == 300.0
    assert s.jobs["j"].peek(PrecheckState).passed_by == "timer"  # type: ignore[union-attr]
    assert counters(s) == (1, 1, 0)


def test_a_pre_run_that_exits_successfully_has_passed_and_the_job_does_not_end() -> None:
    # The whole job fit in its pre-run (a short job): exit 0 at 40 s is a pass, not success.
    # No Preempt: its processes are gone already.
    s = two_by_four()
    s.submit(spec("j", 4, duration=30.0, precheck_s=300.0), 0)
    s.decide(0)
    job = s.finished("j", 40)
    assert job.status is JobStatus.PENDING and job.gpus == 4 and job.work_done_s == 0.0
    assert job.finished_at is None
    assert s.decide(40).actions == [Start("j", (4, 5, 6, 7))]
    s.finished("j", 70)
    assert job.status is JobStatus.SUCCEEDED and job.work_done_s == 30.0
    assert counters(s) == (1, 1, 0)


# -- failures in the pre-run -----------------------------------------------------------------------


def test_a_user_error_in_the_pre_run_ends_the_job_at_once_and_never_holds_the_gang() -> None:
    # max_retries 3 would retry any later failure three times (on 4 GPUs each time). In the
    # pre-run, a failure that is not the infrastructure's ends the job at once: 1 GPU x 30 s lost.
    s = two_by_four()
    s.submit(spec("j", 4, precheck_s=300.0, max_retries=3), 0)
    held = [len(a.gpus) for a in starts(s.decide(0).actions)]
    job = s.failed("j", 30, FailureReport("exit 1: No module named 'torchh'"))
    held += [len(a.gpus) for a in starts(s.decide(30).actions)]
    assert held == [1]  # one start, of one GPU: the gang was never held
    assert job.status is JobStatus.FAILED and job.finished_at == 30
    assert job.verdict is not None and job.verdict.give_up
    assert job.verdict.reason == (
        "user error: failed its pre-run on one worker (exit 1: No module named 'torchh')"
    )
    assert job.failures == 1 and job.lost_gpu_s == 30.0 and job.attained_gpu_s == 30.0
    assert job.gpus == 4  # reports show the job as it asked
    assert s.cluster.free_gpus == 8 and s.decide(31).wake_at is None
    assert counters(s) == (1, 0, 1)


def test_an_infrastructure_failure_in_the_pre_run_retries_the_pre_run() -> None:
    # A node failure at 30 s: the pre-run is retried after the RetryRule's first backoff (5 s),
    # again as one worker, its timer counted from its new start (35 + 300). It then passes.
    s = two_by_four()
    s.submit(spec("j", 4, precheck_s=300.0), 0)
    s.decide(0)
    job = s.failed("j", 30, FailureReport("node n0 failed", infrastructure=True))
    assert job.status is JobStatus.PENDING and job.gpus == 1
    assert job.hold_until == 35.0 and job.infra_failures == 1 and job.failures == 0
    assert job.lost_gpu_s == 30.0
    retry = s.decide(35)
    assert retry.actions == [Start("j", (4,), precheck=True)]  # a pre-run never resumes
    assert retry.wake_at == 335.0
    assert s.progressed("j", 95) is not None
    assert [len(a.gpus) for a in starts(s.decide(95).actions)] == [4]
    assert job.peek(PrecheckState).attempts == 2  # type: ignore[union-attr]
    assert counters(s) == (1, 1, 0)


def test_a_failure_after_the_pre_run_passed_is_retried_as_usual() -> None:
    s = two_by_four()
    s.submit(spec("j", 4, precheck_s=300.0, max_retries=3), 0)
    s.decide(0)
    s.progressed("j", 60)
    s.decide(60)
    job = s.failed("j", 100, FailureReport("exit 1"))
    assert job.status is JobStatus.PENDING and job.hold_until == 105.0
    assert job.lost_gpu_s == 4 * 40.0  # the pre-run's minute passed: not lost
    assert job.attained_gpu_s == 60.0 + 4 * 40.0
    assert starts(s.decide(105).actions) == [Start("j", (0, 1, 2, 3), resumed=True)]


def test_the_pre_run_keeps_no_checkpointed_work() -> None:
    # A checkpoint every 10 s of work: a failed full attempt would keep its work up to one, a
    # pre-run's work is never the job's.
    s = two_by_four()
    s.submit(spec("j", 4, precheck_s=300.0, checkpoint_every_s=10.0), 0)
    s.decide(0)
    job = s.failed("j", 45, FailureReport("lost", infrastructure=True))
    assert job.work_done_s == 0.0 and job.lost_gpu_s == 45.0


# -- who runs one, and where it waits --------------------------------------------------------------


@pytest.mark.parametrize(("gpus", "per_worker"), [(4, 4), (1, 1), (8, 4)])
def test_only_a_gang_of_more_than_one_worker_runs_a_pre_run(gpus: int, per_worker: int) -> None:
    s = two_by_four()
    s.submit(spec("j", gpus, precheck_s=300.0, gpus_per_worker=per_worker), 0)
    (start,) = starts(s.decide(0).actions)
    ran_pre_run = gpus > per_worker
    assert start.precheck is ran_pre_run
    assert len(start.gpus) == (per_worker if ran_pre_run else gpus)
    if not ran_pre_run:
        assert s.progressed("j", 60) is None and s.jobs["j"].status is JobStatus.RUNNING
    assert counters(s)[0] == int(ran_pre_run)


def test_a_pre_run_under_las_keeps_its_place_in_the_queue() -> None:
    # One node of 4 GPUs, LAS. a (4 GPUs, pre-run) arrives at 0 and runs on 1 GPU; b (4 GPUs)
    # arrives at 1 and cannot start on the 3 free GPUs. When a passes at 60 (60 GPU-s attained,
    # still LAS's top queue, which is in arrival order), it is ahead of b, as it was: the round
    # at 60 gives a the node, and b still waits.
    s = scheduler(1, 4, policy="las")
    s.submit(spec("a", 4, precheck_s=300.0), 0)
    s.decide(0)
    s.submit(spec("b", 4, submit=1.0), 1)
    assert starts(s.decide(1).actions) == []
    s.progressed("a", 60)
    assert [j.id for j in s.pending_jobs()] == ["a", "b"]
    assert s.explain("a", 60).startswith("PENDING, position 1 of 2")
    assert starts(s.decide(60).actions) == [Start("a", (0, 1, 2, 3))]
    assert s.jobs["b"].status is JobStatus.PENDING


def test_a_preempted_pre_run_is_still_a_pre_run() -> None:
    s = two_by_four()
    s.submit(spec("j", 4, precheck_s=300.0), 0)
    s.decide(0)
    s.evict("j", 20, by="someone")
    job = s.jobs["j"]
    assert job.gpus == 1 and job.work_done_s == 0.0 and job.preemptions == 1
    again = s.decide(20)
    assert again.actions == [Start("j", (4,), precheck=True)]  # node 1: free longer
    assert again.wake_at == 320.0


def test_cancel_during_the_pre_run() -> None:
    s = two_by_four()
    s.submit(spec("r", 4, precheck_s=300.0), 0)
    s.submit(spec("w", 4, precheck_s=300.0), 0)
    s.take_offline(range(1, 8))  # only GPU 0: w's pre-run waits
    s.decide(0)
    running, waiting = s.cancel("r", 30), s.cancel("w", 30)
    for job in (running, waiting):
        assert job.status is JobStatus.CANCELLED and job.gpus == 4
    assert running.attained_gpu_s == 30.0 and running.lost_gpu_s == 0.0
    assert s.cluster.free_gpus == 1 and s.decide(30).wake_at is None
    assert s.progressed("r", 40) is None
    assert counters(s) == (1, 0, 0)


# -- the cluster's default, and refusals -----------------------------------------------------------


def test_the_cluster_default_applies_to_jobs_whose_spec_names_none() -> None:
    built = build_scheduler(
        config_from_mapping({"policy": "fifo", "placement": "consolidate", "precheck_s": 120}),
        Services(Cluster.shorthand(2, 4)),
    )
    assert isinstance(built, Scheduler) and built.lifecycle.default_s == 120.0  # type: ignore[attr-defined]
    built.submit(spec("default", 4), 0)
    built.submit(spec("own", 4, precheck_s=600.0), 0)
    built.submit(spec("off", 4, precheck_s=0.0), 0)
    decision = built.decide(0)
    assert {a.job_id: (len(a.gpus), a.precheck) for a in starts(decision.actions)} == {
        "default": (1, True),
        "own": (1, True),
        "off": (4, False),
    }
    assert decision.wake_at == 120.0
    off = build_scheduler(config_from_mapping({"precheck_s": 0}), Services(Cluster.shorthand(1, 4)))
    assert isinstance(off, Scheduler) and off.lifecycle.default_s is None  # type: ignore[attr-defined]


def test_a_negative_precheck_is_refused() -> None:
    s = two_by_four()
    with pytest.raises(JobRefused, match="precheck_s must be a number >= 0"):
        s.submit(spec("j", 4, precheck_s=-1.0), 0)
    with pytest.raises(OptionError, match="precheck_s"):
        config_from_mapping({"precheck_s": -5})


# -- the other schedulers --------------------------------------------------------------------------

TWO_VCS = {
    "cell_types": {"NODE": {"child": "V100", "count": 4, "node": True}},
    "physical_cells": [{"type": "NODE", "count": 2}],
    "virtual_clusters": {"a": {"NODE": 1}, "b": {"NODE": 1}},
}


def test_hived_runs_the_pre_run_in_the_vc_and_gives_back_physical_gpus() -> None:
    parsed = parse_cluster_config(TWO_VCS)
    s = HivedScheduler(
        parsed.cluster,
        parsed.virtual_clusters,
        make_policy("fifo"),
        make_placement("consolidate"),
        precheck_s=300.0,
    )
    s.submit(JobSpec(id="j", submit_time=0, gpus=4, vc="a", duration_s=100.0), 0)
    first = s.decide(0)
    (pre,) = starts(first.actions)
    assert pre.precheck and len(pre.gpus) == 1 and first.wake_at == 300.0
    assert s.cluster.free_gpus == 7
    stop = s.progressed("j", 60)
    assert stop is not None and stop.precheck and stop.gpus == pre.gpus  # physical GPUs
    assert s.cluster.free_gpus == 8
    (full,) = starts(s.decide(60).actions)
    assert len(full.gpus) == 4 and not full.precheck
    assert s.progressed("j", 61) is None
    assert counters(s) == (1, 1, 0)


def test_hived_passes_a_pre_run_by_its_timer() -> None:
    parsed = parse_cluster_config(TWO_VCS)
    s = HivedScheduler(
        parsed.cluster, parsed.virtual_clusters, make_policy("fifo"), make_placement("consolidate")
    )
    s.submit(JobSpec(id="j", submit_time=0, gpus=4, vc="b", duration_s=100.0, precheck_s=50), 0)
    (pre,) = starts(s.decide(0).actions)
    due = s.decide(50)
    assert [type(a) for a in due.actions] == [Preempt, Start]
    assert due.actions[0] == Preempt("j", pre.gpus, PRECHECK_PASSED, precheck=True)
    assert len(due.actions[1].gpus) == 4 and s.cluster.free_gpus == 4


def test_hived_lends_idle_gpus_to_a_pre_run_and_takes_it_back_when_it_passes() -> None:
    # VC a's node holds the pre-runs of a0..a3 (one GPU each); a4's is lent GPU 4 of b's idle
    # node. When a4 passes, it goes back to a's queue (GPU 4 is free again), and is lent b's
    # whole node for its gang, a's own node being full.
    parsed = parse_cluster_config(TWO_VCS)
    s = HivedScheduler(
        parsed.cluster,
        parsed.virtual_clusters,
        make_policy("fifo"),
        make_placement("consolidate"),
        spill=True,
        precheck_s=300.0,
    )
    for i in range(5):
        s.submit(JobSpec(id=f"a{i}", submit_time=0, gpus=4, vc="a", duration_s=100.0), 0)
    assert [(a.job_id, a.gpus) for a in starts(s.decide(0).actions)] == [
        ("a0", (0,)),
        ("a1", (1,)),
        ("a2", (2,)),
        ("a3", (3,)),
        ("a4", (4,)),
    ]
    assert s.vc_of("a4") == "opportunistic"
    assert s.progressed("a4", 10) == Preempt("a4", (4,), PRECHECK_PASSED, precheck=True)
    assert s.vc_of("a4") == "a" and s.cluster.free_gpus == 4
    assert s.decide(10).actions == [Start("a4", (4, 5, 6, 7))]
    assert s.cluster.free_gpus == 0


def test_elasticflow_runs_no_pre_run_and_refuses_a_default() -> None:
    s = ElasticScheduler(
        Cluster.shorthand(1, 4), make_placement("consolidate"), lambda job, gpus: float(gpus)
    )
    s.submit(
        JobSpec(
            id="e",
            submit_time=0,
            gpus=4,
            duration_s=100.0,
            deadline=1000.0,
            elastic=Elastic(1, 4, 4),
            precheck_s=300.0,
        ),
        0,
    )
    (start,) = starts(s.decide(0).actions)
    assert not start.precheck and len(start.gpus) == 4
    assert s.progressed("e", 60) is None and s.jobs["e"].status is JobStatus.RUNNING
    assert counters(s) == (0, 0, 0)
    with pytest.raises(PluginError, match="elasticflow does not run pre-runs"):
        build_scheduler(
            config_from_mapping({"policy": "elasticflow", "precheck_s": 300}),
            Services(Cluster.shorthand(1, 4), throughput=lambda job, gpus: float(gpus)),
        )


def test_a_job_adopted_in_its_pre_run_goes_on_with_it() -> None:
    # Another scheduler (a HiveD VC lending it out) withdrew the waiting job in its pre-run.
    s, other = two_by_four(), two_by_four()
    s.submit(spec("j", 4, precheck_s=300.0), 0)
    moved: Job = s.withdraw("j", 0)
    other.adopt(moved, 0)
    assert other.decide(0).actions == [Start("j", (0,), precheck=True)]
    assert other.progressed("j", 10) is not None and moved.gpus == 4
