"""Node failures and Philly's failure classes in the simulator, judged by the core's retry rule."""

from __future__ import annotations

import pytest

from corral.core import Cluster, JobSpec, JobStatus, Scheduler
from corral.core.admission.hived import HivedScheduler
from corral.core.config import parse_cluster_config
from corral.core.placement import make_placement
from corral.core.policy import make_policy
from corral.core.retry import RetryOptions, RetryRule
from corral.sim.engine import FailureModel, Simulation
from corral.sim.failures import INFRA_FAILURE, USER_ERROR, NodeFailures, PhillyFailures


def spec(job_id: str, gpus: int, submit: float, duration: float, **kw: object) -> JobSpec:
    return JobSpec(id=job_id, submit_time=submit, gpus=gpus, duration_s=duration, **kw)  # type: ignore[arg-type]


def simulation(
    specs: list[JobSpec], nodes: int = 1, gpus: int = 4, retry: RetryRule | None = None, **kw
) -> Simulation:
    cluster = Cluster.shorthand(nodes, gpus)
    policy, placement = make_policy("fifo"), make_placement("consolidate")
    scheduler = Scheduler(
        cluster, policy, placement, restore_s=kw.pop("restore_s", 0.0), retry=retry
    )
    return Simulation(specs, scheduler, **kw)


class Scripted:
    """Node failures at given times: `up` and `down` are the durations handed out in turn (the
    engine asks for each node's first up time in node order, then as events happen)."""

    def __init__(self, up: list[float], down: list[float]) -> None:
        self.up, self.down = list(up), list(down)

    def up_for(self, rng: object) -> float:
        return self.up.pop(0)

    def down_for(self, rng: object) -> float:
        return self.down.pop(0)


NEVER = 1e12


def many_jobs(n: int = 12) -> list[JobSpec]:
    return [spec(f"j{i}", 1 + i % 2, i * 60.0, 600.0 + 100 * (i % 3)) for i in range(n)]


# -- node failures ---------------------------------------------------------------------------------


def test_a_job_on_a_failed_node_waits_for_it_and_resumes_from_scratch() -> None:
    # One node of 2 GPUs: it fails at 100 and is back at 150. The 2-GPU job loses its 100 s
    # attempt (an infrastructure failure: its retries untouched), is held 5 s (until 105), then
    # waits for the node; it resumes at 150, restores for 10 s and does all 1000 s again.
    sim = simulation(
        [spec("a", 2, 0, 1000)],
        nodes=1,
        gpus=2,
        restore_s=10.0,
        node_failures=Scripted(up=[100, NEVER], down=[50]),
    )
    result = sim.run()
    (a,) = result.jobs
    assert (a.status, a.failures, a.infra_failures, a.attempts) == (JobStatus.SUCCEEDED, 0, 1, 2)
    assert a.finished_at == pytest.approx(1160)
    assert sim.node_log == [(100, 0, True), (150, 0, False)]
    assert result.annotations["node_failures"] == 1
    assert result.annotations["infra_failed_attempts"] == 1
    assert result.annotations["gpu_hours_lost"] == pytest.approx(2 * 100 / 3600)
    # While the node is down its GPUs are not counted as in use.
    timeline = result.timeline
    assert timeline.allocated_gpus[timeline.time_s.index(100)] == 0
    assert timeline.allocated_gpus[timeline.time_s.index(150)] == 2


def test_a_job_on_a_failed_node_moves_to_another_after_its_backoff() -> None:
    # Two nodes of 2 GPUs; the job starts on node 0 (consolidate: the first of equally full
    # nodes). Node 0 fails at 100 for good: the job is held 5 s and resumes on node 1 at 105.
    sim = simulation(
        [spec("a", 2, 0, 1000)],
        nodes=2,
        gpus=2,
        node_failures=Scripted(up=[100, NEVER], down=[NEVER]),
    )
    result = sim.run()
    (a,) = result.jobs
    assert a.status is JobStatus.SUCCEEDED and a.infra_failures == 1
    assert a.finished_at == pytest.approx(1105)
    assert sim.node_log == [(100, 0, True)]  # nothing after the last job ended


