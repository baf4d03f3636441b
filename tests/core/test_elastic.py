"""ElasticFlow in the core (core.elastic) and the edf baseline, on hand-worked scenarios."""

from __future__ import annotations

from dataclasses import replace

import pytest

from corral.core import Cluster, JobRefused, JobSpec, JobStatus, Preempt
from corral.core.elastic import Curve, Demand, ElasticScheduler, allowed_sizes, plan, scaling_curve
from corral.core.job import Elastic, Job
from corral.core.placement import make_placement
from tests.core.helpers import scheduler, spec, started

# Throughputs in steps/s; only their ratios matter. "m" scales with diminishing returns.
CURVES: dict[str, dict[int, float]] = {
    "m": {1: 1.0, 2: 1.8, 4: 3.2, 8: 5.6, 16: 8.0},
    "steep": {1: 1.0, 2: 1.9, 4: 3.6, 8: 6.4},
    "mid": {1: 1.0, 2: 1.7, 4: 3.0, 8: 5.0},
    "flat": {1: 1.0, 2: 1.5, 4: 1.8, 8: 2.0},
    # measured slower on 4 GPUs than on 2, as Gavel measured some LM jobs
    "dip": {1: 1.0, 2: 2.0, 4: 1.5, 8: 7.0},
}


def throughput(job: Job, gpus: int) -> float:
    return CURVES[job.spec.model][gpus]


def elastic(
    job_id: str,
    work: float,
    deadline: float | None,
    model: str = "m",
    submit: float = 0.0,
    base: int = 1,
    min_gpus: int = 1,
    max_gpus: int = 8,
) -> JobSpec:
    return JobSpec(
        id=job_id,
        submit_time=submit,
        gpus=base,
        model=model,
        duration_s=work,
        deadline=deadline,
        elastic=Elastic(min_gpus, max_gpus, base),
    )


def make(nodes: int, gpus: int, restore_s: float = 0.0) -> ElasticScheduler:
    return ElasticScheduler(
        Cluster.shorthand(nodes, gpus),
        make_placement("consolidate"),
        throughput,
        restore_s=restore_s,
    )


def sizes(actions: list) -> dict[str, int]:
    return {job_id: len(gpus) for job_id, gpus in started(actions).items()}


def preempted(actions: list) -> list[str]:
    return [a.job_id for a in actions if isinstance(a, Preempt)]


# -- the scaling curve and the minimum satisfactory share ----------------------------------------


def test_allowed_sizes_are_powers_of_two_and_the_count_asked_for():
    assert allowed_sizes(1, 24, 24) == [1, 2, 4, 8, 16, 24]
    assert allowed_sizes(2, 8, 4) == [2, 4, 8]
    assert allowed_sizes(3, 3, 3) == [3]


def test_a_count_no_faster_than_a_smaller_one_is_left_out_of_the_curve():
    # "dip" runs at 1.5 on 4 GPUs, slower than 2.0 on 2: the curve keeps 1, 2 and 8 only. Speeds
    # are relative to the count the job asked for (2 GPUs: throughput 2.0).
    job = Job(spec=elastic("d", 100, None, model="dip", base=2))
    curve = scaling_curve(job, throughput, capacity=8)
    assert curve == Curve((1, 2, 8), (0.5, 1.0, 3.5))
    # on a 4-GPU cluster the 8 goes too
    assert scaling_curve(job, throughput, capacity=4).sizes == (1, 2)


def test_minimum_satisfactory_share_from_the_curve_and_the_deadline():
    # 1000 s of work (on 1 GPU) due in 600 s: it needs 1000/600 = 1.67 ideal seconds per second.
    # 1 GPU gives 1.0 (ends at 1000), 2 GPUs 1.8 (ends at 555.6): the share is 2 GPUs.
    curve = Curve((1, 2, 4, 8), (1.0, 1.8, 3.2, 5.6))
    (share,) = plan([Demand("a", deadline=600, work_s=1000, curve=curve)], 8, now=0).values()
    assert (share.min_share, share.now_gpus, share.feasible) == (2, 2, True)
    assert share.finish == pytest.approx(1000 / 1.8)
    # due in 300 s instead: 3.33 per second needs 8 GPUs (5.6; 4 GPUs give only 3.2)
    (share,) = plan([Demand("a", deadline=300, work_s=1000, curve=curve)], 8, now=0).values()
    assert share.min_share == 8
    # due in 150 s: not even 8 GPUs (178.6 s) make it
    (share,) = plan([Demand("a", deadline=150, work_s=1000, curve=curve)], 8, now=0).values()
    assert share.feasible is False and share.finish == pytest.approx(1000 / 5.6)


