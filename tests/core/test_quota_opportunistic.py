"""quota and fairshare act on `priority: opportunistic`: idle GPUs only, reclaimed first, never
preempting, placed after the round's guaranteed jobs, and not charged to a VC's fair share.

Every scenario is a cluster of 2 nodes x 4 GPUs shared by VCs a and b with a quota of 4 GPUs
each, fifo (which never preempts for priority) unless said otherwise, consolidated placement.
"""

from __future__ import annotations

import math

import pytest

from corral.core import Cluster, JobRefused, JobSpec, Preempt, Scheduler, Start
from corral.core.admission.fairshare import FairShareAdmission
from corral.core.admission.quota import QuotaAdmission
from corral.core.job import JobStatus, Priority
from corral.core.placement import make_placement
from corral.core.policy import make_policy

NODE0 = (0, 1, 2, 3)
NODE1 = (4, 5, 6, 7)


def quota_counters(s: Scheduler) -> dict[str, int]:
    """The counters of what this file tests (the scheduler keeps others: pre-runs, packing)."""
    counters = s.counters()
    return {k: counters[k] for k in ("preemptions", "borrowed_starts", "opportunistic_starts")}


def scheduler(
    oversubscribe: bool = True, lend_last: bool = True, policy: str = "fifo"
) -> Scheduler:
    return Scheduler(
        Cluster.shorthand(2, 4),
        make_policy(policy),
        make_placement("consolidate"),
        admission=QuotaAdmission(
            {"a": 4, "b": 4}, oversubscribe=oversubscribe, lend_last=lend_last
        ),
    )


def fair_scheduler(half_life_s: float = 0.0) -> Scheduler:
    admission = FairShareAdmission({"a": 1.0, "b": 1.0}, total_gpus=8, half_life_s=half_life_s)
    return Scheduler(
        Cluster.shorthand(2, 4),
        make_policy("fifo"),
        make_placement("consolidate"),
        admission=admission,
    )


def job(job_id: str, vc: str, gpus: int = 4, submit: float = 0.0, opp: bool = False) -> JobSpec:
    priority = Priority.OPPORTUNISTIC if opp else Priority.GUARANTEED
    return JobSpec(
        id=job_id, submit_time=submit, gpus=gpus, vc=vc, duration_s=1e6, priority=priority
    )


def submit(s: Scheduler, *specs: JobSpec) -> None:
    for spec in specs:
        s.submit(spec, spec.submit_time)


def starts(decision) -> list[str]:
    return [a.job_id for a in decision.actions if isinstance(a, Start)]


def admission_of(s: Scheduler) -> QuotaAdmission:
    (admission,) = s.admission.members
    assert isinstance(admission, QuotaAdmission)
    return admission


@pytest.mark.parametrize("oversubscribe", [True, False])
def test_an_opportunistic_job_runs_on_idle_gpus_beside_a_full_quota(oversubscribe: bool):
    # a1 fills a's quota (4 of 4) on node 0; o1 of a needs 4 more: it takes idle node 1, lent
    # or not, and a's usage stays 4, so a guaranteed a2 is still beyond a's quota.
    s = scheduler(oversubscribe=oversubscribe)
    submit(s, job("a1", "a"), job("o1", "a", opp=True, submit=1))
    decision = s.decide(1)
    assert decision.actions == [Start("a1", NODE0), Start("o1", NODE1)]
    o1 = s.jobs["o1"]
    assert o1.borrowed and not s.jobs["a1"].borrowed
    admission = admission_of(s)
    assert admission.usage == {"a": 4, "b": 0}
    assert admission.opportunistic_gpus == 4
    assert quota_counters(s) == {"preemptions": 0, "borrowed_starts": 0, "opportunistic_starts": 1}
    if not oversubscribe:
        # A guaranteed job of a beyond its quota may not start, and so preempts nothing.
        submit(s, job("a2", "a", submit=2))
        assert s.decide(2).actions == []
        assert "VC a is at its quota: 4 of 4 GPUs in use, 4 more asked" in s.explain("a2", 2)
        assert o1.status is JobStatus.RUNNING


