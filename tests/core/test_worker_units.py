"""Workers of several GPUs: each node a job spans receives a multiple of `gpus_per_worker`.

Hand-worked on small clusters. GPU ids are numbered node by node: on `Cluster.shorthand(n, 4)`
node i holds GPUs 4i..4i+3, and a node gives its lowest free GPUs first. Busy GPUs are made by
allocating them directly (or `take_offline` through a scheduler); the multi-node searches rank
nodes by the GPUs they can offer (free - free % unit, most first, then lowest index), and give the
remainder to the tightest node (fewest free, then lowest index) that can offer it.
"""

from __future__ import annotations

import copy
from collections import Counter

import pytest

from corral.core import Cluster, Job, JobRefused, JobSpec, NodeDef, Priority, Start
from corral.core.admission.hived import HivedScheduler
from corral.core.cache import DataCache, DataRead
from corral.core.config import parse_cluster_config
from corral.core.gputypes import type_speeds
from corral.core.placement import NotPlaced, Placed, Placement, make_placement
from corral.core.policy import make_policy
from corral.core.scheduler import Scheduler
from tests.core.helpers import scheduler, spec, started


def job(gpus: int, unit: int = 1, queued_since: float = 0.0, **kw: object) -> Job:
    return Job(spec=spec("j", gpus, gpus_per_worker=unit, **kw), queued_since=queued_since)


def per_node(cluster: Cluster, gpus: tuple[int, ...]) -> dict[int, int]:
    return dict(Counter(cluster.gpu_node[g] for g in gpus))


def placed(result: Placed | NotPlaced) -> tuple[int, ...]:
    assert isinstance(result, Placed), result
    return result.gpus


def four_nodes_3_3_4_1() -> Cluster:
    """Four 4-GPU nodes in one rack with 3, 3, 4 and 1 free GPUs (11 free)."""
    cluster = Cluster.shorthand(4, 4)
    cluster.allocate([0])  # node 0: 1, 2, 3 free
    cluster.allocate([4])  # node 1: 5, 6, 7 free
    cluster.allocate([12, 13, 14])  # node 3: 15 free
    return cluster


def strict(name: str) -> Placement:
    """The placement in its strict (consolidating) phase when asked at t=0."""
    return make_placement(name, relax_after_s=100) if name == "relax" else make_placement(name)


def test_default_unit_is_one():
    assert JobSpec(id="x", submit_time=0, gpus=8).gpus_per_worker == 1


# -- consolidate, and relax before it relaxes: fewest nodes in one rack ---------------------------


@pytest.mark.parametrize("name", ["consolidate", "relax"])
def test_rack_search_keeps_workers_whole(name):
    # 8 GPUs do not fit one 4-GPU node, so the rack search runs.
    # unit 1: node 2 gives 4, node 0 3, and the last 1 goes to the tightest node offering 1:
    #   node 3 (1 free) rather than node 1 (3 free). 4 + 3 + 1 splits workers of 2 or 4.
    cluster = four_nodes_3_3_4_1()
    assert placed(strict(name).place(cluster, job(8), 0)) == (8, 9, 10, 11, 1, 2, 3, 15)
    # unit 2: offers are 2, 2, 4, 0: node 2 gives 4, node 0 2 and node 1 the last 2 (node 3
    # offers none).
    gpus = placed(strict(name).place(cluster, job(8, unit=2), 0))
    assert gpus == (8, 9, 10, 11, 1, 2, 5, 6)
    assert per_node(cluster, gpus) == {2: 4, 0: 2, 1: 2}
    # unit 4: only node 2 offers a whole worker: 4 < 8, not placed although 11 GPUs are free.
    result = strict(name).place(cluster, job(8, unit=4), 0)
    assert isinstance(result, NotPlaced)
    assert "4 per worker" in result.reason
    if name == "relax":
        assert "relaxes at t=100s" in result.reason


def test_relax_after_its_deadline_still_keeps_workers_whole():
    # Relaxed, fewest nodes anywhere: most free first is node 2 (4), then node 0 (3) offers
    # no worker of 4 and neither does any node after it: still not placed.
    cluster = four_nodes_3_3_4_1()
    relax = make_placement("relax", relax_after_s=100)
    assert isinstance(relax.place(cluster, job(8, unit=4), 100), NotPlaced)


# -- relax after it relaxes, and profile: fewest nodes anywhere -----------------------------------


