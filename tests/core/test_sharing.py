"""Fractional GPUs in the one cluster model: FGD's fragmentation measure and the sharing
placements on hand-worked nodes, and shares through the scheduler (start, release, preemption)."""

from __future__ import annotations

import pytest

from corral.core.actions import Preempt, Start
from corral.core.cluster import Cluster, ClusterError, NodeDef
from corral.core.fragmentation import (
    NodeState,
    TaskShape,
    Workload,
    WorkloadError,
    cluster_fragmentation,
    fits,
    state_of,
    task_fragment,
)
from corral.core.framework import build_scheduler, config_from_mapping
from corral.core.job import Job, JobSpec, JobStatus
from corral.core.placement import PLACEMENTS, make_placement
from corral.core.placement.base import NotPlaced, Placed, Placement
from corral.core.placement.sharing import Fgd, NodeIndex, RandomFit
from corral.core.plugin import PluginError, Services
from corral.core.policy import make_policy
from corral.core.refusal import JobRefused
from corral.core.scheduler import Scheduler

SHARING = sorted(name for name, cls in PLACEMENTS.items() if cls.shares)


def spec(
    milli: int = 1000,
    gpus: int = 1,
    cpu: int = 1000,
    models: frozenset[str] | None = None,
    name: str = "j",
    **more: object,
) -> JobSpec:
    return JobSpec(
        id=name,
        submit_time=0.0,
        gpus=gpus,
        gpu_milli=milli,
        cpu_milli=cpu,
        memory_mib=1024,
        gpu_types=models,
        **more,  # type: ignore[arg-type]
    )


def share(milli: int, cpu: int = 1000, models: frozenset[str] | None = None) -> JobSpec:
    return spec(milli, 1, cpu, models)


def whole(gpus: int, cpu: int = 1000, models: frozenset[str] | None = None) -> JobSpec:
    return spec(1000, gpus, cpu, models)


CPU_ONLY = spec(gpus=0)


def node(name: str, gpus: int, model: str = "v100", cpu: int = 32000) -> NodeDef:
    return NodeDef(name, gpus, model, cpu_milli=cpu, memory_mib=65536)


def cluster_of(*nodes: NodeDef) -> Cluster:
    return Cluster.from_nodes(nodes)


def use(cluster: Cluster, index: int, gpu: int, milli: int) -> None:
    """Take `milli` of one GPU (and nothing else) to set up a partly used GPU."""
    cluster.claim((cluster.node_gpus[index][gpu],), milli)


def placer(name: str, workload: Workload, seed: int = 0) -> Placement:
    if name == "fgd":
        return Fgd(workload)
    if name == "random-fit":
        return RandomFit(seed)
    return make_placement(name)


def where(
    cluster: Cluster, placement: Placement, job: JobSpec
) -> tuple[int, tuple[int, ...]] | None:
    """(node, GPU indices on that node), or None when not placed."""
    result = placement.place(cluster, Job(spec=job), 0.0)
    if isinstance(result, NotPlaced):
        return None
    ids = cluster.node_gpus[result.node]
    assert result.milli == (job.gpu_milli if job.gpus else 1000)
    return result.node, tuple(ids.index(g) for g in result.gpus)


def shape(job: JobSpec) -> TaskShape:
    return TaskShape.of(job)


# -- fragmentation -------------------------------------------------------------------------------

# A node with 4 GPUs, free 200, 500, 1000 and 1000 milli (2,700 free), 8 CPUs free.
STATE = NodeState("v100", cpu_free=8000, memory_free=32768, gpu_free=(200, 500, 1000, 1000))
SHARE_300 = shape(share(300))  # weight 3 in the workload below
TWO_GPUS = shape(whole(2, cpu=4000))  # weight 1


