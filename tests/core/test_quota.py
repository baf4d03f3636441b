"""Quota admission (YARN capacity scheduler): GPU-count quotas, lending and reclaiming."""

from __future__ import annotations

import pytest

from corral.core import Cluster, JobRefused, JobSpec, Preempt, Scheduler, Start
from corral.core.admission.quota import QuotaAdmission
from corral.core.placement import make_placement
from corral.core.policy import make_policy


def scheduler(oversubscribe: bool, policy: str = "fifo", lend_last: bool = False) -> Scheduler:
    return Scheduler(
        Cluster.shorthand(1, 8),
        make_policy(policy),
        make_placement("consolidate"),
        admission=QuotaAdmission(
            {"a": 4, "b": 4}, oversubscribe=oversubscribe, lend_last=lend_last
        ),
    )


def job(job_id: str, vc: str, gpus: int = 4, submit: float = 0.0) -> JobSpec:
    return JobSpec(id=job_id, submit_time=submit, gpus=gpus, vc=vc, duration_s=100.0)


def starts(decision) -> list[str]:
    return [a.job_id for a in decision.actions if isinstance(a, Start)]


def test_a_vc_at_its_quota_waits_even_with_idle_gpus():
    s = scheduler(oversubscribe=False)
    s.submit(job("a1", "a"), 0)
    s.submit(job("a2", "a", submit=1), 1)
    assert starts(s.decide(1)) == ["a1"]
    assert s.cluster.free_gpus == 4
    assert "VC a is at its quota: 4 of 4 GPUs in use, 4 more asked" in s.explain("a2", 1)
    # b's job is not blocked by a's waiting one: each VC's queue blocks only itself.
    s.submit(job("b1", "b", submit=2), 2)
    assert starts(s.decide(2)) == ["b1"]


def test_oversubscription_lends_idle_gpus_and_the_owner_reclaims_them():
    s = scheduler(oversubscribe=True)
    s.submit(job("a1", "a"), 0)
    s.submit(job("a2", "a", submit=1), 1)
    assert starts(s.decide(1)) == ["a1", "a2"]
    borrowed_gpus = s.jobs["a2"].placement
    assert s.jobs["a2"].borrowed and not s.jobs["a1"].borrowed
    s.submit(job("b1", "b", submit=5), 5)
    decision = s.decide(5)
    # fifo never preempts for priority, but b is under its quota: it takes back what a borrowed.
    assert decision.actions == [Preempt("a2", borrowed_gpus, "b1"), Start("b1", borrowed_gpus)]
    assert s.jobs["a1"].status.value == "RUNNING"


@pytest.mark.parametrize("lend_last", [False, True])
def test_lending_last_places_jobs_within_quota_before_borrowers(lend_last: bool):
    # a runs 4 GPUs (its quota); 4 GPUs are free. a2 (4 GPUs, would borrow) is ahead of b1 (4,
    # within b's quota) in fifo order.
    s = scheduler(oversubscribe=True, lend_last=lend_last)
    s.submit(job("a1", "a"), 0)
    assert starts(s.decide(0)) == ["a1"]
    s.submit(job("a2", "a", submit=1), 1)
    s.submit(job("b1", "b", submit=2), 2)
    decision = s.decide(2)
    if lend_last:
        # b1 gets the free GPUs; a2 waits for idle GPUs to lend, and nothing is preempted.
        assert decision.actions == [Start("b1", s.jobs["b1"].placement)]
        assert "waiting for free GPUs" in s.explain("a2", 2)
    else:
        # a2 borrows them first; b1 then takes back borrowed GPUs. a2 started this instant and is
        # never undone in the same round, so the victim is a1, which ran within a's quota
        # until a2's start put a over it.
        assert [type(a).__name__ for a in decision.actions] == ["Start", "Preempt", "Start"]
        assert decision.actions[1].job_id == "a1" and starts(decision) == ["a2", "b1"]


def test_preemption_stays_inside_a_vc_unless_it_reclaims_borrowed_gpus():
    s = scheduler(oversubscribe=True, policy="las")
    s.submit(job("a1", "a"), 0)
    s.submit(job("b1", "b"), 0)
    s.decide(0)
    s.submit(job("b2", "b", submit=1000), 1000)
    # At t=1000 a1 and b1 have 4,000 GPU-s each (LAS queue 1); the new b2 is in queue 0 and would
    # preempt either. a1 is within a's quota, so only b's own b1 gives way.
    decision = s.decide(1000)
    assert decision.actions == [
        Preempt("b1", s.jobs["b2"].placement, "b2"),
        Start("b2", s.jobs["b2"].placement),
    ]
    assert s.jobs["a1"].status.value == "RUNNING"


def test_quota_refuses_unknown_vcs_and_jobs_bigger_than_the_quota():
    s = scheduler(oversubscribe=False)
    with pytest.raises(JobRefused, match="unknown VC 'c'"):
        s.submit(job("x", "c"), 0)
    with pytest.raises(JobRefused, match="asks for 6 GPUs but the cluster has only 4"):
        s.submit(job("y", "a", gpus=6), 0)
    # With oversubscription a job bigger than its quota can still run on borrowed GPUs.
    assert scheduler(oversubscribe=True).submit(job("z", "a", gpus=6), 0).id == "z"


def test_fair_share_lends_everything_and_splits_by_weight_when_both_vcs_have_work():
    from corral.core.admission.fairshare import FairShareAdmission

    s = Scheduler(
        Cluster.shorthand(1, 8),
        make_policy("fifo"),
        make_placement("consolidate"),
        admission=FairShareAdmission({"a": 1.0, "b": 1.0}, total_gpus=8),
    )
    s.submit(job("a1", "a"), 0)
    s.submit(job("a2", "a", submit=1), 1)
    # a is the only VC with work: its share is the whole cluster.
    assert starts(s.decide(1)) == ["a1", "a2"]
    s.submit(job("b1", "b", submit=5), 5)
    decision = s.decide(5)
    # b now has work: shares become 4 + 4. a holds 8 > 4, so b takes back a's latest job.
    a2_gpus = s.jobs["b1"].placement
    assert decision.actions == [Preempt("a2", a2_gpus, "b1"), Start("b1", a2_gpus)]
    assert s.jobs["a1"].status.value == "RUNNING"