def test_the_scheduler_gives_the_share_then_the_leftover_and_starts_the_job():
    # The same job on an empty 8-GPU node: share 2, and the 6 GPUs left go to it step by step
    # (2 -> 4 gains (3.2 - 1.8) / 2 = 0.7 per GPU, 4 -> 8 gains 0.6): it starts on 8 GPUs.
    s = make(1, 8)
    s.submit(elastic("a", 1000, 600), 0)
    decision = s.decide(0)
    assert sizes(decision.actions) == {"a": 8}
    share = s.share_of("a")
    assert share is not None and (share.min_share, share.now_gpus) == (2, 2)
    a = s.jobs["a"]
    assert a.speed == pytest.approx(5.6)  # relative to the 1 GPU its work is counted on
    assert a.remaining_wall_s(0) == pytest.approx(1000 / 5.6)
    assert "minimum satisfactory share 2 GPUs" in s.explain("a", 0)


# -- admission control ----------------------------------------------------------------------------


def admitted_pair() -> ElasticScheduler:
    """4 GPUs; A: 1000 s due at 400; B: 100 s due at 200 (curve "m": 1, 1.8, 3.2)."""
    s = make(1, 4)
    s.submit(elastic("A", 1000, 400), 0)
    s.submit(elastic("B", 100, 200), 0)
    return s


def test_a_job_is_admitted_when_every_deadline_still_holds():
    # A alone needs 1000/400 = 2.5 per second: 4 GPUs (3.2; 2 GPUs give 1.8), ends at 312.5.
    # B (earlier deadline, planned first) needs 0.5: 1 GPU on [0, 100). A then gets what is
    # left: 2 GPUs (3 free, 4 is too many) on [0, 100) = 180 s of work, then 4 GPUs: 820 / 3.2
    # = 256.25 s, ending at 356.25 <= 400. Both are admitted.
    s = admitted_pair()
    assert s.jobs["A"].status is JobStatus.PENDING
    assert s.jobs["B"].status is JobStatus.PENDING
    decision = s.decide(0)
    # Shares now: B 1, A 2 (one GPU left): B's step 1 -> 2 gains 0.8 per GPU; A's 2 -> 4 needs 2.
    assert sizes(decision.actions) == {"A": 2, "B": 2}
    assert s.share_of("A").min_share == 4  # type: ignore[union-attr]
    assert s.share_of("A").finish == pytest.approx(356.25)  # type: ignore[union-attr]
    assert s.tally.admitted == 2 and s.tally.refused == 0


def test_a_job_that_would_break_an_admitted_deadline_is_refused_and_never_runs():
    # C: 300 s due at 350, on its own feasible (1 GPU ends at 300). Planned in deadline order
    # B, C, A: B 1 GPU on [0, 100), C 1 GPU on [0, 300); A gets 2 GPUs on [0, 300) (2 and then 3
    # free) = 540 s of work, then 4 GPUs: 460 / 3.2 = 143.75 s, ending at 443.75 > 400.
    s = admitted_pair()
    c = s.submit(elastic("C", 300, 350), 0)
    assert c.status is JobStatus.REFUSED
    assert c.finished_at == 0
    assert "would make 1 admitted job(s) miss" in s.explain("C", 0)
    # D: 1000 s due at 100: even the whole cluster (4 GPUs, 312.5 s) is too slow.
    d = s.submit(elastic("D", 1000, 100), 0)
    assert d.status is JobStatus.REFUSED
    assert "cannot be met even on 4 GPUs of an empty cluster" in d.last_event
    assert (s.tally.refused, s.tally.refused_alone) == (2, 1)
    for now in (0, 10):
        assert set(started(s.decide(now).actions)) <= {"A", "B"}
    assert s.jobs["C"].attempts == 0 and s.jobs["D"].attempts == 0
    assert s.pending_count + s.running_count == 2
    assert s.cancel("C", 10).status is JobStatus.REFUSED  # nothing to cancel
    # withdrawn (a shell that could not store it), a refused job is only forgotten
    assert s.withdraw("C", 10).status is JobStatus.REFUSED
    assert "C" not in s.jobs and s.pending_count + s.running_count == 2


