"""HiveD after a restart: adopt, restore_running, refusal and failures as the live manager calls them."""

from __future__ import annotations

import pytest

from corral.core import Job, JobRefused, JobSpec, JobStatus, Preempt, Priority, Start
from corral.core.admission.hived import HivedScheduler
from corral.core.config import parse_cluster_config
from corral.core.placement import make_placement
from corral.core.policy import make_policy
from corral.core.retry import FailureReport

#: Two 4-GPU nodes, each two PCIe pairs: GPUs 0-1 | 2-3 on node 0, 4-5 | 6-7 on node 1.
PAIRS = {
    "cell_types": {
        "PAIR": {"child": "V100", "count": 2},
        "NODE": {"child": "PAIR", "count": 2, "node": True},
    },
    "physical_cells": [{"type": "NODE", "count": 2}],
    "virtual_clusters": {"small": {"PAIR": 2}, "big": {"NODE": 1}},
}

#: One 2-GPU node; VCs a and b are guaranteed one 1-GPU cell each (the live test's cluster).
ONES = {
    "cell_types": {
        "ONE": {"child": "gpu", "count": 1},
        "NODE": {"child": "ONE", "count": 2, "node": True},
    },
    "physical_cells": [{"type": "NODE", "count": 1}],
    "virtual_clusters": {"a": {"ONE": 1}, "b": {"ONE": 1}},
}


def hived(config: dict, spill: bool = True) -> HivedScheduler:
    parsed = parse_cluster_config(config)
    return HivedScheduler(
        parsed.cluster,
        parsed.virtual_clusters,
        make_policy("fifo"),
        make_placement("consolidate"),
        spill=spill,
    )


def spec(job_id: str, vc: str, gpus: int, submit: float = 0.0, **fields: object) -> JobSpec:
    return JobSpec(id=job_id, submit_time=submit, gpus=gpus, vc=vc, **fields)  # type: ignore[arg-type]


def restore(s: HivedScheduler, job_spec: JobSpec, gpus: tuple[int, ...], now: float) -> Job:
    """What the manager does for a job found running: adopt it (its attempt counted), restore."""
    s.adopt(Job(spec=job_spec, attempts=1, first_started_at=job_spec.submit_time), now)
    return s.restore_running(job_spec.id, gpus, job_spec.submit_time, now)


def starts(decision) -> dict[str, tuple[int, ...]]:
    return {a.job_id: a.gpus for a in decision.actions if isinstance(a, Start)}


def cell_state(s: HivedScheduler) -> tuple[object, ...]:
    """Everything about cells a later decision depends on."""
    return (
        s.allocator.counts(),
        [cell.name for cell in s.allocator.bound_cells()],
        {
            name: {top: (cell.name, gpus) for top, (cell, gpus) in vc.bound.items()}
            for name, vc in s.vcs.items()
        },
        s.cluster.gpu_free,
        {name: vc.cluster.gpu_free for name, vc in s.vcs.items()},
    )


def test_a_restored_guaranteed_job_holds_the_same_cells_as_one_started_normally() -> None:
    started = hived(PAIRS)
    started.submit(spec("p1", "small", 2), 0)
    # No PAIR is free at first: buddy allocation splits node 0 and binds its first pair.
    assert starts(started.decide(0)) == {"p1": (0, 1)}

    restored = hived(PAIRS)
    job = restore(restored, spec("p1", "small", 2), (0, 1), 5)
    assert job.status is JobStatus.RUNNING and restored.vc_of("p1") == "small"
    assert restored.physical_placement("p1") == (0, 1)
    assert cell_state(restored) == cell_state(started)
    # Node 0 is split: one PAIR left free there; node 1 is whole, free for VC big.
    assert restored.allocator.counts() == {"NODE": 1, "PAIR": 1, "v100": 0}

    # The same next round in both: small's second job gets the other pair of node 0, big's
    # job the whole of node 1.
    for s in (started, restored):
        s.submit(spec("p2", "small", 2, submit=10), 10)
        s.submit(spec("n1", "big", 4, submit=10), 10)
        assert starts(s.decide(10)) == {"n1": (4, 5, 6, 7), "p2": (2, 3)}
    assert cell_state(restored) == cell_state(started)
    # Ending the restored job gives its cell back as for the started one.
    for s in (started, restored):
        s.finished("p1", 20)
    assert cell_state(restored) == cell_state(started)
    assert restored.allocator.counts()["PAIR"] == 1


