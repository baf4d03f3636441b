"""HiveD admission on hand-worked scenarios: guarantees with topology, harvesting, reclaiming."""

from __future__ import annotations

import pytest

from corral.core import JobRefused, JobSpec, JobStatus, Preempt, Priority, Start
from corral.core.admission.hived import HivedScheduler
from corral.core.config import parse_cluster_config
from corral.core.placement import make_placement
from corral.core.policy import make_policy

TWO_NODES = {
    "cell_types": {"NODE": {"child": "V100", "count": 4, "node": True}},
    "physical_cells": [{"type": "NODE", "count": 2}],
    "virtual_clusters": {"a": {"NODE": 1}, "b": {"NODE": 1}},
}


def hived(config=TWO_NODES, policy="fifo"):
    parsed = parse_cluster_config(config)
    return HivedScheduler(
        parsed.cluster, parsed.virtual_clusters, make_policy(policy), make_placement("consolidate")
    )


def job(job_id, vc, gpus=4, submit=0.0, opportunistic=False):
    priority = Priority.OPPORTUNISTIC if opportunistic else Priority.GUARANTEED
    return JobSpec(
        id=job_id, submit_time=submit, gpus=gpus, vc=vc, duration_s=100.0, priority=priority
    )


def starts(decision):
    return {a.job_id: a.gpus for a in decision.actions if isinstance(a, Start)}


def test_two_vcs_guarantees_hold_under_contention():
    s = hived()
    for i in range(3):
        s.submit(job(f"a{i}", "a", submit=i), i)
    first = starts(s.decide(2))
    # VC a owns one node: only one of its three 4-GPU jobs runs, although the other node is idle.
    assert list(first) == ["a0"]
    assert "VC a" in s.explain("a1", 2)
    s.submit(job("b0", "b", submit=3), 3)
    second = starts(s.decide(3))
    # b's job gets b's node at once, and the two jobs are on different physical nodes.
    assert list(second) == ["b0"]
    assert set(first["a0"]).isdisjoint(second["b0"])
    assert s.cluster.free_gpus == 0


def test_unknown_vc_and_job_bigger_than_its_vc_are_refused():
    s = hived()
    with pytest.raises(JobRefused, match="unknown VC 'c'"):
        s.submit(job("x", "c"), 0)
    with pytest.raises(JobRefused, match="VC a is guaranteed only 4 GPUs"):
        s.submit(job("y", "a", gpus=8), 0)


def test_opportunistic_jobs_harvest_idle_cells_and_are_reclaimed_with_least_work_lost():
    s = hived()
    s.submit(job("x", "a", opportunistic=True, submit=0), 0)
    s.decide(0)
    s.submit(job("y", "a", opportunistic=True, submit=50), 50)
    s.decide(50)
    # Both nodes are harvested by opportunistic jobs, though no VC is using its cells.
    assert s.cluster.free_gpus == 0
    x_gpus, y_gpus = s.jobs["x"].placement, s.jobs["y"].placement
    s.submit(job("g", "b", submit=60), 60)
    decision = s.decide(60)
    # At t=60, x would lose 4 x 60 = 240 GPU-s and y 4 x 10 = 40: the bound cell is y's node.
    assert decision.actions[0] == Preempt("y", y_gpus, "g")
    assert decision.actions[1] == Start("g", y_gpus)
    assert s.jobs["y"].status is JobStatus.PENDING and s.jobs["x"].status is JobStatus.RUNNING
    assert s.jobs["x"].placement == x_gpus
    # When g ends its cell is unbound, and y harvests the node again.
    s.finished("g", 160)
    assert s.allocator.bound_cells() == []
    assert starts(s.decide(160)) == {"y": y_gpus}