def test_fragment_of_each_task_type_by_hand():
    # A 300-milli share fits (three GPUs have >= 300); only the 200 left on GPU 0 is too small.
    assert task_fragment(STATE, SHARE_300) == 200
    # Two whole GPUs fit (GPUs 2 and 3); the partly used GPUs (200 + 500) cannot serve it.
    assert task_fragment(STATE, TWO_GPUS) == 700
    # A task without GPUs can use none of them: all 2,700 free milli are fragments.
    assert task_fragment(STATE, shape(CPU_ONLY)) == 2700


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
    t4_only = shape(share(300, models=frozenset({"t4"})))
    assert not fits(STATE, t4_only)
    assert task_fragment(STATE, t4_only) == 2700
    assert task_fragment(STATE._replace(gpu_model="t4"), t4_only) == 200


def test_a_full_node_has_no_fragments_and_cluster_fragmentation_sums_nodes():
    full = NodeState("v100", 0, 0, (0, 0))
    workload = Workload([(SHARE_300, 1)])
    assert workload.fragmentation(full) == 0
    cluster = cluster_of(node("a", 2), node("b", 2))
    use(cluster, 0, 0, 800)  # node a: (200, 1000) -> 200 left is too small for 300: 200
    use(cluster, 1, 1, 600)  # node b: (1000, 400) -> 400 is enough for 300: 0
    assert cluster_fragmentation(cluster, workload) == pytest.approx(200.0)


def test_the_state_of_a_node_reads_the_cluster():
    cluster = cluster_of(node("a", 2), NodeDef("b", 2))  # b declares no CPU or memory
    use(cluster, 0, 1, 250)
    cluster.claim((), node=0, cpu_milli=1000, memory_mib=512)
    assert state_of(cluster, 0) == NodeState("v100", 31000, 65024, (750, 1000))
    assert state_of(cluster, 1) == NodeState("v100", float("inf"), float("inf"), (1000, 1000))


def test_workload_keeps_the_most_popular_shapes_up_to_the_coverage():
    a, b, c = shape(share(100)), shape(share(200)), shape(whole(1))
    shapes = [a] * 5 + [b] * 3 + [c] * 2
    # 5 + 3 = 8 of 10 tasks reach 80%: c is dropped, a and b keep weights 5 and 3.
    kept = Workload.from_shapes(shapes, coverage=0.8)
    assert dict(kept.types) == {a: 5, b: 3}
    assert kept.probability(a) == pytest.approx(5 / 8)
    assert kept.probability(c) == 0
    assert dict(Workload.from_shapes(shapes, coverage=0.5).types) == {a: 5}
    assert dict(Workload.from_shapes(shapes).types) == {a: 5, b: 3, c: 2}
    assert dict(Workload.from_shapes(shapes).covering(0.8).types) == {a: 5, b: 3}
    with pytest.raises(WorkloadError, match="coverage"):
        Workload.from_shapes(shapes, coverage=0)
    with pytest.raises(WorkloadError, match="no tasks"):
        Workload.from_shapes([])


def test_a_job_s_shape_is_its_request():
    assert shape(share(300)) == TaskShape(1000, 1024, 1, 300)
    assert shape(CPU_ONLY) == TaskShape(1000, 1024, 0, 0)  # no GPU: no milli, no models
    assert shape(whole(2, models=frozenset({"t4"}))).gpu_models == frozenset({"t4"})


# -- placement -----------------------------------------------------------------------------------


def test_fgd_avoids_a_leftover_that_best_fit_creates():
    # Two one-GPU nodes: x has 700 milli free, y a whole free GPU. A 300-milli task arrives and
    # the workload is all 500-milli shares.
    cluster = cluster_of(node("x", 1), node("y", 1))
    use(cluster, 0, 0, 300)
    workload = Workload([(shape(share(500)), 1)])
    task = share(300)
    # best-fit: x would keep 32,000 - 1,000 CPU and 400 GPU milli, y 700: x is tighter.
    assert where(cluster, placer("best-fit", workload), task) == (0, (0,))
    # fgd: on x the 400 left cannot hold a 500 share, fragmentation 0 -> 400 (+400);
    # on y the 700 left still can, 0 -> 0 (+0). FGD picks y.
    assert where(cluster, placer("fgd", workload), task) == (1, (0,))


