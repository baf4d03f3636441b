"""`Cluster.release_each` and `allocate_each` leave the cluster exactly as one `release` or
`allocate` per group would, bucket order included (the order in which placements meet nodes of
equal free GPUs), and a preemption search's statement frees and takes back its victims so."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.core import Cluster, ClusterError


def state(cluster: Cluster) -> tuple[object, ...]:
    """Everything a change touches: flags, every cell's count, each bucket in order, counters."""
    cells = [(cell.name, cell.free_gpus) for cell in [*cluster.gpus, *cluster.nodes]]
    cells += [(cell.name, cell.free_gpus) for cell in cluster.racks]
    buckets = {t: [list(bucket) for bucket in sizes] for t, sizes in cluster._buckets.items()}
    return (
        bytes(cluster.gpu_free),
        cells,
        cluster.root.free_gpus,
        buckets,
        dict(cluster.free_by_type),
        cluster.version,
        cluster.frees,
    )


def test_nodes_end_in_their_buckets_in_the_order_they_were_last_changed():
    """Three 4-GPU nodes, all full but GPU 4 (node 1): bucket 0 holds [0, 2], bucket 1 [1].
    Freeing, in turn, GPU 0 (node 0), GPU 5 (node 1) and GPU 1 (node 0 again), one at a time:
    node 0 moves to bucket 1, behind node 1; node 1 moves to bucket 2; node 0 follows it there.
    So bucket 2 holds [1, 0]: node 0 was changed last, though first changed before node 1.
    Taking back GPU 1 (node 0), GPU 5 (node 1) and GPU 0 (node 0): node 0 to bucket 1, node 1
    behind it, node 0 to bucket 0 behind node 2: bucket 0 is [2, 0], bucket 1 [1]."""
    one_by_one = Cluster.shorthand(3, 4)
    batched = Cluster.shorthand(3, 4)
    for cluster in (one_by_one, batched):
        cluster.allocate(range(12))
        cluster.release([4])
        assert [list(b) for b in cluster._buckets["v100"]] == [[0, 2], [1], [], [], []]
    groups = [(0,), (5,), (1,)]
    for group in groups:
        one_by_one.release(group)
    batched.release_each(groups)
    assert [list(b) for b in batched._buckets["v100"]] == [[2], [], [1, 0], [], []]
    assert state(batched) == state(one_by_one)
    back = [(1,), (5,), (0,)]
    for group in back:
        one_by_one.allocate(group)
    batched.allocate_each(back)
    assert [list(b) for b in batched._buckets["v100"]] == [[2, 0], [1], [], [], []]
    assert state(batched) == state(one_by_one)
    assert batched.version == 2 + 3 + 3  # one per call or group
    assert batched.frees == 1 + 3


def test_a_gpu_already_as_asked_fails_as_the_groups_one_by_one_do():
    """Releasing [(0,), (1,), (1,)] frees GPU 0 and 1, then fails at the third group, as
    release((1,)) would: the first two groups are done, and nothing else."""
    cluster = Cluster.shorthand(2, 2)
    cluster.allocate([0, 1, 2])
    with pytest.raises(ClusterError, match="already free"):
        cluster.release_each([(0,), (1,), (1,)])
    assert bytes(cluster.gpu_free) == bytes([1, 1, 0, 1])
    assert cluster.nodes[0].free_gpus == 2 and cluster.nodes[1].free_gpus == 1


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), switch=st.sampled_from([None, 2]))
def test_random_batches_leave_the_same_cluster_as_one_call_per_group(seed, switch):
    rng = random.Random(seed)
    one_by_one = Cluster.shorthand(6, 4, racks=2, gpus_per_switch=switch)
    batched = Cluster.shorthand(6, 4, racks=2, gpus_per_switch=switch)
    for _ in range(12):
        taken = [g for g in range(24) if not one_by_one.gpu_free[g]]
        free = [g for g in range(24) if one_by_one.gpu_free[g]]
        release = bool(taken) and (not free or rng.random() < 0.5)
        pool = taken if release else free
        rng.shuffle(pool)
        groups: list[tuple[int, ...]] = []
        while pool and rng.random() < 0.8:
            size = rng.randint(1, min(5, len(pool)))
            groups.append(tuple(pool[:size]))
            del pool[:size]
        for group in groups:
            (one_by_one.release if release else one_by_one.allocate)(group)
        (batched.release_each if release else batched.allocate_each)(groups)
        assert state(batched) == state(one_by_one)