def test_a_job_without_a_deadline_gets_no_share_only_what_is_left_over():
    # E has no deadline: admitted without a check, with no share. A and B take 3 GPUs of their
    # shares; the last one goes to E: starting it gains 1.0 per GPU, more than B's 0.8 (1 -> 2).
    s = admitted_pair()
    s.submit(elastic("E", 50, None), 0)
    assert sizes(s.decide(0).actions) == {"A": 2, "B": 1, "E": 1}
    # a fourth job without a deadline waits: no GPU is left
    s.submit(elastic("F", 50, None), 1)
    assert s.decide(1).actions == []
    assert "earlier deadlines" in s.jobs["F"].pending_reason
    assert "best effort (no deadline)" in s.explain("F", 1)


def test_a_job_that_cannot_make_its_deadline_is_planned_after_the_others():
    # On 1 GPU: X (1000 s due at 100) cannot make it; Y (150 s due at 200) can, if it goes
    # first. X is planned after Y, on what Y leaves: from t=150.
    curve = Curve((1,), (1.0,))
    shares = plan([Demand("X", 100, 1000, curve), Demand("Y", 200, 150, curve)], capacity=1, now=0)
    assert (shares["Y"].now_gpus, shares["Y"].feasible, shares["Y"].finish) == (1, True, 150)
    assert (shares["X"].now_gpus, shares["X"].feasible, shares["X"].finish) == (0, False, 1150)


# -- allocation by marginal return ----------------------------------------------------------------


def test_the_leftover_gpu_goes_to_the_job_that_gains_most_from_it():
    # 4 GPUs, three jobs with loose deadlines: shares of 1 GPU each leave 1 GPU. Going from 1
    # to 2 GPUs gains 0.9 (steep), 0.7 (mid), 0.5 (flat) per GPU, relative to 1 GPU.
    s = make(1, 4)
    s.submit(elastic("flat", 100, 10_000, model="flat"), 0)
    s.submit(elastic("mid", 100, 10_000, model="mid"), 0)
    s.submit(elastic("steep", 100, 10_000, model="steep"), 0)
    assert sizes(s.decide(0).actions) == {"flat": 1, "mid": 1, "steep": 2}


def test_equal_gains_go_to_the_earlier_deadline():
    s = make(1, 4)
    s.submit(elastic("late", 100, 9_000, model="steep"), 0)
    s.submit(elastic("soon", 100, 5_000, model="steep"), 0)
    s.submit(elastic("flat", 100, 10_000, model="flat"), 0)
    assert sizes(s.decide(0).actions) == {"late": 1, "soon": 2, "flat": 1}


# -- shrinking and growing ------------------------------------------------------------------------