def test_fgd_picks_the_gpu_within_a_node():
    # One node, GPUs free 1000 and 600; a 100-milli task; the workload is 500-milli shares.
    # On the 600 GPU: 500 left, still holds a 500 share: +0. On the 1000 GPU: 900 left: +0 too.
    # A tie between GPUs goes to the fuller one (GPU 1), which keeps the whole GPU free.
    cluster = cluster_of(node("n", 2))
    use(cluster, 0, 1, 400)
    fgd = placer("fgd", Workload([(shape(share(500)), 1)]))
    assert where(cluster, fgd, share(100)) == (0, (1,))
    # A 200-milli task: on GPU 1 it leaves 400 (a fragment: +400); on GPU 0 it leaves 800 (+0).
    assert where(cluster, fgd, share(200)) == (0, (0,))


@pytest.mark.parametrize("policy", SHARING)
def test_a_task_that_fits_nowhere_is_not_placed(policy: str):
    cluster = cluster_of(node("a", 2), node("b", 1))
    use(cluster, 0, 0, 10)  # node a has one whole free GPU, node b one
    workload = Workload([(shape(whole(1)), 1)])
    chooser = placer(policy, workload, seed=1)
    assert where(cluster, chooser, whole(2)) is None  # never two whole free GPUs on one node
    assert where(cluster, chooser, share(500, cpu=64000)) is None  # more CPU than any node


@pytest.mark.parametrize("policy", SHARING)
def test_gpu_spec_is_honoured(policy: str):
    # Node 0 has T4s and would be preferred (lowest index, fuller); the task accepts V100s only.
    cluster = cluster_of(node("t4", 2, "t4"), node("v16", 4, "v100m16"))
    use(cluster, 0, 0, 500)
    v100 = frozenset({"v100m16", "v100m32"})
    chooser = placer(policy, Workload([(shape(share(500)), 1)]), seed=3)
    for _ in range(3):
        placed = where(cluster, chooser, share(500, models=v100))
        assert placed is not None and placed[0] == 1
    only_t4s = cluster_of(node("t4", 2, "t4"))
    assert where(only_t4s, chooser, share(500, models=v100)) is None


@pytest.mark.parametrize("policy", SHARING)
def test_multi_gpu_tasks_need_whole_free_gpus(policy: str):
    # 4 GPUs, 10 milli taken on GPU 2: 3,990 milli free, but only 3 whole GPUs.
    cluster = cluster_of(node("n", 4))
    use(cluster, 0, 2, 10)
    chooser = placer(policy, Workload([(shape(whole(3)), 1)]), seed=0)
    assert where(cluster, chooser, whole(4)) is None
    assert where(cluster, chooser, whole(3)) == (0, (0, 1, 3))
    cluster.claim((0, 1, 3), 1000, 0, 1000, 1024)
    assert [cluster.gpu_milli_free(g) for g in range(4)] == [0, 0, 990, 0]
    with pytest.raises(ClusterError, match="already allocated"):
        cluster.claim((2,))  # a GPU partly used by a share is not free for a whole-GPU job


def test_ties_go_to_the_lowest_node_index():
    cluster = cluster_of(node("a", 2), node("b", 2), node("c", 2))
    for policy in ("fgd", "best-fit", "gpu-packing"):
        chooser = placer(policy, Workload([(shape(share(500)), 1)]))
        assert where(cluster, chooser, share(500)) == (0, (0,))


