"""GPU-sharing placement and FGD's fragmentation measure, on hand-worked nodes."""

from __future__ import annotations

import pytest

from corral.core.sharing import (
    PLACERS,
    GpuNode,
    NodeState,
    SharingCluster,
    SharingError,
    SharingPlacement,
    TaskShape,
    Workload,
    cluster_fragmentation,
    fits,
    make_placer,
    task_fragment,
)

CPU_ONLY = TaskShape(cpu_milli=1000, memory_mib=1024, num_gpu=0, gpu_milli=0)


def share(milli: int, cpu: int = 1000, models: frozenset[str] | None = None) -> TaskShape:
    return TaskShape(cpu_milli=cpu, memory_mib=1024, num_gpu=1, gpu_milli=milli, gpu_models=models)


def whole(gpus: int, cpu: int = 1000, models: frozenset[str] | None = None) -> TaskShape:
    return TaskShape(
        cpu_milli=cpu, memory_mib=1024, num_gpu=gpus, gpu_milli=1000, gpu_models=models
    )


def node(name: str, gpus: int, model: str = "v100", cpu: int = 32000) -> GpuNode:
    return GpuNode(name, cpu_milli=cpu, memory_mib=65536, num_gpu=gpus, gpu_model=model)


def use(cluster: SharingCluster, index: int, gpu: int, milli: int) -> None:
    """Take `milli` of one GPU (and nothing else) to set up a partly used GPU."""
    shape = TaskShape(cpu_milli=0, memory_mib=0, num_gpu=1, gpu_milli=milli)
    cluster.allocate(shape, SharingPlacement(index, (gpu,)))


# -- fragmentation -------------------------------------------------------------------------------

# A node with 4 GPUs, free 200, 500, 1000 and 1000 milli (2,700 free), 8 CPUs free.
STATE = NodeState("v100", cpu_free=8000, memory_free=32768, gpu_free=(200, 500, 1000, 1000))
SHARE_300 = share(300)  # weight 3 in the workload below
TWO_GPUS = whole(2, cpu=4000)  # weight 1


def test_fragment_of_each_task_type_by_hand():
    # A 300-milli share fits (three GPUs have >= 300); only the 200 left on GPU 0 is too small.
    assert task_fragment(STATE, SHARE_300) == 200
    # Two whole GPUs fit (GPUs 2 and 3); the partly used GPUs (200 + 500) cannot serve it.
    assert task_fragment(STATE, TWO_GPUS) == 700
    # A task without GPUs can use none of them: all 2,700 free milli are fragments.
    assert task_fragment(STATE, CPU_ONLY) == 2700


def test_node_fragmentation_is_the_expectation_over_the_workload():
    workload = Workload([(SHARE_300, 3), (TWO_GPUS, 1)])
    # 3/4 x 200 + 1/4 x 700 = 150 + 175 = 325 milli-GPU; kept exactly as 4 x 325 = 1300.
    assert workload.weighted_fragment(STATE) == 1300
    assert workload.fragmentation(STATE) == pytest.approx(325.0)
    # With 3 CPUs free the two-GPU type (4 CPUs) cannot run at all: all 2,700 free count for it.
    # 3/4 x 200 + 1/4 x 2700 = 150 + 675 = 825.
    short_of_cpu = STATE._replace(cpu_free=3000)
    assert workload.fragmentation(short_of_cpu) == pytest.approx(825.0)


def test_a_gpu_model_the_task_refuses_makes_every_free_gpu_a_fragment():
    t4_only = share(300, models=frozenset({"t4"}))
    assert not fits(STATE, t4_only)
    assert task_fragment(STATE, t4_only) == 2700
    assert task_fragment(STATE._replace(gpu_model="t4"), t4_only) == 200


def test_a_full_node_has_no_fragments_and_cluster_fragmentation_sums_nodes():
    full = NodeState("v100", 0, 0, (0, 0))
    workload = Workload([(SHARE_300, 1)])
    assert workload.fragmentation(full) == 0
    cluster = SharingCluster([node("a", 2), node("b", 2)])
    use(cluster, 0, 0, 800)  # node a: (200, 1000) -> 200 left is too small for 300: 200
    use(cluster, 1, 1, 600)  # node b: (1000, 400) -> 400 is enough for 300: 0
    assert cluster_fragmentation(cluster, workload) == pytest.approx(200.0)


def test_workload_keeps_the_most_popular_shapes_up_to_the_coverage():
    a, b, c = share(100), share(200), whole(1)
    shapes = [a] * 5 + [b] * 3 + [c] * 2
    # 5 + 3 = 8 of 10 tasks reach 80%: c is dropped, a and b keep weights 5 and 3.
    kept = Workload.from_shapes(shapes, coverage=0.8)
    assert dict(kept.types) == {a: 5, b: 3}
    assert kept.probability(a) == pytest.approx(5 / 8)
    assert kept.probability(c) == 0
    assert dict(Workload.from_shapes(shapes, coverage=0.5).types) == {a: 5}
    assert dict(Workload.from_shapes(shapes).types) == {a: 5, b: 3, c: 2}
    with pytest.raises(SharingError, match="coverage"):
        Workload.from_shapes(shapes, coverage=0)
    with pytest.raises(SharingError, match="no tasks"):
        Workload.from_shapes([])