def test_with_a_tiny_mtbf_every_job_still_finishes_and_the_lost_gpu_time_adds_up() -> None:
    # Nodes fail every 10 minutes on average, as long as the jobs: many attempts fail. With
    # fast_fail_s 0 no failure is "fast", so none ends a job, and node failures use up no retry
    # (max_retries 0): every job succeeds. FIFO without preemption, speed 1 and no restore: a
    # job's last attempt does its whole duration, so the GPU time lost is all the GPU time run
    # beyond the jobs' own.
    specs = many_jobs()
    sim = simulation(
        specs,
        nodes=4,
        gpus=2,
        retry=RetryRule(RetryOptions(fast_fail_s=0.0)),
        node_failures=NodeFailures(mtbf_s=600.0, mttr_s=120.0),
        seed=3,
    )
    result = sim.run()
    assert all(job.status is JobStatus.SUCCEEDED for job in result.jobs)
    assert all(job.failures == 0 for job in result.jobs)
    infra = sum(job.infra_failures for job in result.jobs)
    assert infra > 0 and result.annotations["infra_failed_attempts"] == infra
    assert result.annotations["failed_attempts"] == infra
    assert result.annotations["node_failures"] == sum(down for _, _, down in sim.node_log) > 0
    run_gpu_s = sum(job.attained_gpu_s for job in result.jobs)
    useful_gpu_s = sum(s.gpus * s.duration_s for s in specs)  # type: ignore[operator]
    lost_h = result.annotations["gpu_hours_lost"]
    assert lost_h == pytest.approx((run_gpu_s - useful_gpu_s) / 3600) and lost_h > 0
    # No node event after the last job ended, and the run stops there.
    last_end = max(job.finished_at for job in result.jobs)  # type: ignore[type-var]
    assert all(at <= last_end for at, _, _ in sim.node_log)
    assert result.timeline.time_s[-1] == last_end


def test_with_the_default_rule_every_job_ends_succeeded_or_lost() -> None:
    # The default rule also ends a job whose attempts die fast, the same way, three times in a
    # row (here: the same node failing each time within 60 s): "lost", not left waiting.
    result = simulation(
        many_jobs(), nodes=4, gpus=2, node_failures=NodeFailures(120.0, 30.0), seed=2
    ).run()
    for job in result.jobs:
        assert job.status.finished
        if job.status is not JobStatus.SUCCEEDED:
            assert job.verdict is not None and job.verdict.reason.startswith("lost: ")
    failed = sum(job.status is JobStatus.FAILED for job in result.jobs)
    assert result.annotations["lost_jobs"] == failed and result.annotations["user_error_jobs"] == 0


def test_node_failures_are_the_same_for_a_seed_and_leave_job_failure_draws_alone() -> None:
    def outcome(seed: int, nodes: NodeFailures | None, failures=None):
        sim = simulation(
            many_jobs(), nodes=4, gpus=2, node_failures=nodes, failures=failures, seed=seed
        )
        result = sim.run()
        jobs = [(j.id, j.status, j.finished_at, j.attempts) for j in result.jobs]
        return sim.node_log, jobs

    flaky = NodeFailures(900.0, 60.0)
    assert outcome(5, flaky) == outcome(5, flaky)
    assert outcome(5, flaky)[0] != outcome(6, flaky)[0]
    # Nodes that never fail within the run: the job failures drawn are those of a run without
    # node failures (their own random stream).
    model = FailureModel(rate=0.2)
    assert outcome(5, NodeFailures(NEVER, 1.0), model)[1] == outcome(5, None, model)[1]


def test_node_failures_with_hived_end_cleanly() -> None:
    config = {
        "cell_types": {"NODE": {"child": "V100", "count": 4, "node": True}},
        "physical_cells": [{"type": "NODE", "count": 3}],
        "virtual_clusters": {"a": {"NODE": 1}, "b": {"NODE": 1}},
    }
    parsed = parse_cluster_config(config)
    policy, placement = make_policy("fifo"), make_placement("consolidate")
    scheduler = HivedScheduler(parsed.cluster, parsed.virtual_clusters, policy, placement)
    specs = [spec(f"{vc}{i}", 2, i * 30.0, 500.0, vc=vc) for i in range(6) for vc in "ab"]
    sim = Simulation(
        specs,
        scheduler,
        node_failures=NodeFailures(400.0, 100.0),
        seed=2,
    )
    result = sim.run()
    assert all(job.status.finished for job in result.jobs)
    assert result.annotations["infra_failed_attempts"] == sum(
        job.infra_failures for job in result.jobs
    )


def test_node_failures_parse_and_check_their_numbers() -> None:
    assert NodeFailures.parse("86400, 3600") == NodeFailures(86400.0, 3600.0)
    for bad in ("86400", "a,b", "0,10", "10,-1"):
        with pytest.raises(ValueError, match="node.failures"):
            NodeFailures.parse(bad)


# -- Philly's failure classes ----------------------------------------------------------------------


def test_a_user_error_job_ends_failed_after_exactly_three_fast_attempts() -> None:
    # Every job has a user error within 10..50 s; infrastructure failures practically never.
    # Attempt 1 fails at u; held 5 s; attempt 2 runs u..; held 10 s; attempt 3 fails and the
    # rule ends the job: at 3u + 15, whatever its max_retries.
    philly = PhillyFailures(user_error_share=1.0, user_error_s=(10.0, 50.0), infra_mtbf_gpu_h=1e12)
    sim = simulation([spec("a", 1, 0, 3600), spec("b", 1, 0, 3600)], failures=philly)
    u = sim.user_errors["a"]
    assert 10 <= u <= 50 and set(sim.user_errors) == {"a", "b"}
    result = sim.run()
    jobs = {job.id: job for job in result.jobs}
    a = jobs["a"]
    assert (a.status, a.attempts, a.failures, a.spec.max_retries) == (JobStatus.FAILED, 3, 3, 3)
    assert a.finished_at == pytest.approx(3 * u + 15)
    assert a.last_event == (
        f"failed: user error: the same failure 3 times in a row, each within 60 s ({USER_ERROR})"
    )
    assert jobs["b"].status is JobStatus.FAILED and jobs["b"].attempts == 3
    assert result.annotations["user_error_jobs"] == 2
    assert result.annotations["failed_attempts"] == 6
    assert result.annotations["infra_failed_attempts"] == 0