def test_packing_prefers_shared_gpus_then_fuller_nodes_then_idle_nodes():
    cluster = cluster_of(node("idle", 2), node("shared", 2), node("busy", 2))
    use(cluster, 1, 0, 400)  # shared: (600, 1000), free 1,600
    use(cluster, 2, 0, 1000)  # busy:   (0, 1000), free 1,000
    packing = placer("gpu-packing", Workload([(shape(share(500)), 1)]))
    # A 500 share fits on the shared GPU with 600 free: tier 1, GPU 0 of node 1.
    assert where(cluster, packing, share(500)) == (1, (0,))
    # A 700 share fits on no shared GPU: a free GPU of a node in use, the fuller (busy: 1,000).
    assert where(cluster, packing, share(700)) == (2, (1,))
    # So does a whole GPU; two whole GPUs fit only on the idle node.
    assert where(cluster, packing, whole(1)) == (2, (1,))
    assert where(cluster, packing, whole(2)) == (0, (0, 1))
    # Without GPUs: plain packing takes the first node; packing-cpu the node with least free GPU.
    assert where(cluster, packing, CPU_ONLY) == (0, ())
    assert where(
        cluster, placer("gpu-packing-cpu", Workload([(shape(share(500)), 1)])), CPU_ONLY
    ) == (2, ())


def test_best_fit_weighs_cpu_and_gpu_left_by_the_largest_node():
    # Largest node: 32 CPUs, 2 GPUs. a: 2 GPUs, 32 CPUs; b: 1 GPU, 8 CPUs; whole-GPU task, 1 CPU.
    # a left: 0.5 x 31/32 + 0.5 x 1000/2000 = 0.734; b: 0.5 x 7/32 + 0.5 x 0 = 0.109 -> b.
    cluster = cluster_of(node("a", 2), node("b", 1, cpu=8000))
    assert where(cluster, placer("best-fit", Workload([(shape(share(500)), 1)])), whole(1)) == (
        1,
        (0,),
    )


def test_random_fit_is_seeded_and_picks_only_feasible_nodes():
    nodes = [node(f"n{i}", 1) for i in range(6)]

    def draws(seed: int) -> list[int]:
        cluster = cluster_of(*nodes)
        chooser = placer("random-fit", Workload([(shape(share(500)), 1)]), seed=seed)
        picks = []
        for _ in range(12):
            result = chooser.place(cluster, Job(spec=share(500)), 0.0)
            assert isinstance(result, Placed)
            cluster.claim(result.gpus, 500, result.node, 1000, 1024)
            picks.append(result.node)
        return picks

    first = draws(7)
    assert first == draws(7)
    # 6 GPUs of 1000 hold exactly 12 tasks of 500: every node ends up used twice.
    assert sorted(first) == sorted(list(range(6)) * 2)
    assert first != draws(8)


def test_identical_nodes_share_a_group_until_one_changes_and_release_undoes_claim():
    cluster = cluster_of(node("a", 2), node("b", 2))
    index = NodeIndex(cluster)
    assert [g.nodes for g in index.groups.values()] == [[0, 1]]
    cluster.claim((2,), 250, 1, 1000, 1024)
    index.sync()
    assert sorted(g.nodes for g in index.groups.values()) == [[0], [1]]
    assert cluster.allocated_milli == 250
    assert state_of(cluster, 1) == NodeState("v100", 31000, 64512, (750, 1000))
    cluster.unclaim((2,), 250, 1, 1000, 1024)
    index.sync()
    assert [g.nodes for g in index.groups.values()] == [[0, 1]]
    assert cluster.allocated_milli == 0 and cluster.free_gpus == 4


def test_over_allocation_and_bad_claims_are_refused():
    cluster = cluster_of(node("a", 1, cpu=2000))
    with pytest.raises(ClusterError, match="milli-CPU free"):
        cluster.claim((0,), 100, 0, 3000, 0)
    with pytest.raises(ClusterError, match="on one GPU"):
        cluster.claim((), 100, 0, 1000, 0)
    cluster.claim((0,), 600)
    with pytest.raises(ClusterError, match="400 milli free"):
        cluster.claim((0,), 600)
    with pytest.raises(ClusterError, match="holds no share"):
        cluster.unclaim((0,), 700)  # only 600 are taken
    with pytest.raises(ClusterError, match="already allocated"):
        cluster.allocate([0])
    assert cluster.free_gpus == 0 and cluster.gpu_milli_free(0) == 400


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"gpus": 1, "gpu_milli": 0}, "gpu_milli must be 1..1000"),
        ({"gpus": 1, "gpu_milli": 1500}, "gpu_milli must be 1..1000"),
        ({"gpus": 2, "gpu_milli": 500}, "needs gpus 1"),
        ({"gpus": -1}, "gpus must be a non-negative integer"),
        ({"gpus": 0, "cpu_milli": 0, "memory_mib": 0}, "gpus must be a positive integer"),
        ({"gpus": 1, "cpu_milli": -5}, "cpu_milli must be a non-negative integer"),
    ],
)
def test_invalid_requests_are_refused_in_one_line(kwargs: dict, needle: str):
    fields: dict[str, object] = {"cpu_milli": 1000} | kwargs
    bad = JobSpec(id="bad", submit_time=0.0, **fields)  # type: ignore[arg-type]
    scheduler = sharing_scheduler(cluster_of(node("n", 2)))
    refusal = scheduler.refusal(bad)
    assert refusal is not None and needle in refusal and "\n" not in refusal


