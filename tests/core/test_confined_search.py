"""A search for preemption victims under a `confined` placement frees only the victims in the
nodes or racks with room for the job, and leaves the cluster as freeing them all would have:
`Cluster.allocate_each` with `held` groups and a search worked by hand, and random LAS runs
decided exactly as with every victim freed, where the first placement of a search fails too."""

from __future__ import annotations

import numpy as np
import pytest

from corral.core import Cluster, ClusterError, JobSpec, Preempt, Scheduler, Start
from corral.core.placement.named import Consolidate, Profile, Relax
from corral.core.policy import make_policy
from corral.core.preempt import Preemption
from corral.sim.engine import Simulation
from tests.core.test_cluster_batches import state


def test_held_groups_move_their_nodes_in_turn_with_the_others():
    """Three 4-GPU nodes, all full but GPU 4 (node 1): bucket 0 holds [0, 2], bucket 1 [1].
    Taking back GPU 0 (node 0, held: never freed), GPU 4 (node 1) and GPU 8 (node 2, held):
    node 0 moves to the end of bucket 0, [2, 0]; node 1 leaves bucket 1 for the end of bucket
    0, [2, 0, 1]; node 2 moves to the end, [0, 1, 2]. Freeing GPUs 0 and 8 first and taking
    back all three in turn leaves the same buckets, counts and flags."""
    held = Cluster.shorthand(3, 4)
    freed = Cluster.shorthand(3, 4)
    for cluster in (held, freed):
        cluster.allocate(range(12))
        cluster.release([4])
        assert [list(b) for b in cluster._buckets["v100"]] == [[0, 2], [1], [], [], []]
    groups = [(0,), (4,), (8,)]
    held.allocate_each(groups, [True, False, True])
    assert [list(b) for b in held._buckets["v100"]] == [[0, 1, 2], [], [], [], []]
    freed.release_each([(0,), (8,)])
    freed.allocate_each(groups)
    assert state(held)[:5] == state(freed)[:5]  # all but the counters
    assert held.version == 2 + 3  # one per call or group, held ones too


def test_a_held_group_of_several_nodes_moves_them_in_the_order_its_gpus_name_them():
    """Two 4-GPU nodes, full: bucket 0 is [0, 1]. A held job on GPUs 5, 1, 6 (nodes 1, 0, 1)
    moves node 1, then node 0: bucket 0 is [1, 0]."""
    cluster = Cluster.shorthand(2, 4)
    cluster.allocate(range(8))
    cluster.allocate_each([(5, 1, 6)], [True])
    assert [list(b) for b in cluster._buckets["v100"]] == [[1, 0], [], [], [], []]


def test_a_held_group_must_be_allocated():
    """GPU 3 is free: taking back (0,) and, held, (3,) frees nothing back and fails."""
    cluster = Cluster.shorthand(1, 4)
    cluster.allocate([1, 2])
    before = state(cluster)
    with pytest.raises(ClusterError, match="not allocated"):
        cluster.allocate_each([(0,), (3,)], [False, True])
    assert state(cluster)[:5] == before[:5]


