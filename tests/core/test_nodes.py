"""An operator's drain and resume of a node (corral.core.nodes), worked out by hand on a cluster
of two nodes (n0: GPUs 0, 1; n1: GPUs 2, 3) under fifo and consolidate."""

from __future__ import annotations

import pytest

from corral.core import JobStatus, Start
from corral.core.actions import Preempt
from corral.core.nodes import DRAINED, DRAINING, UP, NodeDrains, UnknownNode
from tests.core.helpers import scheduler, spec

N0, N1 = "node-0000", "node-0001"


def _two_running() -> tuple:
    """a (2 GPUs) on n0, c (2 GPUs) on n1, b (2 GPUs) waiting."""
    s = scheduler(2, 2)
    for job_id, at in (("a", 0.0), ("c", 0.0), ("b", 1.0)):
        s.submit(spec(job_id, 2, submit=at), at)
    assert s.decide(0).actions == [Start("a", (0, 1)), Start("c", (2, 3))]
    return s, NodeDrains()


def test_a_draining_node_lets_its_job_finish_and_starts_nothing_new() -> None:
    s, drains = _two_running()
    # Drained at 10 without preemption: a keeps running, nothing is stopped.
    assert drains.drain(s, N0, 10, reason="disk swap", by="root") == []
    assert s.jobs["a"].status is JobStatus.RUNNING
    assert drains.state(N0, running=1) == DRAINING and drains.state(N1, 1) == UP
    assert s.decide(10).actions == []
    # a ends at 100: its GPUs 0, 1 are free, but n0 is drained, so b (2 GPUs) must not start
    # there; n1 is busy with c. Without the drain b would start on (0, 1) here.
    s.finished("a", 100)
    drains.hold(s)
    assert s.decide(100).actions == []
    assert drains.state(N0, running=0) == DRAINED
    # c ends at 200 on n1: b starts there, on GPUs 2, 3, not on the drained n0.
    s.finished("c", 200)
    drains.hold(s)
    assert s.decide(200).actions == [Start("b", (2, 3))]
    # Resumed at 250, n0 takes the next job: d (2 GPUs) starts on GPUs 0, 1.
    assert drains.resume(s, N0) is True
    assert drains.state(N0, running=0) == UP
    s.submit(spec("d", 2, submit=250), 250)
    drains.hold(s)
    assert s.decide(250).actions == [Start("d", (0, 1))]


def test_a_drain_with_preemption_requeues_its_jobs_without_a_failure() -> None:
    s, drains = _two_running()
    # Drained with preemption at 10: a is stopped through its checkpoint (a preemption, not a
    # failure, no retry used) and waits again, ahead of b (fifo: it came first).
    stops = drains.drain(s, N0, 10, reason="bad fan", preempt=True)
    assert stops == [Preempt("a", (0, 1), f"drain of node {N0}")]
    a = s.jobs["a"]
    assert (a.status, a.preemptions, a.failures, a.infra_failures) == (
        JobStatus.PENDING,
        1,
        0,
        0,
    )
    # n0 is held out and n1 busy: nothing starts.
    drains.hold(s)
    assert s.decide(10).actions == []
    # c ends at 60: a (the first in fifo order) resumes on n1's GPUs 2, 3.
    s.finished("c", 60)
    drains.hold(s)
    assert s.decide(60).actions == [Start("a", (2, 3), resumed=True)]
    # n0 resumed at 70: b starts there, on GPUs 0, 1.
    drains.resume(s, N0)
    drains.hold(s)
    assert s.decide(70).actions == [Start("b", (0, 1))]


def test_a_preempted_job_restarts_on_another_node_at_once() -> None:
    s = scheduler(2, 2)
    drains = NodeDrains()
    s.submit(spec("a", 2), 0)
    assert s.decide(0).actions == [Start("a", (0, 1))]
    stops = drains.drain(s, N0, 5, reason="maintenance", preempt=True)
    assert [stop.job_id for stop in stops] == ["a"]
    # The only free GPUs are n1's 2, 3: a resumes there in the same instant's round.
    drains.hold(s)
    assert s.decide(5).actions == [Start("a", (2, 3), resumed=True)]