def test_unknown_placement_is_refused():
    with pytest.raises(ValueError, match="unknown placement 'first-fit'"):
        make_placement("first-fit")


# -- through the scheduler -----------------------------------------------------------------------


def sharing_scheduler(cluster: Cluster, policy: str = "fifo", **options: object) -> Scheduler:
    return Scheduler(
        cluster,
        make_policy(policy, **options),  # type: ignore[arg-type]
        Fgd(Workload([(shape(share(500)), 1)])),
    )


def test_two_shares_run_on_one_gpu_and_a_whole_gpu_job_waits_for_it():
    cluster = cluster_of(node("n", 1))
    scheduler = sharing_scheduler(cluster)
    scheduler.submit(spec(300, name="a"), 0.0)
    scheduler.submit(spec(500, name="b"), 0.0)
    scheduler.submit(spec(1000, name="whole"), 0.0)
    actions = scheduler.decide(0.0).actions
    # Both shares on GPU 0, each Start carrying its milli and node; the whole GPU job waits.
    assert actions == [
        Start("a", (0,), milli=300, node=0),
        Start("b", (0,), milli=500, node=0),
    ]
    assert cluster.gpu_milli_free(0) == 200 and cluster.free_gpus == 0
    assert cluster.cpu_used == [2000]
    assert scheduler.jobs["whole"].status is JobStatus.PENDING
    assert "no node has room" in scheduler.explain("whole", 0.0)
    scheduler.finished("a", 10.0)  # one share left: still not free for a whole GPU
    assert scheduler.decide(10.0).actions == []
    assert cluster.gpu_milli_free(0) == 500 and cluster.free_gpus == 0
    scheduler.finished("b", 20.0)
    assert cluster.free_gpus == 1 and cluster.cpu_used == [0]
    assert scheduler.decide(20.0).actions == [Start("whole", (0,), milli=1000, node=0)]


def test_a_job_without_gpus_runs_on_a_node_s_cpu():
    cluster = cluster_of(node("n", 1, cpu=1500))
    scheduler = sharing_scheduler(cluster)
    scheduler.submit(spec(gpus=0, name="cpu"), 0.0)
    scheduler.submit(spec(gpus=1, name="gpu"), 0.0)  # 1,000 CPU: only 500 left
    assert scheduler.decide(0.0).actions == [Start("cpu", (), node=0)]
    assert scheduler.jobs["cpu"].last_event == "started on node n (no GPU)"
    assert cluster.free_gpus == 1  # the GPU is free, but the CPU next to it is not
    scheduler.finished("cpu", 5.0)
    assert scheduler.decide(5.0).actions == [Start("gpu", (0,), node=0)]