def two_racks_3_2_3_2() -> Cluster:
    """Two racks of two 4-GPU nodes; nodes 0..3 have 3, 2, 3, 2 free (each rack 5 free)."""
    cluster = Cluster.shorthand(4, 4, racks=2)
    # One allocation per node, in this order: among equally free nodes the cluster lists the
    # one that reached that count first (node 0 before node 2, node 1 before node 3).
    cluster.allocate([0])
    cluster.allocate([4, 5])
    cluster.allocate([8])
    cluster.allocate([12, 13])
    return cluster


@pytest.mark.parametrize("name", ["relax", "profile"])
def test_fewest_nodes_anywhere_takes_whole_workers(name):
    cluster = two_racks_3_2_3_2()
    placement = make_placement(name, relax_after_s=100) if name == "relax" else make_placement(name)
    now = 100.0  # relax: the job queued at 0 has waited 100 s; profile: any time
    # 6 GPUs fit in no rack (5 free each). unit 1: node 0 (3) and node 2 (3): 3 + 3.
    result = placement.place(cluster, job(6), now)
    assert placed(result) == (1, 2, 3, 9, 10, 11)
    # unit 2: every node offers 2; node 0, node 2 (3 free), then node 1 (first of the 2-free).
    result = placement.place(cluster, job(6, unit=2), now)
    assert placed(result) == (1, 2, 9, 10, 6, 7)
    assert per_node(cluster, result.gpus) == {0: 2, 2: 2, 1: 2}
    if name == "relax":
        assert result.relaxed
        before = placement.place(cluster, job(6, unit=2), 99.0)
        assert isinstance(before, NotPlaced) and "one rack" in before.reason
    # unit 3: nodes 0 and 2 offer 3 each, the 2-free nodes none.
    assert per_node(cluster, placed(placement.place(cluster, job(6, unit=3), now))) == {0: 3, 2: 3}


# -- any: first free GPUs in cluster order ---------------------------------------------------------


def test_first_free_takes_whole_workers_in_cluster_order():
    cluster = Cluster.shorthand(3, 4)
    cluster.allocate([0])  # node 0: 1, 2, 3 free
    anyfree = make_placement("any")
    assert placed(anyfree.place(cluster, job(4), 0)) == (1, 2, 3, 4)
    assert placed(anyfree.place(cluster, job(4, unit=2), 0)) == (1, 2, 4, 5)
    assert placed(anyfree.place(cluster, job(4, unit=4), 0)) == (4, 5, 6, 7)
    # 8 GPUs in workers of 4: node 0 offers none, nodes 1 and 2 one each.
    assert placed(anyfree.place(cluster, job(8, unit=4), 0)) == tuple(range(4, 12))
    cluster.allocate([8])  # node 2: 3 free
    result = anyfree.place(cluster, job(8, unit=4), 0)
    assert isinstance(result, NotPlaced)
    assert result.reason.endswith("each worker needs 4 GPUs on one node")


# -- unit equal to the node size ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["consolidate", "relax", "any"])
def test_unit_equal_to_node_size_takes_only_wholly_free_nodes(name):
    cluster = Cluster.shorthand(3, 4)
    cluster.allocate([0])
    cluster.allocate([8])  # free: node 0 3, node 1 4, node 2 3
    placement = make_placement(name)
    # unit 1 spreads 8 GPUs over all three nodes (the split workers of 4 must not have).
    assert set(per_node(cluster, placed(placement.place(cluster, job(8), 1000)))) == {0, 1, 2}
    assert isinstance(placement.place(cluster, job(8, unit=4), 1000), NotPlaced)  # relaxed too
    # One worker of 4 is a node-local job: the one wholly free node.
    assert placed(placement.place(cluster, job(4, unit=4), 0)) == (4, 5, 6, 7)
    cluster.release([8])  # node 2 wholly free again
    assert placed(placement.place(cluster, job(8, unit=4), 0)) == tuple(range(4, 12))


# -- ties ------------------------------------------------------------------------------------------


def test_remainder_goes_to_the_tightest_node_then_the_lowest_index():
    cluster = Cluster.shorthand(3, 4)
    cluster.allocate([4])
    cluster.allocate([8])  # free: node 0 4, node 1 3, node 2 3
    consolidate = make_placement("consolidate")
    # unit 2: node 0 gives 4; nodes 1 and 2 both offer 2 and both have 3 free: node 1 wins.
    assert placed(consolidate.place(cluster, job(6, unit=2), 0)) == (0, 1, 2, 3, 5, 6)
    # Node 2 now has 2 free, still offering 2 (as node 1 does): the tighter node 2 gets them.
    cluster.allocate([9])
    assert placed(consolidate.place(cluster, job(6, unit=2), 0)) == (0, 1, 2, 3, 10, 11)