# -- placement -----------------------------------------------------------------------------------


def test_fgd_avoids_a_leftover_that_best_fit_creates():
    # Two one-GPU nodes: x has 700 milli free, y a whole free GPU. A 300-milli task arrives and
    # the workload is all 500-milli shares.
    cluster = SharingCluster([node("x", 1), node("y", 1)])
    use(cluster, 0, 0, 300)
    workload = Workload([(share(500), 1)])
    task = share(300)
    # best-fit: x would keep 32,000 - 1,000 CPU and 400 GPU milli, y 700: x is tighter.
    assert make_placer("best-fit", workload).choose(cluster, task) == SharingPlacement(0, (0,))
    # fgd: on x the 400 left cannot hold a 500 share, fragmentation 0 -> 400 (+400);
    # on y the 700 left still can, 0 -> 0 (+0). FGD picks y.
    assert make_placer("fgd", workload).choose(cluster, task) == SharingPlacement(1, (0,))


def test_fgd_picks_the_gpu_within_a_node():
    # One node, GPUs free 1000 and 600; a 100-milli task; the workload is 500-milli shares.
    # On the 600 GPU: 500 left, still holds a 500 share: +0. On the 1000 GPU: 900 left: +0 too.
    # A tie between GPUs goes to the fuller one (GPU 1), which keeps the whole GPU free.
    cluster = SharingCluster([node("n", 2)])
    use(cluster, 0, 1, 400)
    fgd = make_placer("fgd", Workload([(share(500), 1)]))
    assert fgd.choose(cluster, share(100)) == SharingPlacement(0, (1,))
    # A 200-milli task: on GPU 1 it leaves 400 (a fragment: +400); on GPU 0 it leaves 800 (+0).
    assert fgd.choose(cluster, share(200)) == SharingPlacement(0, (0,))


@pytest.mark.parametrize("policy", sorted(PLACERS))
def test_a_task_that_fits_nowhere_is_not_placed(policy: str):
    cluster = SharingCluster([node("a", 2), node("b", 1)])
    use(cluster, 0, 0, 10)  # node a has one whole free GPU, node b one
    workload = Workload([(whole(1), 1)])
    placer = make_placer(policy, workload, seed=1)
    assert placer.choose(cluster, whole(2)) is None  # never two whole free GPUs on one node
    assert placer.choose(cluster, share(500, cpu=64000)) is None  # more CPU than any node
    assert make_placer(policy, workload).choose(SharingCluster([]), share(500)) is None


@pytest.mark.parametrize("policy", sorted(PLACERS))
def test_gpu_spec_is_honoured(policy: str):
    # Node 0 has T4s and would be preferred (lowest index, fuller); the task accepts V100s only.
    cluster = SharingCluster([node("t4", 2, "t4"), node("v16", 4, "v100m16")])
    use(cluster, 0, 0, 500)
    v100 = frozenset({"v100m16", "v100m32"})
    placer = make_placer(policy, Workload([(share(500), 1)]), seed=3)
    for _ in range(3):
        placed = placer.choose(cluster, share(500, models=v100))
        assert placed is not None and placed.node == 1
    only_t4s = SharingCluster([node("t4", 2, "t4")])
    assert placer.choose(only_t4s, share(500, models=v100)) is None
    with pytest.raises(SharingError, match="t4 GPUs"):
        only_t4s.allocate(share(500, models=v100), SharingPlacement(0, (0,)))


@pytest.mark.parametrize("policy", sorted(PLACERS))
def test_multi_gpu_tasks_need_whole_free_gpus(policy: str):
    # 4 GPUs, 10 milli taken on GPU 2: 3,990 milli free, but only 3 whole GPUs.
    cluster = SharingCluster([node("n", 4)])
    use(cluster, 0, 2, 10)
    placer = make_placer(policy, Workload([(whole(3), 1)]), seed=0)
    assert placer.choose(cluster, whole(4)) is None
    placed = placer.choose(cluster, whole(3))
    assert placed == SharingPlacement(0, (0, 1, 3))
    cluster.allocate(whole(3), placed)
    assert cluster.gpu_free[0] == [0, 0, 990, 0]
    with pytest.raises(SharingError, match="not completely free"):
        cluster.allocate(whole(1), SharingPlacement(0, (2,)))


def test_ties_go_to_the_lowest_node_index():
    cluster = SharingCluster([node("a", 2), node("b", 2), node("c", 2)])
    for policy in ("fgd", "best-fit", "packing"):
        placer = make_placer(policy, Workload([(share(500), 1)]))
        assert placer.choose(cluster, share(500)) == SharingPlacement(0, (0,))