def test_a_restore_on_the_second_pair_binds_that_pair() -> None:
    s = hived(PAIRS)
    restore(s, spec("p1", "small", 2), (2, 3), 5)
    # Splitting node 0 and taking its second pair is a choice buddy allocation has.
    assert s.vc_of("p1") == "small"
    assert [cell.name for cell in s.allocator.bound_cells()] == [s.cluster.gpus[2].parent.name]
    s.submit(spec("p2", "small", 2, submit=6), 6)
    assert starts(s.decide(6)) == {"p2": (0, 1)}


def test_a_restore_that_would_split_another_vcs_node_runs_the_job_as_lent() -> None:
    s = hived(PAIRS)
    restore(s, spec("p1", "small", 2), (0, 1), 5)
    # A pair of node 0 is free, so buddy allocation would never split node 1 for small: binding
    # (4, 5) would leave VC big no whole node. The job is taken as lent instead.
    p2 = restore(s, spec("p2", "small", 2), (4, 5), 5)
    assert p2.status is JobStatus.RUNNING and s.vc_of("p2") == "opportunistic"
    assert s.allocator.counts() == {"NODE": 1, "PAIR": 1, "v100": 0}  # node 1 still whole
    assert s.cluster.free_gpus == 4
    s.submit(spec("n1", "big", 4, submit=10), 10)
    decision = s.decide(10)
    # big's guarantee holds: node 1 is bound to it and the lent job gives way; with lending,
    # p2 runs again at once on the pair of node 0 that stands idle.
    assert decision.actions == [
        Preempt("p2", (4, 5), "n1"),
        Start("n1", (4, 5, 6, 7)),
        Start("p2", (2, 3), resumed=True),
    ]
    assert s.jobs["p2"].preemptions == 1 and s.jobs["p1"].status is JobStatus.RUNNING


def test_a_restored_lent_job_is_preempted_when_its_owner_vc_needs_the_gpu() -> None:
    s = hived(ONES)
    restore(s, spec("a1", "a", 1), (0,), 5)
    restore(s, spec("a2", "a", 1, submit=1), (1,), 5)
    # VC a owns one cell, bound to GPU 0 for a1: a2 runs on b's idle cell, lent.
    assert (s.vc_of("a1"), s.vc_of("a2")) == ("a", "opportunistic")
    assert "opportunistic" in s.explain("a2", 5)
    assert {j.id for j in s.running_jobs()} == {"a1", "a2"}
    assert list(s.pending_jobs()) == []
    assert starts(s.decide(6)) == {}  # nothing moves while b needs nothing
    s.submit(spec("b1", "b", 1, submit=10), 10)
    assert s.decide(10).actions == [Preempt("a2", (1,), "b1"), Start("b1", (1,))]
    a2 = s.jobs["a2"]
    assert a2.status is JobStatus.PENDING and s.vc_of("a2") == "a"  # back in its VC's queue
    assert (a2.preemptions, a2.attempts) == (1, 1)
    assert [j.id for j in s.pending_jobs()] == ["a2"]
    s.finished("a1", 20)
    assert s.decide(20).actions == [Start("a2", (0,), resumed=True)]


def test_restored_in_the_other_order_the_first_found_gets_the_vcs_cell() -> None:
    s = hived(ONES)
    restore(s, spec("a2", "a", 1, submit=1), (1,), 5)
    restore(s, spec("a1", "a", 1), (0,), 5)
    assert (s.vc_of("a2"), s.vc_of("a1")) == ("a", "opportunistic")
    s.submit(spec("b1", "b", 1, submit=10), 10)
    assert s.decide(10).actions == [Preempt("a1", (0,), "b1"), Start("b1", (0,))]