def test_without_lending_an_opportunistic_job_may_ask_for_more_than_its_quota():
    # Guaranteed jobs are bounded by their VC's quota (4) without oversubscription; an
    # opportunistic job only by the cluster (8), since it only ever runs on idle GPUs.
    s = scheduler(oversubscribe=False)
    with pytest.raises(JobRefused, match="asks for 8 GPUs but the cluster has only 4"):
        s.submit(job("a8", "a", gpus=8), 0)
    s.submit(job("o8", "a", gpus=8, opp=True), 0)
    assert s.decide(0).actions == [Start("o8", NODE0 + NODE1)]
    with pytest.raises(JobRefused, match="asks for 9 GPUs but the cluster has only 8"):
        s.submit(job("o9", "a", gpus=9, opp=True), 0)


def test_a_vc_under_quota_reclaims_the_opportunistic_job_before_a_guaranteed_borrower():
    # o1 (a, opportunistic, 2 GPUs) arrived first, then a1 (a, 4: within a's quota) and a2 (a, 2:
    # beyond it, borrowed). One round places a1 (within quota), then a2 (borrower), then o1:
    # a1 on node 0, a2 and o1 on node 1.
    s = scheduler()
    submit(
        s,
        job("o1", "a", gpus=2, opp=True),
        job("a1", "a", submit=1),
        job("a2", "a", gpus=2, submit=2),
    )
    assert starts(s.decide(2)) == ["a1", "a2", "o1"]
    assert s.jobs["a2"].borrowed and s.jobs["o1"].borrowed
    assert admission_of(s).usage == {"a": 6, "b": 0}
    # b1 (b, 2 GPUs, within b's quota) finds no free GPU. Both a2 and o1 may be taken back, and
    # fifo ranks a2 (the later arrival) lowest, but the opportunistic job goes first: b1 takes
    # o1's two GPUs and the borrower a2 keeps running.
    submit(s, job("b1", "b", gpus=2, submit=10))
    o1_gpus = s.jobs["o1"].placement
    decision = s.decide(10)
    assert decision.actions == [Preempt("o1", o1_gpus, "b1"), Start("b1", o1_gpus)]
    assert s.jobs["a2"].status is JobStatus.RUNNING and s.jobs["a1"].status is JobStatus.RUNNING
    assert admission_of(s).opportunistic_gpus == 0 and not s.jobs["o1"].borrowed
    # A second b job within b's quota now needs the borrower's GPUs: a is over its quota (6 > 4).
    submit(s, job("b2", "b", gpus=2, submit=20))
    a2_gpus = s.jobs["a2"].placement
    assert s.decide(20).actions == [Preempt("a2", a2_gpus, "b2"), Start("b2", a2_gpus)]


def test_a_guaranteed_job_of_its_own_vc_beyond_its_quota_preempts_it():
    # a1 fills a's quota on node 0, o1 of a harvests node 1. a2 (guaranteed, a, 4 GPUs) is beyond
    # a's quota, so it may only borrow; the only GPUs to borrow are o1's, and it takes them.
    s = scheduler()
    submit(s, job("a1", "a"), job("o1", "a", opp=True, submit=1))
    s.decide(1)
    submit(s, job("a2", "a", submit=5))
    decision = s.decide(5)
    assert decision.actions == [Preempt("o1", NODE1, "a2"), Start("a2", NODE1)]
    assert s.jobs["a2"].borrowed
    assert "opportunistic" in s.explain("o1", 5)


def test_an_opportunistic_job_never_preempts():
    # las, which preempts for priority: at t=1000 a1 (guaranteed) and o1 (opportunistic) have
    # 4,000 GPU-s each (LAS queue 1); a newcomer is in queue 0 and outranks both.
    s = scheduler(policy="las")
    submit(s, job("a1", "a"), job("o1", "b", opp=True))
    assert starts(s.decide(0)) == ["a1", "o1"]
    # An opportunistic newcomer takes nothing, from a guaranteed job or an opportunistic one.
    submit(s, job("o2", "a", opp=True, submit=1000))
    assert s.decide(1000).actions == []
    assert s.preemptions == 0
    explained = s.explain("o2", 1000)
    assert "opportunistic: runs only on idle GPUs" in explained and "never preempts" in explained
    # A guaranteed newcomer of b (within b's quota) takes the opportunistic job's GPUs.
    submit(s, job("b1", "b", submit=1000))
    decision = s.decide(1000)
    assert decision.actions == [Preempt("o1", NODE1, "b1"), Start("b1", NODE1)]