def test_packing_prefers_shared_gpus_then_fuller_nodes_then_idle_nodes():
    cluster = SharingCluster([node("idle", 2), node("shared", 2), node("busy", 2)])
    use(cluster, 1, 0, 400)  # shared: (600, 1000), free 1,600
    use(cluster, 2, 0, 1000)  # busy:   (0, 1000), free 1,000
    packing = make_placer("packing", Workload([(share(500), 1)]))
    # A 500 share fits on the shared GPU with 600 free: tier 1, GPU 0 of node 1.
    assert packing.choose(cluster, share(500)) == SharingPlacement(1, (0,))
    # A 700 share fits on no shared GPU: a free GPU of a node in use, the fuller (busy: 1,000).
    assert packing.choose(cluster, share(700)) == SharingPlacement(2, (1,))
    # So does a whole GPU; two whole GPUs fit only on the idle node.
    assert packing.choose(cluster, whole(1)) == SharingPlacement(2, (1,))
    assert packing.choose(cluster, whole(2)) == SharingPlacement(0, (0, 1))
    # Without GPUs: plain packing takes the first node; packing-cpu the node with least free GPU.
    assert packing.choose(cluster, CPU_ONLY) == SharingPlacement(0, ())
    packing_cpu = make_placer("packing-cpu", Workload([(share(500), 1)]))
    assert packing_cpu.choose(cluster, CPU_ONLY) == SharingPlacement(2, ())


def test_best_fit_weighs_cpu_and_gpu_left_by_the_largest_node():
    # Largest node: 32 CPUs, 2 GPUs. a: 2 GPUs, 32 CPUs; b: 1 GPU, 8 CPUs; whole-GPU task, 1 CPU.
    # a left: 0.5 x 31/32 + 0.5 x 1000/2000 = 0.734; b: 0.5 x 7/32 + 0.5 x 0 = 0.109 -> b.
    cluster = SharingCluster([node("a", 2), node("b", 1, cpu=8000)])
    assert make_placer("best-fit", Workload([(whole(1), 1)])).choose(
        cluster, whole(1)
    ) == SharingPlacement(1, (0,))


def test_random_fit_is_seeded_and_picks_only_feasible_nodes():
    nodes = [node(f"n{i}", 1) for i in range(6)]

    def draws(seed: int) -> list[int]:
        cluster = SharingCluster(nodes)
        placer = make_placer("random-fit", Workload([(share(100), 1)]), seed=seed)
        picks = []
        for _ in range(12):
            placed = placer.choose(cluster, share(500))
            assert placed is not None
            cluster.allocate(share(500), placed)
            picks.append(placed.node)
        return picks

    first = draws(7)
    assert first == draws(7)
    # 6 GPUs of 1000 hold exactly 12 tasks of 500: every node ends up used twice.
    assert sorted(first) == sorted(list(range(6)) * 2)
    assert first != draws(8)


# -- the cluster ---------------------------------------------------------------------------------


def test_identical_nodes_share_a_group_until_one_changes_and_release_undoes_allocate():
    cluster = SharingCluster([node("a", 2), node("b", 2)])
    assert [g.nodes for g in cluster.groups.values()] == [[0, 1]]
    placed = SharingPlacement(1, (0,))
    cluster.allocate(share(250), placed)
    assert sorted(g.nodes for g in cluster.groups.values()) == [[0], [1]]
    assert cluster.allocated_gpu_milli == 250
    assert cluster.state(1) == NodeState("v100", 31000, 64512, (750, 1000))
    cluster.release(share(250), placed)
    assert [g.nodes for g in cluster.groups.values()] == [[0, 1]]
    assert cluster.allocated_gpu_milli == 0


def test_over_allocation_and_bad_placements_are_refused():
    cluster = SharingCluster([node("a", 1, cpu=2000)])
    with pytest.raises(SharingError, match="CPU or memory"):
        cluster.allocate(share(100, cpu=3000), SharingPlacement(0, (0,)))
    with pytest.raises(SharingError, match="no GPU 5"):
        cluster.allocate(share(100), SharingPlacement(0, (5,)))
    with pytest.raises(SharingError, match="distinct GPUs"):
        cluster.allocate(share(100), SharingPlacement(0, ()))
    cluster.allocate(share(600), SharingPlacement(0, (0,)))
    with pytest.raises(SharingError, match="too little free"):
        cluster.allocate(share(600), SharingPlacement(0, (0,)))
    with pytest.raises(SharingError, match="duplicate"):
        SharingCluster([node("a", 1), node("a", 2)])


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"num_gpu": 0, "gpu_milli": 100}, "gpu_milli"),
        ({"num_gpu": 1, "gpu_milli": 0}, "gpu_milli"),
        ({"num_gpu": 1, "gpu_milli": 1500}, "gpu_milli"),
        ({"num_gpu": 2, "gpu_milli": 500}, "gpu_milli"),
        ({"num_gpu": -1, "gpu_milli": 0}, "num_gpu"),
        ({"num_gpu": 1, "gpu_milli": 100, "gpu_models": frozenset()}, "gpu_models"),
    ],
)
def test_invalid_task_shapes_are_refused(kwargs: dict, field: str):
    with pytest.raises(SharingError, match=field):
        TaskShape(cpu_milli=0, memory_mib=0, **kwargs)


def test_unknown_policy_is_refused():
    with pytest.raises(SharingError, match="unknown sharing placement 'first-fit'"):
        make_placer("first-fit", Workload([(CPU_ONLY, 1)]))