def test_an_opportunistic_job_is_restored_as_opportunistic() -> None:
    s = hived(ONES)
    restore(s, spec("o1", "a", 1, priority=Priority.OPPORTUNISTIC), (0,), 5)
    assert s.vc_of("o1") == "opportunistic" and s.allocator.bound_cells() == []
    s.submit(spec("a1", "a", 1, submit=10), 10)
    # a's cell binds GPU 0 or 1; both are free of guarantees, GPU 1 loses no work.
    assert s.decide(10).actions == [Start("a1", (1,))]
    s.submit(spec("b1", "b", 1, submit=11), 11)
    assert s.decide(11).actions == [Preempt("o1", (0,), "b1"), Start("b1", (0,))]


def test_restore_refuses_gpus_in_use_and_jobs_not_waiting() -> None:
    s = hived(ONES)
    restore(s, spec("a1", "a", 1), (0,), 5)
    s.adopt(Job(spec=spec("b1", "b", 1)), 5)
    with pytest.raises(ValueError, match="already in use"):
        s.restore_running("b1", (0,), 0.0, 5)
    assert s.jobs["b1"].status is JobStatus.PENDING and s.vc_of("b1") == "b"
    with pytest.raises(ValueError, match="is RUNNING, not PENDING"):
        s.restore_running("a1", (1,), 0.0, 5)
    with pytest.raises(JobRefused, match="already exists"):
        s.adopt(Job(spec=spec("a1", "a", 1)), 5)
    with pytest.raises(JobRefused, match="unknown VC 'c'"):
        s.adopt(Job(spec=spec("c1", "c", 1)), 5)


@pytest.mark.parametrize(
    ("job_spec", "expected"),
    [
        (spec("ok", "small", 2), None),
        (spec("c", "c", 1), "unknown VC 'c'; VCs are big, small"),
        (spec("wide", "small", 5), "asks for 5 GPUs but VC small is guaranteed only 4 GPUs"),
        (spec("zero", "big", 0), "gpus must be a positive integer, got 0"),
        (spec("o", "c", 8, priority=Priority.OPPORTUNISTIC), None),  # any VC: no guarantee used
        (
            spec("o9", "big", 9, priority=Priority.OPPORTUNISTIC),
            "asks for 9 GPUs but the cluster has only 8 GPUs",
        ),
    ],
)
def test_refusal_says_what_submit_refuses(job_spec: JobSpec, expected: str | None) -> None:
    s = hived(PAIRS)
    refusal = s.refusal(job_spec)
    if expected is None:
        assert refusal is None
        assert s.submit(job_spec, 0).status is JobStatus.PENDING
        return
    assert refusal is not None and refusal.startswith(expected)
    with pytest.raises(JobRefused) as raised:
        s.submit(job_spec, 0)
    assert str(raised.value) == f"job {job_spec.id}: {refusal}"
    assert s.jobs == {}


def test_a_failed_lent_job_waits_out_its_backoff_in_its_vc_and_is_not_lent_meanwhile() -> None:
    s = hived(ONES)
    for i in (1, 2, 3):
        s.submit(spec(f"a{i}", "a", 1, submit=i / 10, max_retries=1), i / 10)
    # a1 on a's cell; a2 lent b's idle cell; a3 waits.
    assert s.decide(1).actions == [Start("a1", (0,)), Start("a2", (1,))]
    a2 = s.failed("a2", 5, FailureReport("exit code 1", retry_after_s=10))
    assert a2.status is JobStatus.PENDING and a2.failures == 1 and s.vc_of("a2") == "a"
    # a2 is held until t=15: the idle GPU is lent to a3, the next job in a's queue.
    assert s.decide(6).actions == [Start("a3", (1,))]
    s.finished("a3", 8)
    assert s.decide(8).actions == []
    assert s.decide(15).actions == [Start("a2", (1,), resumed=True)]
    # An infrastructure failure uses up no retry; give_up ends the job at once.
    s.failed("a2", 16, FailureReport("lost: shim died", infrastructure=True))
    assert (a2.failures, a2.infra_failures, a2.status) == (1, 1, JobStatus.PENDING)
    s.decide(16)
    s.failed("a1", 17, FailureReport("user error", give_up=True))
    assert s.jobs["a1"].status is JobStatus.FAILED and s.jobs["a1"].failures == 1