@pytest.mark.parametrize("lend_last", [True, False])
def test_lend_last_places_opportunistic_jobs_after_every_guaranteed_job(lend_last: bool):
    # a1 runs on node 0; node 1 (4 GPUs) is free. Waiting in fifo order: o1 (a, opportunistic, 4),
    # then b1 (b, 2, within b's quota), then a2 (a, 2, beyond a's quota: a borrower).
    s = scheduler(lend_last=lend_last)
    submit(s, job("a1", "a"))
    s.decide(0)
    submit(
        s,
        job("o1", "a", opp=True, submit=1),
        job("b1", "b", gpus=2, submit=2),
        job("a2", "a", gpus=2, submit=3),
    )
    decision = s.decide(3)
    if lend_last:
        # Within quota first (b1), then the borrower (a2), then o1: nothing is left for it.
        assert decision.actions == [Start("b1", (4, 5)), Start("a2", (6, 7))]
        explained = s.explain("o1", 3)
        assert explained.startswith("PENDING, position 1 of 1 in the queue; waiting for free GPUs;")
        assert "opportunistic: runs only on idle GPUs" in explained
    else:
        # The queue's order: o1 takes node 1. b1 may reclaim it, but never in the round o1
        # started (no start is undone in its own round); a1 is within a's quota. a2 may not
        # reclaim anything (it is beyond a's quota, and o1 is just started).
        assert decision.actions == [Start("o1", NODE1)]
        # In the next round b1 takes o1's GPUs back, and a2 borrows the two b1 left (in that
        # round or the one after: a round remembers that a 2-GPU job found no room before).
        decision = s.decide(4)
        assert decision.actions[:2] == [Preempt("o1", NODE1, "b1"), Start("b1", (4, 5))]
        s.decide(5)
        assert s.jobs["a2"].placement == (6, 7) and s.jobs["o1"].status is JobStatus.PENDING


def test_a_blocked_opportunistic_head_blocks_only_its_own_queue():
    # fifo blocks each VC's queue behind its head; a VC's opportunistic jobs are a queue of their
    # own. b1 holds node 0; waiting: o1 (a, opportunistic, 8: cannot fit), a1 (a, 2), o2 (a,
    # opportunistic, 2).
    s = scheduler(lend_last=False)
    submit(s, job("b1", "b"))
    s.decide(0)
    submit(
        s,
        job("o1", "a", gpus=8, opp=True, submit=1),
        job("a1", "a", gpus=2, submit=2),
        job("o2", "a", gpus=2, opp=True, submit=3),
    )
    # o1 blocks o2 (which would fit on the two GPUs left) but not a1.
    assert s.decide(3).actions == [Start("a1", (4, 5))]
    assert s.cluster.free_gpus == 2
    assert "blocked behind the head job of the opportunistic queue of VC a" in s.explain("o2", 3)


def test_a_blocked_guaranteed_head_does_not_block_its_vcs_opportunistic_jobs():
    # a's guaranteed head a8 (8 GPUs, borrowing all but its quota) cannot fit while b1 holds
    # node 0; o1 of a does not wait behind it.
    s = scheduler()
    submit(s, job("b1", "b"))
    s.decide(0)
    submit(s, job("a8", "a", gpus=8, submit=1), job("o1", "a", opp=True, submit=2))
    assert s.decide(2).actions == [Start("o1", NODE1)]