def test_guaranteed_job_keeps_topology_of_its_cells():
    config = {
        "cell_types": {
            "PAIR": {"child": "V100", "count": 2},
            "NODE": {"child": "PAIR", "count": 4, "node": True},
        },
        "physical_cells": [{"type": "NODE", "count": 2}],
        "virtual_clusters": {"small": {"PAIR": 1}, "big": {"NODE": 1}},
    }
    s = hived(config)
    s.submit(job("pair-job", "small", gpus=2), 0)
    s.submit(job("node-job", "big", gpus=8), 0)
    placed = starts(s.decide(0))
    # small's one PAIR is two GPUs under one PCIe switch of a node; big's node stays whole.
    pair = placed["pair-job"]
    switch = {s.cluster.gpus[g].parent.name for g in pair}
    assert len(switch) == 1
    assert len({s.cluster.gpu_node[g] for g in placed["node-job"]}) == 1
    assert s.cluster.gpu_node[pair[0]] != s.cluster.gpu_node[placed["node-job"][0]]
    # Two more pair jobs for small: it owns one PAIR only, so they wait.
    s.submit(job("pair-2", "small", gpus=2, submit=1), 1)
    assert starts(s.decide(1)) == {}


def test_spill_lends_idle_cells_and_the_owner_takes_them_back():
    parsed = parse_cluster_config(TWO_NODES)
    s = HivedScheduler(
        parsed.cluster,
        parsed.virtual_clusters,
        make_policy("fifo"),
        make_placement("consolidate"),
        spill=True,
    )
    s.submit(job("a1", "a"), 0)
    s.submit(job("a2", "a", submit=1), 1)
    placed = starts(s.decide(1))
    # a owns one node; with lending its second job runs on b's idle node.
    assert set(placed) == {"a1", "a2"}
    assert "opportunistic" in s.explain("a2", 1)
    lent = placed["a2"]
    s.submit(job("b1", "b", submit=5), 5)
    decision = s.decide(5)
    assert decision.actions[:2] == [Preempt("a2", lent, "b1"), Start("b1", lent)]
    # a2 waits in its own VC's queue again, behind nothing: it runs when a1 ends.
    assert s.vc_of("a2") == "a" and s.jobs["a2"].status is JobStatus.PENDING
    s.finished("a1", 100)
    assert "a2" in starts(s.decide(100))
    assert s.vc_of("a2") == "a"


def test_with_lending_a_job_takes_idle_gpus_before_preempting_in_its_vc():
    def scheduler(spill):
        parsed = parse_cluster_config(TWO_NODES)
        s = HivedScheduler(
            parsed.cluster,
            parsed.virtual_clusters,
            make_policy("las"),
            make_placement("consolidate"),
            spill=spill,
        )
        s.submit(job("a1", "a"), 0)
        assert set(starts(s.decide(0))) == {"a1"}
        s.submit(job("a2", "a", submit=1000), 1000)
        return s

    # At t=1000 a1 has 4 GPUs x 1000 s = 4000 GPU-s, past LAS's first threshold (3600), and the
    # new a2 has none: a2 goes first. Without lending it preempts a1 on VC a's only node ...
    alone = scheduler(spill=False).decide(1000)
    assert [(type(a).__name__, a.job_id) for a in alone.actions] == [
        ("Preempt", "a1"),
        ("Start", "a2"),
    ]
    # ... with lending, b's node is idle, so a2 runs there and a1 keeps running.
    s = scheduler(spill=True)
    lent = s.decide(1000)
    assert [(type(a).__name__, a.job_id) for a in lent.actions] == [("Start", "a2")]
    b_node = lent.actions[0].gpus
    # b wants its node back at t=1100: a2 (400 GPU-s, still first LAS queue) is evicted and, in
    # the same round, preempts a1 (4400 GPU-s, second queue) in its own VC.
    s.submit(job("b1", "b", submit=1100), 1100)
    actions = [(type(a).__name__, a.job_id) for a in s.decide(1100).actions]
    assert actions == [("Preempt", "a2"), ("Start", "b1"), ("Preempt", "a1"), ("Start", "a2")]
    assert s.physical_placement("b1") == b_node
    assert s.vc_of("a2") == "a" and s.jobs["a1"].status is JobStatus.PENDING


