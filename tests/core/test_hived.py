"""HiveD admission on hand-worked scenarios: guarantees with topology, harvesting, reclaiming."""

from __future__ import annotations

import pytest

from corral.core import JobRefused, JobSpec, JobStatus, Preempt, Priority, Start
from corral.core.config import parse_cluster_config
from corral.core.placement import make_placement
from corral.core.policy import make_policy
from corral.core.tenancy.hived import HivedScheduler

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