def test_equal_offers_are_taken_in_node_order_whatever_their_free_count():
    cluster = Cluster.shorthand(4, 4)
    cluster.allocate([4])  # node 1: 3 free, offers 2
    cluster.allocate([8, 9])  # node 2: 2 free, offers 2
    cluster.allocate([12])  # node 3: 3 free, offers 2
    consolidate = make_placement("consolidate")
    # unit 1: node 0 (4), node 1 (3), node 3 (3), and the last 1 on the tightest: node 2.
    assert placed(consolidate.place(cluster, job(8), 0)) == (0, 1, 2, 3, 5, 6, 7, 10)
    # unit 2: node 0 gives 4, then nodes 1 and 2 (lowest indexes) 2 each; for the remainder
    # node 2 (2 free) is tighter than node 3 (3 free), so it stays.
    assert placed(consolidate.place(cluster, job(8, unit=2), 0)) == (0, 1, 2, 3, 5, 6, 10, 11)


# -- cache-aware: its own rack search ------------------------------------------------------------


def test_cache_aware_keeps_workers_whole():
    # Three 4-GPU nodes; node 2 caches data set "a" (100 GB, read at 0.4 GB/s per GPU while
    # each GPU's share of storage is 0.1 GB/s, so the job is IO-bound and prefers the cache).
    cluster = Cluster.shorthand(3, 4)
    reads = {"a": DataRead("a", 100.0, 0.4)}
    cache = DataCache(
        cluster,
        capacity_gb_per_node=200,
        storage_gb_s_per_node=0.4,
        reads=lambda s: reads.get(s.model),
    )
    s = Scheduler(
        cluster,
        make_policy("fifo"),
        make_placement("cache-aware", cache=cache),
        on_start=cache.on_start,
    )
    for name, model in (("f0", ""), ("f1", ""), ("warm", "a")):  # nodes 0, 1, 2 in turn
        s.submit(spec(name, 4, model=model), 0)
    s.decide(0)
    assert s.cluster.nodes_of(s.jobs["warm"].placement) == {2}
    for name in ("f0", "f1", "warm"):
        s.finished(name, 10)
    s.take_offline([0, 8])  # free: node 0 3, node 1 4, node 2 3 (caching "a")
    placement = s.placement
    # unit 1: node 1 (most free) gives 4, then the 2 left go to the node caching "a": 4 + 2.
    gpus = placed(placement.place(cluster, job(6, model="a"), 20))
    assert per_node(cluster, gpus) == {1: 4, 2: 2}
    # unit 3: each node offers 3; node 2 first (caches "a"), then the remainder 3 goes to the
    # tightest of nodes 0 (3 free) and 1 (4 free): node 0.
    gpus = placed(placement.place(cluster, job(6, unit=3, model="a"), 20))
    assert gpus == (9, 10, 11, 1, 2, 3)


# -- hetero: a GPU type whose nodes are too small for one worker is not matched --------------------


def test_hetero_does_not_match_a_type_whose_nodes_cannot_hold_a_worker():
    cluster = Cluster.from_nodes(
        [NodeDef(f"a{i}", 2, "a100") for i in range(4)] + [NodeDef("v0", 4, "v100")]
    )
    assert type_speeds(cluster, job(4), None) == {"a100": 1.0, "v100": 1.0}
    assert type_speeds(cluster, job(4, unit=2), None) == {"a100": 1.0, "v100": 1.0}
    assert type_speeds(cluster, job(4, unit=4), None) == {"v100": 1.0}


# -- refusals ------------------------------------------------------------------------------------


def test_refusal_names_the_worker_size_and_the_largest_node():
    s = scheduler(2, 4)
    assert s.refusal(spec("x", 8, gpus_per_worker=8)) == (
        "each worker needs 8 GPUs on one node, but the largest node has 4 (use more workers)"
    )
    with pytest.raises(JobRefused, match="each worker needs 8 GPUs on one node"):
        s.submit(spec("x", 8, gpus_per_worker=8), 0)
    assert s.refusal(spec("y", 8, gpus_per_worker=4)) is None  # one worker per node
    assert s.refusal(spec("z", 8, gpus_per_worker=1)) is None
    assert s.refusal(spec("w", 6, gpus_per_worker=4)) == (
        "6 GPUs cannot be split into workers of 4 GPUs"
    )
    # The GPU count check comes first.
    assert "only 8 GPUs" in str(s.refusal(spec("v", 16, gpus_per_worker=16)))