def test_the_rule_tolerates_as_many_repeats_as_its_options_say() -> None:
    philly = PhillyFailures(user_error_share=1.0, user_error_s=(10.0, 50.0), infra_mtbf_gpu_h=1e12)
    rule = RetryRule(RetryOptions(fast_fail_repeats=4))
    result = simulation([spec("a", 1, 0, 3600)], failures=philly, retry=rule).run()
    (a,) = result.jobs
    # max_retries 3 comes first: the 4th failure exceeds it, before a 5th could end it as a
    # user error.
    assert (a.status, a.attempts) == (JobStatus.FAILED, 4)
    assert a.last_event == f"failed: {USER_ERROR}"
    assert result.annotations["user_error_jobs"] == 0
    # The plain scheduler a Simulation builds takes the rule too: no repeat tolerated.
    cluster = Cluster.shorthand(1, 4)
    sim = Simulation(
        [spec("b", 1, 0, 3600)],
        Scheduler(
            cluster,
            make_policy("fifo"),
            make_placement("consolidate"),
            retry=RetryRule(RetryOptions(fast_fail_repeats=0)),
        ),
        failures=philly,
    )
    (b,) = sim.run().jobs
    assert (b.status, b.attempts) == (JobStatus.FAILED, 1)


def test_a_slow_user_error_is_retried_until_max_retries() -> None:
    philly = PhillyFailures(user_error_share=1.0, user_error_s=(90.0, 100.0), infra_mtbf_gpu_h=1e12)
    result = simulation([spec("a", 1, 0, 3600)], failures=philly).run()
    (a,) = result.jobs
    assert (a.status, a.attempts, a.failures) == (JobStatus.FAILED, 4, 4)
    assert a.last_event == f"failed: {USER_ERROR}"


def test_infrastructure_failures_never_fail_a_job_by_themselves() -> None:
    # One infrastructure failure per half GPU-hour: a 1-hour job fails twice per attempt on
    # average; each failure has its own signature and uses up no retry (max_retries 0).
    philly = PhillyFailures(user_error_share=0.0, infra_mtbf_gpu_h=0.5, max_retries=0)
    specs = [spec(f"j{i}", 1 + i % 2, i * 100.0, 3600.0) for i in range(6)]
    result = simulation(specs, failures=philly, seed=4).run()
    assert all(job.status is JobStatus.SUCCEEDED for job in result.jobs)
    assert all(job.failures == 0 for job in result.jobs)
    infra = sum(job.infra_failures for job in result.jobs)
    assert infra > 0 and result.annotations["infra_failed_attempts"] == infra
    signatures = [f.signature for job in result.jobs for f in job.failure_history]
    assert all(s.startswith(INFRA_FAILURE) for s in signatures)
    for job in result.jobs:
        mine = [f.signature for f in job.failure_history]
        assert len(set(mine)) == len(mine)  # never alike twice


def test_user_errors_are_drawn_once_per_job_and_the_same_for_a_seed() -> None:
    import numpy as np

    philly = PhillyFailures(user_error_share=0.1)
    specs = [spec(f"j{i}", 1, i, 100) for i in range(2000)]
    first = philly.user_errors(specs, np.random.default_rng(1))
    assert first == philly.user_errors(specs, np.random.default_rng(1))
    # Binomial(2000, 0.1): mean 200, standard deviation about 13.
    assert 150 <= len(first) <= 250
    assert all(5.0 <= t <= 120.0 for t in first.values())


def test_the_failure_rate_model_is_random_never_a_user_error() -> None:
    # Every attempt of a 30 s job fails, within 30 s: fast, but each unlike the last, so only
    # max_retries (5) ends the job, after 6 attempts.
    result = simulation(
        [spec("a", 1, 0, 30)], failures=FailureModel(rate=1.0, max_retries=5, cap=1.0)
    ).run()
    (a,) = result.jobs
    assert (a.status, a.attempts, a.failures) == (JobStatus.FAILED, 6, 6)
    assert a.last_event == "failed: simulated failure"
    assert result.annotations["user_error_jobs"] == 0


def test_without_failures_a_run_has_no_failure_entries() -> None:
    result = simulation(many_jobs()).run()
    assert result.annotations == {}
