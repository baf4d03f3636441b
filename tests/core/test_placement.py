"""Placements on hand-made clusters."""

from __future__ import annotations

import pytest

from corral.core import Cluster, Job, JobRefused, NodeDef
from corral.core.placement import NotPlaced, Placed, make_placement
from tests.core.helpers import scheduler, spec, started


def job(gpus: int, **kw: object) -> Job:
    return Job(spec=spec("j", gpus, **kw))


def test_consolidate_picks_the_tightest_node_that_fits():
    cluster = Cluster.shorthand(3, 8)
    cluster.allocate(range(0, 5))  # node 0: 3 free
    cluster.allocate(range(8, 10))  # node 1: 6 free; node 2: 8 free
    result = make_placement("consolidate").place(cluster, job(3), 0)
    assert result == Placed((5, 6, 7))
    result = make_placement("consolidate").place(cluster, job(4), 0)
    assert isinstance(result, Placed) and set(result.gpus) == set(range(10, 14))


def test_consolidate_multi_node_job_takes_fewest_nodes_in_one_rack():
    # Two racks of two 8-GPU nodes. Rack 0 has 8 + 4 free, rack 1 has 6 + 6 free.
    cluster = Cluster.shorthand(4, 8, racks=2)
    cluster.allocate(range(8, 12))
    cluster.allocate([16, 17])
    cluster.allocate([24, 25])
    result = make_placement("consolidate").place(cluster, job(12), 0)
    # Both racks can hold 12 on two nodes; rack 0 is left with less free (0 vs 0): equal,
    # so the lower rack wins; node 0 gives 8 and node 1 its 4 free GPUs.
    assert isinstance(result, Placed)
    assert cluster.nodes_of(result.gpus) == {0, 1}
    # 14 GPUs fit in no single rack (12 free each): consolidate refuses.
    refused = make_placement("consolidate").place(cluster, job(14), 0)
    assert isinstance(refused, NotPlaced) and "one rack" in refused.reason


def test_node_local_job_refused_when_no_single_node_has_room():
    cluster = Cluster.shorthand(2, 4)
    cluster.allocate([0, 1, 4, 5])
    result = make_placement("consolidate").place(cluster, job(4), 0)
    assert isinstance(result, NotPlaced) and "one node" in result.reason
    anywhere = make_placement("any").place(cluster, job(4), 0)
    assert anywhere == Placed((2, 3, 6, 7))


def test_relax_spreads_a_job_only_after_its_deadline():
    s = scheduler(2, 4, "fifo", "relax", placement_options={"relax_after_s": 100})
    s.submit(spec("x", 2), 0)
    s.submit(spec("y", 2), 0)
    # Best fit puts y next to x on node 0; occupy node 1 too so each node has 2 free.
    s.decide(0)
    s.submit(spec("z", 2, submit=0), 0)
    s.decide(0)
    s.finished("y", 1)
    assert [s.cluster.node_free(n) for n in (0, 1)] == [2, 2]
    s.submit(spec("r", 4, submit=1), 1)
    decision = s.decide(1)
    assert decision.actions == []
    assert decision.wake_at == pytest.approx(101)  # relax deadline: queued at 1 + 100
    assert "relaxes at t=101s" in s.explain("r", 1)
    decision = s.decide(101)
    assert set(started(decision.actions)["r"]) == {2, 3, 6, 7}
    assert decision.actions[0].relaxed and s.jobs["r"].relaxed


def test_consolidate_never_spreads():
    s = scheduler(2, 4, "fifo", "consolidate")
    for name in ("x", "z"):
        s.submit(spec(name, 2), 0)
    s.submit(spec("filler", 4), 0)
    s.decide(0)  # x, z share node 0 (best fit), filler takes node 1
    s.finished("z", 5)
    s.finished("filler", 5)
    s.submit(spec("big", 6, submit=5), 5)
    # 6 free GPUs in the rack (2 + 4): two nodes in one rack is allowed for a 6-GPU job.
    assert set(started(s.decide(5).actions)["big"]) == {2, 3, 4, 5, 6, 7}


def test_profile_consolidates_only_sensitive_jobs():
    cluster = Cluster.shorthand(2, 4)
    cluster.allocate([0, 1, 4, 5])
    placement = make_placement("profile", sensitive_above=1.1)
    assert isinstance(placement.place(cluster, job(4, spread_slowdown=1.5), 0), NotPlaced)
    assert placement.place(cluster, job(4, spread_slowdown=1.0), 0) == Placed((2, 3, 6, 7))


def test_gpu_type_constraint_and_single_type_gangs():
    cluster = Cluster.from_nodes(
        [
            NodeDef("k", 4, "k80"),
            NodeDef("v", 4, "v100"),
        ]
    )
    placement = make_placement("any")
    result = placement.place(cluster, job(2, gpu_types=frozenset({"v100"})), 0)
    assert isinstance(result, Placed) and {cluster.gpus[g].gpu_type for g in result.gpus} == {
        "v100"
    }
    # 6 GPUs exist, but no 6 of one type: a gang never mixes types.
    s = scheduler(1, 1)
    s.cluster = cluster
    with pytest.raises(JobRefused, match="asks for 6 GPUs but the cluster has only 4 GPUs"):
        s.submit(spec("mixed", 6), 0)


def test_job_larger_than_cluster_is_refused_at_submit():
    s = scheduler(2, 8)
    with pytest.raises(
        JobRefused, match="job huge: asks for 32 GPUs but the cluster has only 16 GPUs"
    ):
        s.submit(spec("huge", 32), 0)
    assert "huge" not in s.jobs and s.pending_count == 0


def test_switch_level_keeps_small_jobs_under_one_switch():
    cluster = Cluster.shorthand(1, 8, gpus_per_switch=2)
    cluster.allocate([0, 2])  # switches 0 and 1 each have one free GPU
    gpus = cluster.pick_in_node(0, 2)
    # A switch with two free GPUs is preferred to two half-used ones.
    assert gpus == [4, 5]