def test_fair_share_places_opportunistic_jobs_after_guaranteed_ones():
    # Fair share lends guaranteed jobs in the queue's order, but always places opportunistic
    # jobs after them: o1 arrived before b1, yet b1 gets node 1.
    s = fair_scheduler()
    submit(s, job("a1", "a"))
    s.decide(0)
    submit(s, job("o1", "a", opp=True, submit=1), job("b1", "b", submit=2))
    assert s.decide(2).actions == [Start("b1", NODE1)]
    assert "opportunistic" in s.explain("o1", 2)


def test_fair_share_does_not_charge_opportunistic_usage():
    # Half-life H = 3,600 s. a1 (a, guaranteed, 4 GPUs) and o1 (b, opportunistic, 4) run from 0
    # to 1,000 s. Decayed usage of a VC running r GPUs from 0 is r H/ln2 (1 - 2^(-t/H)):
    # a: 4 x 3,600 / 0.693147 x (1 - 0.824863) = 20,774.7 x 0.175137 = 3,638.5 GPU-s; b: nothing, o1 is not
    # charged. b's factor stays 1 and a's is 2^(-U/S) = 2^(-1/0.5) = 1/4 (a has all the usage,
    # half the weight).
    s = fair_scheduler(half_life_s=3600.0)
    submit(s, job("a1", "a"), job("o1", "b", opp=True))
    assert starts(s.decide(0)) == ["a1", "o1"]
    (admission,) = s.admission.members
    assert isinstance(admission, FairShareAdmission)
    s.decide(1000)  # settles usage up to t=1000
    expected = 4 * 3600 / math.log(2) * (1 - 2 ** (-1000 / 3600))
    assert admission.decayed_gpu_s["a"] == pytest.approx(expected)
    assert expected == pytest.approx(3638.5, abs=0.1)
    assert admission.decayed_gpu_s["b"] == 0.0
    assert admission.factor("a") == pytest.approx(0.25) and admission.factor("b") == 1.0
    # b has only opportunistic work, so it takes no share: a alone is active and may use the
    # whole cluster (8 GPUs) within its share; o1 is reclaimable by a's guaranteed job anyway.
    assert admission.share("a") == 8.0
    submit(s, job("a2", "a", submit=1000))
    assert s.decide(1000).actions == [Preempt("o1", NODE1, "a2"), Start("a2", NODE1)]
    assert not s.jobs["a2"].borrowed  # 8 GPUs of a's share of 8


def test_a_preemption_that_failed_for_one_queue_is_still_tried_for_another():
    # a1 (3 GPUs, within a's quota) and o2 (opportunistic, 1) fill node 1; a2 (2, borrowed: a
    # holds 5 of 4) and o1 (opportunistic, 2) fill node 0. In the queue's order (no lend_last):
    # x (a, 3, beyond a's quota) may take only opportunistic GPUs, 3 of them but on two nodes:
    # no placement. y (b, 3, within b's quota) may also take back the borrower a2: o1 and a2
    # free node 0. x's failure bounds only its own queue (VC a), so y still tries.
    from corral.core.placement.base import Placed

    s = scheduler(lend_last=False)
    submit(
        s,
        job("a1", "a", gpus=3),
        job("o2", "a", gpus=1, opp=True),
        job("a2", "a", gpus=2),
        job("o1", "b", gpus=2, opp=True),
    )
    for job_id, gpus in (("a1", (4, 5, 6)), ("o2", (7,)), ("a2", (0, 1)), ("o1", (2, 3))):
        s.start_placed(job_id, Placed(gpus), 0)
    assert admission_of(s).usage == {"a": 5, "b": 0} and s.jobs["a2"].borrowed
    submit(s, job("x", "a", gpus=3, submit=10), job("y", "b", gpus=3, submit=11))
    # y's victims: o1 and o2 first (neither frees 3 GPUs on one node), then a2, which with o1
    # frees node 0; y takes three of its GPUs, which were both jobs'.
    assert s.decide(11).actions == [
        Preempt("o1", (2, 3), "y"),
        Preempt("a2", (0, 1), "y"),
        Start("y", (0, 1, 2)),
    ]
    assert s.jobs["x"].status is JobStatus.PENDING