def test_refusal_looks_only_at_acceptable_gpu_types():
    s = Scheduler(
        Cluster.from_nodes(
            [NodeDef("big", 8, "a100"), NodeDef("small0", 4, "v100"), NodeDef("small1", 4, "v100")]
        ),
        make_policy("fifo"),
        make_placement("consolidate"),
    )
    v100 = frozenset({"v100"})
    assert s.refusal(spec("x", 8, gpus_per_worker=8)) is None  # the a100 node holds it
    assert s.refusal(spec("y", 8, gpus_per_worker=8, gpu_types=v100 | {"a100"})) is None
    assert s.refusal(spec("z", 8, gpus_per_worker=4, gpu_types=v100)) is None
    assert s.refusal(spec("w", 8, gpus_per_worker=8, gpu_types=v100)) == (
        "each worker needs 8 GPUs on one node, but the largest node of type v100 has 4 "
        "(use more workers)"
    )
    # More GPUs than the type has: the GPU count is what the message names.
    assert s.refusal(spec("u", 16, gpus_per_worker=8, gpu_types=v100)) == (
        "asks for 16 GPUs but the cluster has only 8 GPUs of type v100"
    )


def test_refusal_counts_only_whole_workers_per_node():
    # Two 6-GPU nodes: 12 GPUs, but workers of 4 fit once per node (8 GPUs in all).
    s = Scheduler(
        Cluster.from_nodes([NodeDef("n0", 6), NodeDef("n1", 6)]),
        make_policy("fifo"),
        make_placement("relax"),
    )
    assert s.refusal(spec("x", 12, gpus_per_worker=4)) == (
        "asks for 12 GPUs, 4 per worker on one node, but the nodes can give only 8 GPUs in "
        "whole workers"
    )
    assert s.refusal(spec("y", 8, gpus_per_worker=4)) is None
    assert s.refusal(spec("z", 12, gpus_per_worker=6)) is None
    assert s.refusal(spec("w", 12, gpus_per_worker=3)) is None


def test_the_room_for_workers_is_remembered_per_cluster_and_follows_its_nodes():
    """`Cluster.worker_room` is worked out once per cluster and key; a cluster with other nodes
    (the live manager makes a new one when nodes join or leave) answers for its own nodes."""
    twelve = spec("x", 12, gpus_per_worker=4)
    only_8 = (
        "asks for 12 GPUs, 4 per worker on one node, but the nodes can give only 8 GPUs in "
        "whole workers"
    )

    def on(*sizes: int) -> Scheduler:
        nodes = [NodeDef(f"n{i}", size) for i, size in enumerate(sizes)]
        return Scheduler(Cluster.from_nodes(nodes), make_policy("fifo"), make_placement("relax"))

    two = on(6, 6)  # 4 + 4 in whole workers
    assert two.refusal(twelve) == only_8
    assert two.cluster.worker_room(None, 4) == (6, 8)
    assert two.refusal(twelve) == only_8  # remembered: the same answer
    joined = on(6, 6, 4)  # a node joins: 4 + 4 + 4
    assert joined.cluster.worker_room(None, 4) == (6, 12)
    assert joined.refusal(twelve) is None
    left = on(6, 2, 4)  # one of the 6-GPU nodes left, a 2-GPU one came: 4 + 0 + 4
    assert left.refusal(twelve) == only_8
    assert left.refusal(spec("y", 12, gpus_per_worker=6)) == (
        "asks for 12 GPUs, 6 per worker on one node, but the nodes can give only 6 GPUs in "
        "whole workers"
    )
    assert two.refusal(spec("y", 12, gpus_per_worker=6)) is None  # 6 + 6
    assert copy.deepcopy(two.cluster).worker_room(None, 6) == (6, 12)


def test_consolidate_spreads_across_racks_when_no_rack_holds_the_workers():
    # Two racks of two 6-GPU nodes. A rack has 12 GPUs but gives only 4 + 4 to workers of 4, so
    # 12 GPUs in workers of 4 fit in no rack: the fewest nodes anywhere, 4 from each of three.
    cluster = Cluster.from_nodes(
        NodeDef(f"n{i}", 6, rack=f"r{i // 2}") for i in range(4)
    )  # node i holds GPUs 6i..6i+5
    consolidate = make_placement("consolidate")
    twelve = job(12, unit=4)
    assert consolidate.scope(cluster, twelve, 0) == "cluster"
    gpus = placed(consolidate.place(cluster, twelve, 0))
    assert gpus == (0, 1, 2, 3, 6, 7, 8, 9, 12, 13, 14, 15)
    # Workers of 1 fit in a rack (12 GPUs on its two nodes).
    assert consolidate.scope(cluster, job(12), 0) == "rack"
    assert per_node(cluster, placed(consolidate.place(cluster, job(12), 0))) == {0: 6, 1: 6}