def test_a_running_job_shrinks_to_admit_another_and_grows_back_keeping_its_work():
    # 4 GPUs, restore 10 s, curve "m" (1, 1.8, 3.2).
    s = make(1, 4, restore_s=10)
    # t=0: A (3200 s of work, loose deadline) alone: share 1 GPU, the 3 left make it 4: it runs
    # at 3.2 per second, a first start without restore.
    s.submit(elastic("A", 3200, 10_000), 0)
    assert sizes(s.decide(0).actions) == {"A": 4}
    a = s.jobs["A"]
    # t=100: A has done 320 s. B: 200 s due at 350 needs 0.8: 1 GPU, ends at 300. With B planned
    # first, A still meets its deadline on 1 GPU. Shares B 1, A 1, 2 GPUs left: B's and A's
    # steps 1 -> 2 both gain 0.8, B first (earlier deadline), then A. A shrinks 4 -> 2.
    b = s.submit(elastic("B", 200, 350, submit=100), 100)
    assert b.status is JobStatus.PENDING
    decision = s.decide(100)
    assert preempted(decision.actions) == ["A"]
    assert sizes(decision.actions) == {"A": 2, "B": 2}
    assert a.work_done_s == pytest.approx(320)  # kept through the checkpoint-restart
    assert a.stall_until == pytest.approx(110)  # resumed: restores for 10 s
    assert a.speed == pytest.approx(1.8) and b.speed == pytest.approx(1.8)
    assert s.tally.shrinks == 1
    # B ends at 100 + 200 / 1.8 = 211.11. A did 320 + 1.8 x (211.11 - 110) = 502 s. Its share
    # is 1 GPU but it keeps its 2; growing to 4 is worth it: 10 + 2698 / 3.2 = 853 s left
    # instead of 2698 / 1.8 = 1499 s.
    b_end = 100 + 200 / 1.8
    assert b.remaining_wall_s(100) == pytest.approx(b_end - 100)
    s.finished("B", b_end)
    assert a.work_done_at(b_end) == pytest.approx(502)
    decision = s.decide(b_end)
    assert preempted(decision.actions) == ["A"]
    assert sizes(decision.actions) == {"A": 4}
    assert a.work_done_s == pytest.approx(502)
    assert a.stall_until == pytest.approx(b_end + 10)
    assert a.remaining_wall_s(b_end) == pytest.approx(10 + 2698 / 3.2)
    assert s.tally.grows == 1
    assert a.attempts == 3 and a.preemptions == 2 and s.preemptions == 2
    # attained GPU time counts each attempt on its own count: 4 x 100 + 2 x 111.11
    assert a.attained_at(b_end) == pytest.approx(400 + 2 * (b_end - 100))
    end = b_end + 10 + 2698 / 3.2
    s.finished("A", end)
    assert a.status is JobStatus.SUCCEEDED and a.spec.gpus == 1  # reports show what it asked


def test_a_running_job_does_not_grow_when_the_restart_costs_more_than_it_saves():
    # A (18 s of work) and B share 4 GPUs, 2 each (both steps 1 -> 2 gain 0.8 per GPU). B ends
    # at 5, when A has 9 s left on 2 GPUs (5 s at 1.8 a second): on 4 it would need 10 s of
    # restore + 9 / 3.2 = 12.8 s instead of 9 / 1.8 = 5 s. It keeps its 2 GPUs.
    s = make(1, 4, restore_s=10)
    s.submit(elastic("A", 18, 10_000), 0)
    s.submit(elastic("B", 1000, 10_000), 0)
    assert sizes(s.decide(0).actions) == {"A": 2, "B": 2}
    s.finished("B", 5)
    assert s.decide(5).actions == []
    assert s.jobs["A"].gpus == 2 and s.tally.grows == 0


def test_running_jobs_migrate_when_free_gpus_are_too_scattered_for_a_share():
    # 2 nodes x 4 GPUs, gangs of exactly 2 or 4 (min = max). X, Y, W (2 GPUs each) start at 0:
    # X on node 0, Y beside it (the tightest node), W on node 1. Y ends at 10: 2 GPUs free on
    # each node. Z (4 GPUs, 100 s due at 160) is admitted, but no node has 4 free: X moves to
    # node 1 (a checkpoint-restart, counted as a migration, not a preemption) and Z takes node 0.
    s = make(2, 4)
    for name, work in (("X", 1000), ("Y", 10), ("W", 1000)):
        s.submit(elastic(name, work, 100_000, base=2, min_gpus=2, max_gpus=2), 0)
    s.decide(0)
    node_of = s.cluster.gpu_node
    assert [node_of[s.jobs[n].placement[0]] for n in "XYW"] == [0, 0, 1]
    s.finished("Y", 10)
    assert s.decide(10).actions == []
    s.submit(elastic("Z", 100, 160, submit=10, base=4, min_gpus=4, max_gpus=4), 10)
    decision = s.decide(10)
    assert preempted(decision.actions) == ["X"]
    assert sizes(decision.actions) == {"X": 2, "Z": 4}
    assert {node_of[g] for g in s.jobs["Z"].placement} == {0}
    assert {node_of[g] for g in s.jobs["X"].placement} == {1}
    assert s.migration is not None and s.migration.migrations == 1
    assert s.jobs["X"].preemptions == 0


# -- edge cases -----------------------------------------------------------------------------------