def test_a_drain_of_an_unknown_node_names_it() -> None:
    s = scheduler(2, 2)
    with pytest.raises(UnknownNode, match="no node 'n9'"):
        NodeDrains().drain(s, "n9", 0, reason="x")
    with pytest.raises(UnknownNode, match="no node 'n9'"):
        NodeDrains().resume(s, "n9")
    assert NodeDrains().resume(s, N0) is False  # not drained: nothing to do


def test_hived_drains_by_physical_node_and_binds_the_vc_elsewhere() -> None:
    """HiveD on three 4-GPU nodes, VCs a and b one node each: a's job runs on the node its cell
    bound to; a drain with preemption of that physical node requeues it (a preemption, not a
    failure), and it restarts on another node's GPUs, never the drained one."""
    from tests.core.test_hived import THREE_NODES, hived, job

    s = hived(THREE_NODES)
    drains = NodeDrains()
    s.submit(job("a1", "a"), 0)
    (start,) = s.decide(0).actions
    assert isinstance(start, Start)
    node = s.cluster.gpu_node[start.gpus[0]]
    name = s.cluster.nodes[node].name
    (stop,) = drains.drain(s, name, 5, reason="fan", preempt=True)
    assert (stop.job_id, stop.gpus, stop.by_job_id) == ("a1", start.gpus, f"drain of node {name}")
    a1 = s.jobs["a1"]
    assert (a1.status, a1.preemptions, a1.failures) == (JobStatus.PENDING, 1, 0)
    drains.hold(s)
    (again,) = s.decide(5).actions
    assert isinstance(again, Start) and again.job_id == "a1"
    assert all(s.cluster.gpu_node[g] != node for g in again.gpus)


# -- health: a node found unhealthy, and back ---------------------------------------------------


def test_an_unhealthy_node_fails_its_attempts_as_the_infrastructures_and_starts_nothing() -> None:
    from corral.core.nodes import UNHEALTHY

    s, drains = _two_running()
    # n0 found unhealthy at 10: a's attempt ends at once as an infrastructure failure (not a
    # preemption: its work since its last checkpoint is lost), requeued with max_retries
    # untouched (failures 0, infra_failures 1), held for the first backoff.
    (failed,) = drains.mark_unhealthy(s, N0, 10, "XID 79")
    a = s.jobs["a"]
    assert failed is a
    assert (a.status, a.failures, a.infra_failures, a.preemptions) == (JobStatus.PENDING, 0, 1, 0)
    assert a.failure_history[-1].infrastructure
    assert a.failure_history[-1].signature == f"node {N0} unhealthy: XID 79"
    assert drains.state(N0, running=0) == UNHEALTHY
    # n0's GPUs 0, 1 are free but held out; n1 runs c: neither a (in its backoff) nor b starts,
    # though without the health check b (2 GPUs) would start on 0, 1 here.
    drains.hold(s)
    assert s.decide(10).actions == []
    drains.explain_waits(s)
    assert "2 on node node-0000 is unhealthy (XID 79)" in s.jobs["b"].pending_reason
    # c ends at 100: a (first in fifo order, its backoff over) takes n1, never n0.
    s.finished("c", 100)
    drains.hold(s)
    assert s.decide(100).actions == [Start("a", (2, 3), resumed=True)]
    # The check passes at 150: n0 takes b.
    assert drains.mark_healthy(s, N0) is True
    assert drains.state(N0, running=0) == "up"
    drains.hold(s)
    assert s.decide(150).actions == [Start("b", (0, 1))]


def test_an_admin_resume_brings_an_unhealthy_and_drained_node_back() -> None:
    s, drains = _two_running()
    drains.drain(s, N0, 5, reason="fan")
    drains.mark_unhealthy(s, N0, 10, "ECC")
    # Healthy again, the node stays drained: nothing starts on it.
    drains.mark_healthy(s, N0)
    s.finished("c", 20)
    drains.hold(s)
    (start,) = s.decide(20).actions
    assert isinstance(start, Start) and start.gpus == (2, 3)  # a (fifo's first) on n1
    drains.mark_unhealthy(s, N0, 30, "ECC")
    # resume ends both the drain and the failed check: b goes to n0.
    assert drains.resume(s, N0) is True
    drains.hold(s)
    assert s.decide(40).actions == [Start("b", (0, 1))]