PAIRS = {
    "cell_types": {
        "V100-2GPU": {"child": "V100", "count": 2},
        "V100-NODE": {"child": "V100-2GPU", "count": 2, "node": True},
    },
    "physical_cells": [{"type": "V100-NODE", "count": 2}],
    # VC a: one whole node; VC pairs: two 2-GPU cells, which its scheduler sees as two nodes
    # (they may be bound on different machines).
    "virtual_clusters": {"a": {"V100-NODE": 1}, "pairs": {"V100-2GPU": 2}},
}


def hived_job(job_id: str, vc: str, gpus: int, unit: int, opportunistic: bool = False) -> JobSpec:
    return JobSpec(
        id=job_id,
        submit_time=0,
        gpus=gpus,
        vc=vc,
        duration_s=100.0,
        gpus_per_worker=unit,
        priority=Priority.OPPORTUNISTIC if opportunistic else Priority.GUARANTEED,
    )


def test_hived_refuses_workers_larger_than_the_vcs_cells():
    parsed = parse_cluster_config(PAIRS)
    s = HivedScheduler(
        parsed.cluster, parsed.virtual_clusters, make_policy("fifo"), make_placement("relax")
    )
    assert s.refusal(hived_job("p4", "pairs", 4, 4)) == (
        "each worker needs 4 GPUs on one node, but the largest node in VC pairs has 2 "
        "(use more workers)"
    )
    assert s.refusal(hived_job("a4", "a", 4, 4)) is None
    assert s.refusal(hived_job("o8", "", 8, 8, opportunistic=True)) == (
        "each worker needs 8 GPUs on one node, but the largest node has 4 (use more workers)"
    )
    # Workers of 2 in VC pairs: one per cell; each cell lies within one physical node.
    s.submit(hived_job("p2", "pairs", 4, 2), 0)
    decision = s.decide(0)
    gpus = next(a.gpus for a in decision.actions if isinstance(a, Start))
    assert all(count % 2 == 0 for count in per_node(s.cluster, gpus).values())


# -- through the scheduler -----------------------------------------------------------------------


@pytest.mark.parametrize(("unit", "expected"), [(1, (0, 1, 2, 4, 5, 6)), (2, (0, 1, 4, 5, 10, 11))])
def test_decide_starts_a_job_on_whole_workers(unit, expected):
    s = scheduler(3, 4, "fifo", "relax")
    # Best fit: a (3) -> node 0 [0-2]; b (3) -> node 1 [4-6]; c (2) -> node 2 [8, 9];
    # d (1) -> node 0 [3] and e (1) -> node 1 [7], the tightest nodes with room.
    for name, gpus in (("a", 3), ("b", 3), ("c", 2), ("d", 1), ("e", 1)):
        s.submit(spec(name, gpus), 0)
    assert started(s.decide(0).actions) == {
        "a": (0, 1, 2),
        "b": (4, 5, 6),
        "c": (8, 9),
        "d": (3,),
        "e": (7,),
    }
    s.finished("a", 10)
    s.finished("b", 10)  # free: node 0 [0-2], node 1 [4-6], node 2 [10, 11]
    s.submit(spec("w", 6, submit=10, gpus_per_worker=unit), 10)
    # unit 1: nodes 0 and 1 give 3 each. unit 2: each node offers 2, taken in node order.
    assert started(s.decide(10).actions) == {"w": expected}


def test_a_job_of_smaller_workers_is_tried_after_a_larger_one_failed():
    # Free: node 0 3, node 1 4, node 2 3. An 8-GPU job in workers of 4 cannot start; one of the
    # same size in workers of 1 behind it can (4 + 3 + 1), in the same round.
    s = scheduler(3, 4, "fifo", "relax", backfill=True)
    s.take_offline([0, 8])
    s.submit(spec("big-workers", 8, gpus_per_worker=4), 0)
    s.submit(spec("small-workers", 8, submit=1), 1)
    actions = started(s.decide(1).actions)
    assert list(actions) == ["small-workers"]
    assert per_node(s.cluster, actions["small-workers"]) == {1: 4, 0: 3, 2: 1}
    assert "4 per worker" in s.explain("big-workers", 1)