def test_an_empty_cluster_decides_nothing():
    s = make(1, 8)
    decision = s.decide(0)
    assert decision.actions == [] and decision.wake_at is None
    assert plan([], 8, 0) == {}


def test_a_job_bigger_than_the_cluster():
    s = make(1, 8)
    # Elastic, asks for 16: it may run on fewer. Relative to 16 GPUs (8.0), 4 GPUs run at 0.4
    # and 8 at 0.7: 8000 s of work due in 30000 needs 0.27, a share of 4; the 4 GPUs left make
    # it 8.
    job = s.submit(elastic("big", 8000, 30_000, base=16, max_gpus=16), 0)
    assert job.status is JobStatus.PENDING
    assert sizes(s.decide(0).actions) == {"big": 8}
    assert s.jobs["big"].speed == pytest.approx(5.6 / 8.0)
    # elastic but never on fewer than 16, or a fixed gang of 16: refused as impossible
    with pytest.raises(JobRefused, match="needs at least 16 GPUs but the cluster has only 8"):
        s.submit(elastic("rigid", 10, 100, base=16, min_gpus=16, max_gpus=16), 0)
    with pytest.raises(JobRefused, match="needs at least 16 GPUs"):
        s.submit(spec("fixed", 16, deadline=100.0), 0)
    with pytest.raises(JobRefused, match="already exists"):
        s.submit(elastic("big", 10, 100), 0)


def test_a_bad_scaling_curve_is_refused_with_the_job_named():
    s = ElasticScheduler(Cluster.shorthand(1, 8), make_placement("consolidate"), lambda job, g: 0.0)
    with pytest.raises(ValueError, match="job z: throughput on its 1 GPUs must be positive"):
        s.submit(elastic("z", 10, 100), 0)


def test_a_deadline_already_past_is_refused():
    s = make(1, 8)
    assert s.submit(elastic("old", 10, 50, submit=0), 60).status is JobStatus.REFUSED


# -- the edf baseline -----------------------------------------------------------------------------


def test_edf_runs_the_earliest_deadlines_and_preempts_later_ones():
    # 2 GPUs; a (due 500), b (due 300), c (due 100), n (no deadline) arrive at 0 in that order:
    # c and b run. At 10, d (due 50) preempts b, the running job due last.
    s = scheduler(1, 2, policy="edf")
    for name, deadline in (("a", 500.0), ("b", 300.0), ("c", 100.0), ("n", None)):
        s.submit(spec(name, 1, deadline=deadline), 0)
    assert sorted(started(s.decide(0).actions)) == ["b", "c"]
    assert [job.id for job in s.pending_jobs()] == ["a", "n"]
    s.submit(spec("d", 1, submit=10, deadline=50.0), 10)
    decision = s.decide(10)
    assert preempted(decision.actions) == ["b"]
    assert list(started(decision.actions)) == ["d"]
    assert "deadline in 490s" in s.explain("a", 10)
    assert "no deadline" in s.explain("n", 10)


def test_edf_ties_go_by_arrival_and_a_tie_never_preempts():
    s = scheduler(1, 1, policy="edf")
    s.submit(spec("first", 1, deadline=100.0), 0)
    s.submit(spec("second", 1, deadline=100.0), 0)
    assert list(started(s.decide(0).actions)) == ["first"]
    s.submit(spec("third", 1, submit=5, deadline=100.0), 5)
    assert s.decide(5).actions == []
    s.finished("first", 1000)
    assert list(started(s.decide(1000).actions)) == ["second"]


def test_a_failed_elastic_job_waits_out_its_retry_backoff():
    # One job of 100 s of work, no deadline (best effort), on 1 node x 4. It fails at t=10: the
    # core's retry rule holds it 5 s (the first backoff), so nothing starts before t=15.
    s = make(1, 4)
    s.submit(replace(elastic("a", 100.0, None), max_retries=1), 0)
    assert sizes(s.decide(0).actions)
    s.failed("a", 10.0, "exit 1")
    decision = s.decide(10.0)
    assert sizes(decision.actions) == {} and decision.wake_at == 15.0
    assert "retry backoff" in s.explain("a", 10.0)
    assert sizes(s.decide(15.0).actions) == {"a": 4}
