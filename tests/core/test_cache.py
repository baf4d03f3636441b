"""Node data caches (SiloD): speeds, allocation and cache-aware placement on hand-worked cases.

Unless a test says otherwise: 2 nodes of 4 GPUs, 0.4 GB/s of remote storage per node, so each
GPU's share is 0.1 GB/s; data set "a" is 100 GB and read at 0.4 GB/s per GPU at full speed, so a
job reading it from storage alone runs at 0.1 / 0.4 = 0.25.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np
import pytest

from corral.core import Cluster, Job, JobSpec, JobStatus, Scheduler
from corral.core.cache import (
    CacheError,
    DataCache,
    DataRead,
    Want,
    greedy_allocation,
    lru_hit_ratio,
)
from corral.core.placement import NotPlaced, Placed, make_placement
from corral.core.policy import make_policy
from corral.sim.engine import Simulation
from tests.core.helpers import spec

READS = {
    "a": DataRead("a", 100.0, 0.4),
    "b": DataRead("b", 80.0, 0.4),
    "big": DataRead("big", 300.0, 0.4),
    "light": DataRead("light", 100.0, 0.05),  # storage alone keeps it at full speed
}


def reads(job_spec: JobSpec) -> DataRead | None:
    return READS.get(job_spec.model)


def setup(
    capacity_gb: float, policy: str = "silod", placement: str = "consolidate", nodes: int = 2
) -> tuple[Scheduler, DataCache]:
    cluster = Cluster.shorthand(nodes, 4)
    cache = DataCache(
        cluster,
        capacity_gb_per_node=capacity_gb,
        storage_gb_s_per_node=0.4,
        reads=reads,
        policy=policy,
    )
    options = {"cache": cache} if placement == "cache-aware" else {}
    scheduler = Scheduler(
        cluster,
        make_policy("fifo"),
        make_placement(placement, **options),
        on_start=cache.on_start,
    )
    return scheduler, cache


def run(scheduler: Scheduler, job_id: str, gpus: int, model: str, now: float) -> Job:
    job = scheduler.submit(spec(job_id, gpus, submit=now, model=model), now)
    scheduler.decide(now)
    assert job.status is JobStatus.RUNNING
    return job


def test_half_cached_data_set_runs_at_half_speed_after_a_cold_first_epoch():
    scheduler, cache = setup(capacity_gb=50)
    job = run(scheduler, "x", 1, "a", 0)
    # silod asks for 100 x (1 - 0.25) = 75 GB to reach full speed; 50 GB fit: hit ratio 0.5,
    # speed min(1, 0.1 / (0.4 x 0.5)) = 0.5. The first epoch (100 GB at 0.4 GB/s = 250 ideal s)
    # finds an empty cache and runs at 0.25: it takes 250 / 0.25 = 1000 s instead of 500 s, a
    # 500 s stall. The 1000 s of work then take 500 + 1000 / 0.5 = 2500 s.
    assert cache.nodes[0].gb("a") == pytest.approx(50)
    assert job.speed == pytest.approx(0.5)
    assert job.stall_until == pytest.approx(500)
    assert job.remaining_wall_s(0) == pytest.approx(2500)
    # A second job on the warm node: same speed, no stall (GPU 1 of node 0 is the best fit).
    second = run(scheduler, "y", 1, "a", 10)
    assert scheduler.cluster.nodes_of(second.placement) == {0}
    assert second.speed == pytest.approx(0.5) and second.stall_until == pytest.approx(10)
    assert cache.speed(READS["a"], second.placement, 1.0) == pytest.approx(0.5)


def test_lru_serves_fewer_reads_than_its_cached_fraction():
    scheduler, _ = setup(capacity_gb=50, policy="lru")
    job = run(scheduler, "x", 1, "a", 0)
    # LRU caches what fits (50 GB) but, under shuffled epochs, hits only
    # 0.5 + 0.5 ln 0.5 = 0.15343 of the reads: speed 0.1 / (0.4 x 0.84657) = 0.29531.
    assert job.speed == pytest.approx(0.1 / (0.4 * (1 - (0.5 + 0.5 * math.log(0.5)))))
    assert job.speed == pytest.approx(0.29531, abs=1e-5)


def test_lru_hit_ratio_formula_matches_a_simulated_lru_cache():
    # An LRU cache of 200 of 400 items read in a fresh random order each epoch (epochs 3 to 11
    # counted): the formula gives 0.5 + 0.5 ln 0.5 = 0.153; the counted ratio is within 0.03.
    rng = np.random.default_rng(0)
    items, capacity = 400, 200
    cache: OrderedDict[int, None] = OrderedDict()
    hits = reads_counted = 0
    for epoch in range(12):
        for item in rng.permutation(items):
            hit = item in cache
            if hit:
                cache.move_to_end(item)
            else:
                cache[item] = None
                if len(cache) > capacity:
                    cache.popitem(last=False)
            if epoch >= 3:
                hits += hit
                reads_counted += 1
    assert hits / reads_counted == pytest.approx(lru_hit_ratio(0.5), abs=0.03)
    assert lru_hit_ratio(0.0) == 0.0 and lru_hit_ratio(1.0) == 1.0


def test_a_data_set_bigger_than_the_cache_is_cached_in_part():
    # 300 GB on a 100 GB cache. silod keeps a fixed third: hit 1/3, speed 0.1 / (0.4 x 2/3) =
    # 0.375. LRU keeps 100 GB too but hits 1/3 + 2/3 ln(2/3) = 0.06302: speed 0.26681.
    silod, silod_cache = setup(capacity_gb=100)
    assert run(silod, "x", 1, "big", 0).speed == pytest.approx(0.375)
    assert silod_cache.nodes[0].gb("big") == pytest.approx(100)
    lru, _ = setup(capacity_gb=100, policy="lru")
    assert run(lru, "x", 1, "big", 0).speed == pytest.approx(0.26681, abs=1e-5)


def test_a_cache_hit_changes_the_placement():
    # Node 0 gets a 2-GPU job without data (best fit; ties go to the lower node), then a 4-GPU
    # job reading "a" can only go to node 1 and leaves it cached there when it ends. A 2-GPU job
    # reading "a": best fit (consolidate) takes node 0, which has exactly 2 free; cache-aware
    # takes node 1, where its data set is, although 4 GPUs are free there.
    chosen = {}
    for placement in ("consolidate", "cache-aware"):
        scheduler, cache = setup(capacity_gb=200, placement=placement)
        run(scheduler, "other", 2, "", 0)
        run(scheduler, "warm", 4, "a", 0)
        scheduler.finished("warm", 100)
        assert set(cache.holders("a")) == {1}
        job = run(scheduler, "x", 2, "a", 200)
        chosen[placement] = scheduler.cluster.nodes_of(job.placement)
        if placement == "cache-aware":
            assert job.speed == pytest.approx(1.0) and job.stall_until == pytest.approx(200)
        else:  # cold on node 0: 0.25 during a first epoch of 100 / (2 x 0.4) = 125 ideal s
            assert job.stall_until == pytest.approx(200 + 125 * (1 / 0.25 - 1))
    assert chosen == {"consolidate": {0}, "cache-aware": {1}}


def test_cache_aware_ties_go_to_the_tightest_node_then_the_lowest_index():
    scheduler, cache = setup(capacity_gb=200, placement="cache-aware", nodes=3)
    for node_job in ("w0", "w1", "w2"):  # each fills one node and caches "a" there
        run(scheduler, node_job, 4, "a", 0)
    for node_job in ("w0", "w1", "w2"):
        scheduler.finished(node_job, 50)
    run(scheduler, "filler", 3, "", 60)  # best fit: node 0, now 1 free
    assert run(scheduler, "x", 1, "a", 70).placement == (3,)  # node 0: the tightest that holds a
    assert scheduler.cluster.nodes_of(run(scheduler, "y", 2, "a", 80).placement) == {1}
    assert sorted(cache.holders("a")) == [0, 1, 2]


def test_cache_aware_multi_node_job_takes_the_caching_node_among_equally_free_ones():
    # 4 nodes of 4 GPUs, one rack, all free; node 2 caches "a". A 6-GPU job needs two nodes:
    # consolidate takes node 0 (4) and the tightest for the remaining 2, node 1; cache-aware
    # takes node 2 first (equally free, caches a), then node 0 for the remaining 2.
    chosen = {}
    for placement in ("consolidate", "cache-aware"):
        scheduler, _ = setup(capacity_gb=200, placement=placement, nodes=4)
        for filler in ("f0", "f1"):
            run(scheduler, filler, 4, "", 0)  # nodes 0 and 1
        run(scheduler, "warm", 4, "a", 0)  # node 2
        for done in ("f0", "f1", "warm"):
            scheduler.finished(done, 10)
        job = run(scheduler, "x", 6, "a", 20)
        chosen[placement] = scheduler.cluster.nodes_of(job.placement)
    assert chosen == {"consolidate": {0, 1}, "cache-aware": {0, 2}}


def test_cache_aware_keeps_best_fit_for_jobs_storage_alone_keeps_at_full_speed():
    scheduler, _ = setup(capacity_gb=200, placement="cache-aware")
    run(scheduler, "other", 2, "", 0)
    run(scheduler, "warm", 4, "light", 0)
    scheduler.finished("warm", 100)
    # 0.05 GB/s per GPU is below the 0.1 GB/s share: the cache brings nothing, best fit rules.
    assert scheduler.cluster.nodes_of(run(scheduler, "x", 2, "light", 200).placement) == {0}


def test_greedy_allocation_gives_space_to_the_larger_gain_per_gb_first():
    # 100 GB for two 80 GB requests: "b" gains 0.05 GPU-speed per GB, "a" 0.02. b gets its 80 GB,
    # a the 20 GB left, whatever the order the requests come in.
    wants = [Want("a", 80, (-0.02,)), Want("b", 80, (-0.05,))]
    assert greedy_allocation(100, wants) == {"b": 80, "a": 20}
    assert greedy_allocation(100, wants[::-1]) == {"b": 80, "a": 20}
    assert greedy_allocation(0, wants) == {"a": 0, "b": 0}
    # Equal ranks: the data set name breaks the tie.
    assert greedy_allocation(50, [Want("z", 40, (0.0,)), Want("y", 40, (0.0,))]) == {
        "y": 40,
        "z": 10,
    }


def test_silod_evicts_idle_data_only_for_the_part_a_job_gains_from():
    # One node; its 100 GB cache holds "b" (80 GB), idle. A job reading "a" needs 75 GB for full speed (a
    # gain of 0.75 GPU-speed, 0.01 per GB); the other 25 GB of "a" gain nothing. silod: a gets
    # 75 GB (evicting 55 GB of b), b keeps 25 GB, the remainder of a gets nothing; speed
    # 0.1 / (0.4 x 0.25) = 1. LRU caches all of a (100 GB) and evicts b.
    for policy, expected in (("silod", {"a": 75, "b": 25}), ("lru", {"a": 100})):
        scheduler, cache = setup(capacity_gb=100, policy=policy, nodes=1)
        run(scheduler, "warm", 4, "b", 0)
        scheduler.finished("warm", 10)
        job = run(scheduler, "x", 1, "a", 20)
        held = {d: h.gb for d, h in cache.nodes[0].held.items()}
        assert held == pytest.approx(expected)
        assert job.speed == pytest.approx(1.0)


def test_silod_does_not_evict_for_a_job_that_does_not_gain():
    # "light" is read at 0.05 GB/s per GPU, under the 0.1 share: gain 0. With 80 GB of idle "b"
    # in a 100 GB cache, silod gives light only the 20 GB free; LRU evicts b for it.
    for policy, expected in (("silod", {"b": 80, "light": 20}), ("lru", {"light": 100})):
        scheduler, cache = setup(capacity_gb=100, policy=policy, nodes=1)
        run(scheduler, "warm", 4, "b", 0)
        scheduler.finished("warm", 10)
        assert run(scheduler, "x", 1, "light", 20).speed == pytest.approx(1.0)
        assert {d: h.gb for d, h in cache.nodes[0].held.items()} == pytest.approx(expected)


def test_a_running_jobs_data_is_pinned_until_it_stops():
    # One node, 100 GB of cache. x reads "a": it needs 75 GB (gain) and, the cache being empty,
    # also gets the other 25 GB (gain 0). y reads "b" (80 GB, needs 60) on the same node while
    # x runs: x's 75 GB are pinned, so y takes the 25 GB x does not need and nothing more: hit
    # 25/80, speed 0.1 / (0.4 x 55/80) = 0.36364; x stays at full speed.
    scheduler, cache = setup(capacity_gb=100, nodes=1)
    x = run(scheduler, "x", 1, "a", 0)
    assert cache.nodes[0].gb("a") == pytest.approx(100)
    y = run(scheduler, "y", 1, "b", 0)
    assert y.speed == pytest.approx(0.1 / (0.4 * 55 / 80))
    assert x.speed == pytest.approx(1.0) and cache.nodes[0].gb("a") == pytest.approx(75)
    # Once both ended, z reading "b" may evict a's idle data: it gets the 60 GB it needs (full
    # speed); a keeps the other 40 GB, as idle data ranks before the part of b z does not need.
    scheduler.finished("y", 50)
    scheduler.finished("x", 100)
    z = run(scheduler, "z", 1, "b", 200)
    assert z.speed == pytest.approx(1.0)
    held = {d: h.gb for d, h in cache.nodes[0].held.items()}
    assert held == pytest.approx({"a": 40, "b": 60})


def test_lru_pins_all_of_a_running_jobs_data():
    # The same start of x and y under lru: x caches all of a (100 GB), all pinned; y gets no
    # cache and runs from storage at 0.25.
    scheduler, cache = setup(capacity_gb=100, policy="lru", nodes=1)
    run(scheduler, "x", 1, "a", 0)
    assert run(scheduler, "y", 1, "b", 0).speed == pytest.approx(0.25)
    assert set(cache.nodes[0].held) == {"a"}


def test_a_gang_runs_at_the_pace_of_its_coldest_node():
    # Node 0 holds all of "a"; a 6-GPU job takes node 0 (4) and node 1 (2). On node 1 it gets
    # the 75 GB it needs (and the rest: the cache is empty), so its speed is 1, but its first
    # epoch (100 / (6 x 0.4) = 41.7 ideal s) runs at node 1's cold 0.25: stall 41.7 x 3 = 125 s.
    scheduler, cache = setup(capacity_gb=100)
    run(scheduler, "warm", 4, "a", 0)
    scheduler.finished("warm", 10)
    job = run(scheduler, "x", 6, "a", 20)
    assert job.speed == pytest.approx(1.0)
    assert job.stall_until == pytest.approx(20 + 100 / 2.4 * 3)
    summary = cache.summary([job])
    assert summary["first_epoch_stall_gpu_h"] == pytest.approx(6 * 125 / 3600)


def test_job_larger_than_the_cluster_is_not_placed():
    scheduler, _ = setup(capacity_gb=100, placement="cache-aware")
    result = scheduler.placement.place(scheduler.cluster, Job(spec=spec("j", 9, model="a")), 0)
    assert isinstance(result, NotPlaced) and "9 free GPUs" in result.reason


def test_no_cache_configured_is_the_old_behaviour():
    # The same jobs with no start hook, and with a cache whose jobs read nothing: identical.
    jobs = [spec(f"j{i}", 1 + i % 4, submit=10.0 * i, duration=500.0 + 37 * i) for i in range(12)]

    def finishes(with_cache: bool) -> list[float | None]:
        cluster = Cluster.shorthand(2, 4)
        hook = None
        if with_cache:
            hook = DataCache(
                cluster, capacity_gb_per_node=10, storage_gb_s_per_node=1, reads=lambda s: None
            ).on_start
        scheduler = Scheduler(
            cluster, make_policy("las"), make_placement("relax"), restore_s=30, on_start=hook
        )
        result = Simulation(jobs, scheduler).run()
        return [job.finished_at for job in result.jobs]

    assert finishes(False) == finishes(True)
    # cache-aware without a cache places as consolidate does.
    cluster = Cluster.shorthand(2, 4)
    cluster.allocate([0, 1])
    job = Job(spec=spec("j", 2, model="a"))
    assert make_placement("cache-aware").place(cluster, job, 0) == Placed((2, 3))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"capacity_gb_per_node": -1.0}, "cache capacity must be >= 0 GB"),
        ({"storage_gb_s_per_node": 0.0}, "storage bandwidth must be > 0"),
        ({"policy": "fifo"}, "unknown cache policy 'fifo'; choose one of silod, lru"),
    ],
)
def test_bad_cache_settings_are_refused(options, message):
    settings = {"capacity_gb_per_node": 1.0, "storage_gb_s_per_node": 1.0} | options
    with pytest.raises(CacheError, match=message):
        DataCache(Cluster.shorthand(1, 1), reads=reads, **settings)