def test_cancel_gives_back_the_cells_of_a_running_job_and_drops_a_waiting_one():
    s = hived()
    s.submit(job("a1", "a"), 0)
    s.submit(job("a2", "a"), 0)
    assert set(starts(s.decide(0))) == {"a1"}
    assert s.cluster.free_gpus == 4 and len(s.vcs["a"].bound) == 1
    s.cancel("a2", 1)  # waiting: nothing to give back
    assert s.jobs["a2"].status is JobStatus.CANCELLED and s.pending_count == 0
    s.cancel("a1", 2)  # running: its node is free again and VC a's cell is unbound
    assert s.jobs["a1"].status is JobStatus.CANCELLED
    assert s.cluster.free_gpus == 8 and s.vcs["a"].bound == {}
    assert starts(s.decide(2)) == {}


THREE_NODES = {
    "cell_types": {"NODE": {"child": "V100", "count": 4, "node": True}},
    "physical_cells": [{"type": "NODE", "count": 3}],
    "virtual_clusters": {"a": {"NODE": 1}, "b": {"NODE": 1}},
}


def test_a_dead_node_requeues_its_jobs_and_the_binding_moves_to_a_healthy_cell():
    s = hived(THREE_NODES)
    s.submit(job("a1", "a"), 0)
    first = starts(s.decide(0))["a1"]
    dead = s.cluster.gpu_node[first[0]]
    hit = s.node_failed(dead, 10)
    assert [j.id for j in hit] == ["a1"]
    a1 = s.jobs["a1"]
    # An infrastructure failure: requeued, not counted against the job's retries.
    assert a1.status is JobStatus.PENDING and a1.failures == 0
    assert a1.infra_failures == 1
    # The retry rule holds its first retry for the default backoff of 5 s.
    assert s.decide(10).actions == [] and a1.hold_until == 15
    again = starts(s.decide(15))["a1"]
    assert s.cluster.gpu_node[again[0]] != dead  # bound to a healthy node now
    assert all(s.cluster.gpu_node[g] != dead for g in again)
    # b still gets its guarantee on the third node.
    s.submit(job("b1", "b", submit=16), 16)
    b_gpus = starts(s.decide(16))["b1"]
    assert {s.cluster.gpu_node[g] for g in b_gpus}.isdisjoint({dead, s.cluster.gpu_node[again[0]]})


def test_without_a_spare_cell_the_vc_waits_for_the_node_to_recover():
    s = hived()
    s.submit(job("a1", "a"), 0)
    first = starts(s.decide(0))["a1"]
    dead = s.cluster.gpu_node[first[0]]
    s.node_failed(dead, 10)
    s.submit(job("b1", "b", submit=10), 10)
    placed = starts(s.decide(10))
    # b's node is healthy: b runs; a has no healthy cell left and waits.
    assert list(placed) == ["b1"]
    assert s.jobs["a1"].status is JobStatus.PENDING
    s.node_recovered(dead)
    assert starts(s.decide(20)) == {"a1": first}


def test_plain_scheduler_node_failure_and_recovery():
    from corral.core import Cluster, Scheduler

    s = Scheduler(Cluster.shorthand(2, 4), make_policy("fifo"), make_placement("consolidate"))
    s.submit(job("x", "default"), 0)
    s.submit(job("y", "default"), 0)
    s.decide(0)
    x_node = s.cluster.gpu_node[s.jobs["x"].placement[0]]
    s.node_failed(x_node, 5)
    assert s.cluster.free_gpus == 0  # the dead node's GPUs are out of allocation
    assert starts(s.decide(5)) == {}
    s.finished("y", 50)
    assert s.cluster.gpu_node[starts(s.decide(50))["x"][0]] != x_node
    s.node_recovered(x_node)
    assert s.cluster.free_gpus == 4