def test_a_fractional_job_is_preempted_and_resumed():
    # LAS drops a job that attained 50 GPU-seconds below a new one: the whole-GPU job preempts
    # the share (the GPU must be wholly free for it), and the share resumes when it ends.
    cluster = cluster_of(node("n", 1))
    scheduler = sharing_scheduler(cluster, "las", thresholds_gpu_s=[50.0])
    scheduler.submit(spec(600, name="share", duration_s=500.0), 0.0)
    assert scheduler.decide(0.0).actions == [Start("share", (0,), milli=600, node=0)]
    scheduler.submit(spec(1000, name="whole", duration_s=100.0), 100.0)
    actions = scheduler.decide(100.0).actions
    assert actions == [
        Preempt("share", (0,), "whole"),
        Start("whole", (0,), milli=1000, node=0),
    ]
    share_job = scheduler.jobs["share"]
    assert share_job.status is JobStatus.PENDING and share_job.node == -1
    assert cluster.free_gpus == 0 and cluster.cpu_used == [1000]
    scheduler.finished("whole", 200.0)
    assert scheduler.decide(200.0).actions == [
        Start("share", (0,), milli=600, node=0, resumed=True)
    ]
    assert cluster.gpu_milli_free(0) == 400 and share_job.preemptions == 1


def test_a_share_needs_a_placement_that_places_shares():
    scheduler = Scheduler(cluster_of(node("n", 2)), make_policy("fifo"), make_placement("relax"))
    refusal = scheduler.refusal(share(500))
    assert refusal is not None and "placement relax gives whole GPUs only" in refusal
    with pytest.raises(JobRefused, match="gives whole GPUs only"):
        scheduler.submit(share(500), 0.0)
    assert scheduler.refusal(JobSpec(id="plain", submit_time=0.0, gpus=2)) is None


def test_a_job_no_node_could_hold_is_refused():
    scheduler = sharing_scheduler(cluster_of(node("a", 2), node("b", 2)))
    refusal = scheduler.refusal(whole(3))  # 4 GPUs in all, but never 3 on one node
    assert refusal is not None and "on one node" in refusal
    assert scheduler.refusal(share(500, cpu=40000)) is not None
    assert scheduler.refusal(share(500)) is None


def test_fgd_needs_a_workload_and_no_admission():
    cluster = cluster_of(node("n", 2))
    config = config_from_mapping({"policy": "fifo", "placement": "fgd"})
    with pytest.raises(PluginError, match="placement fgd: needs a target workload"):
        build_scheduler(config, Services(cluster))
    built = build_scheduler(config, Services(cluster, workload=Workload([(shape(share(5)), 1)])))
    assert built.placement.name == "fgd"
    quota = config_from_mapping({"policy": "fifo", "placement": "fgd", "admission": "quota"})
    with pytest.raises(PluginError, match="admission quota does not run with placement fgd"):
        build_scheduler(quota, Services(cluster, workload=Workload([(shape(share(5)), 1)])))


def test_fgd_retargeted_measures_against_the_new_workload():
    # A 400-milli share, a node with 500 free on its GPU and one with a free GPU. Against
    # 600-milli tasks the 500 left is useless already: filling it costs nothing (node 0).
    # Against 500-milli tasks it is still usable, and 100 left would not be (node 1).
    cluster = cluster_of(node("half", 1), node("free", 1))
    use(cluster, 0, 0, 500)
    fgd = Fgd(Workload([(shape(share(600)), 1)]))
    assert where(cluster, fgd, share(400)) == (0, (0,))
    fgd.retarget(Workload([(shape(share(500)), 3)]))
    assert where(cluster, fgd, share(400)) == (1, (0,))
    assert fgd.workload.types == ((shape(share(500)), 3),)
    covering = Fgd(Workload([(shape(share(500)), 3), (shape(share(600)), 1)]), coverage=0.5)
    covering.retarget(Workload([(shape(share(600)), 3), (shape(share(500)), 1)]))
    assert covering.workload.types == ((shape(share(600)), 3),)  # the coverage is kept


def test_random_fit_takes_the_run_s_seed():
    cluster = cluster_of(node("n", 2))
    config = config_from_mapping({"policy": "fifo", "placement": "random-fit"})
    built = build_scheduler(config, Services(cluster, seed=7))
    assert isinstance(built.placement, RandomFit)
    assert built.placement.rng.random() == RandomFit(7).rng.random()