def test_a_search_frees_only_the_victims_on_nodes_with_room():
    """Four 4-GPU nodes, LAS with one threshold at 100 GPU-s. At 0: P (4 GPUs) takes node 0, Q
    (2) node 1, S (4) node 2; P and S drop to queue 1 at 25, Q at 50. At 55 R (2) joins Q on
    node 1 and T (4) takes node 3, both in queue 0: bucket 0 holds [0, 2, 1, 3]. At 60 J (4
    GPUs, queue 0) needs a whole node: from the lowest key up its victims are Q (entered queue
    1 last), whose node keeps R, then S, whose node has room. Only S is freed to place J, and
    J takes node 2. Q, left allocated, moves in its bucket as freeing and taking it back would
    have moved it, so bucket 0 ends [0, 3, 1, 2] (node 1 after node 3, node 2 last: J's
    start); without the move it would end [0, 1, 3, 2]."""
    s = Scheduler(
        Cluster.shorthand(4, 4), make_policy("las", thresholds_gpu_s=[100]), Consolidate()
    )
    for job_id, gpus in (("P", 4), ("Q", 2), ("S", 4)):
        s.submit(JobSpec(id=job_id, submit_time=0, gpus=gpus, duration_s=1000), 0)
    s.decide(0)
    s.decide(25)
    s.decide(50)
    for job_id, gpus in (("R", 2), ("T", 4)):
        s.submit(JobSpec(id=job_id, submit_time=55, gpus=gpus, duration_s=1000), 55)
    s.decide(55)
    assert [s.jobs[j].placement for j in "PQSRT"] == [
        (0, 1, 2, 3),
        (4, 5),
        (8, 9, 10, 11),
        (6, 7),
        (12, 13, 14, 15),
    ]
    assert [list(b) for b in s.cluster._buckets["v100"]] == [[0, 2, 1, 3], [], [], [], []]
    freed: list[list[str]] = []
    release_each = s.cluster.release_each

    def spied(groups):  # type: ignore[no-untyped-def]
        freed.append([job.id for job in s.jobs.values() if job.placement in groups])
        release_each(groups)

    s.cluster.release_each = spied  # type: ignore[method-assign]
    s.submit(JobSpec(id="J", submit_time=60, gpus=4, duration_s=1000), 60)
    assert s.decide(60).actions == [
        Preempt("S", (8, 9, 10, 11), "J"),
        Start("J", (8, 9, 10, 11)),
    ]
    assert freed == [["S"]]
    assert [list(b) for b in s.cluster._buckets["v100"]] == [[0, 3, 1, 2], [], [], [], []]


class _Unconfined(Relax):
    confined = False


def _trace(seed: int, count: int) -> list[JobSpec]:
    """Overloaded: 1 to 24 GPUs every 40 s on average; a 16-GPU job runs 8-GPU workers (each
    on a whole node) half of the time, so that a rack with room for its GPUs may have none for
    its workers and the first placement of a search fails."""
    rng = np.random.default_rng(seed)
    at = np.cumsum(rng.exponential(40.0, count))
    jobs = []
    for i in range(count):
        gpus = int(rng.choice([1, 1, 2, 2, 3, 4, 4, 8, 12, 16, 24]))
        worker = 8 if gpus == 16 and rng.random() < 0.5 else 1
        jobs.append(
            JobSpec(
                id=f"j{i}",
                submit_time=float(at[i]),
                gpus=gpus,
                gpus_per_worker=worker,
                duration_s=float(rng.lognormal(6.0, 1.2)),
                spread_slowdown=1.3 if rng.random() < 0.5 else 1.0,  # (Profile consolidates)
            )
        )
    return jobs


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("placement", [Relax, Consolidate, Profile])
def test_confined_searches_decide_exactly_as_freeing_every_victim(seed: int, placement: type):
    # 8 nodes x 8 GPUs in 2 racks: every start and preemption, in order and instant, and the
    # cluster at the end (buckets in order) are the same with only the victims in places with
    # room freed as with every victim freed; both kinds of search happen.
    unconfined = _Unconfined if placement is Relax else type("U", (placement,), {"confined": False})
    runs, clusters = [], []
    outcomes: list[bool] = []
    confined = Preemption._start_confined

    def counted(self, *args):  # type: ignore[no-untyped-def]
        started = confined(self, *args)
        outcomes.append(started)
        return started

    for kind in (placement, unconfined):
        s = Scheduler(
            Cluster.shorthand(8, 8, racks=2),
            make_policy("las", thresholds_gpu_s=[400, 4000]),
            kind(),
        )
        if kind is placement:
            s.preemption._start_confined = counted.__get__(s.preemption)  # type: ignore[method-assign]
        result = Simulation(_trace(seed, 250), s, record_decisions=True).run()
        runs.append(result.decisions)
        clusters.append(state(s.cluster)[:5])
    assert any(isinstance(a, Preempt) for _, a in runs[0])
    assert runs[0] == runs[1]
    assert clusters[0] == clusters[1]
    assert True in outcomes and False in outcomes
