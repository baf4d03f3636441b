"""Placements for jobs that share GPUs: FGD and the baselines of its paper, on the one cluster.

After Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation
Gradient Descent", USENIX ATC'23 ([docs/fgd.md](../../../docs/fgd.md); the measure is
corral.core.fragmentation). Each places a job on one node: a share of one GPU (`gpu_milli` below
1000) on a GPU with that much free, whole GPUs on completely free ones, and the job's CPU and
memory on that node; a job without GPUs takes CPU and memory only.

- `fgd`: the node and GPU where the fragmentation F_n(M) of the target workload (`Services
  .workload`) grows the least (Sec. 4);
- `best-fit`: the node left with the least resources (0.5 x free CPU / the largest node's CPU +
  0.5 x free GPU / the largest node's GPUs, after placing), a share on the fullest GPU it fits;
- `random-fit`: a node drawn uniformly among those the job fits, random GPUs on it (seeded);
- `gpu-packing`: a share on an already shared GPU, else free GPUs of a node already in use (the
  fullest), else an idle node (the smallest); a job without GPUs on the first node it fits;
- `gpu-packing-cpu`: as gpu-packing, but a job without GPUs on the node with the fewest free GPU
  milli (then the least free CPU). Not in the paper: it isolates where CPU-only tasks go.

**Speed.** The placements evaluate one *state* (GPU type, free CPU, free memory, sorted free milli
per GPU) per group of identical nodes and remember each verdict per (group, task shape): a state
never changes, only a node moves to another group, so a change invalidates nothing but the touched
node's membership. The index of groups follows the cluster through `Cluster.watch` (the nodes
whose resources changed since the last placement). Ties go to the lowest node index.
"""

from __future__ import annotations

import bisect
import random
from typing import Any

from corral.core.cluster import MILLI, Cluster
from corral.core.fragmentation import NodeState, TaskShape, Workload, after, fits, state_of
from corral.core.job import Job, JobSpec
from corral.core.placement.base import NotPlaced, Placed, Placement
from corral.core.placement.sharing_options import FgdOptions, RandomFitOptions
from corral.core.plugin import Services, needs

# A verdict on one state for one task shape: (score, chosen free amount of the GPU that takes a
# share, or None), lower scores first; None when the shape does not fit.
Verdict = tuple[tuple[int, ...], int | None] | None


class _Group:
    """The nodes (ascending indices) that are in one state right now."""

    __slots__ = ("nodes", "state")

    def __init__(self, state: NodeState) -> None:
        self.state = state
        self.nodes: list[int] = []


class NodeIndex:
    """The cluster's nodes grouped by identical state, kept up to date through `Cluster.watch`.

    Group ids are never reused, so a verdict remembered for a group id stays true.
    """

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.groups: dict[int, _Group] = {}
        self._group_of_state: dict[NodeState, int] = {}
        self._group_of_node: list[int] = []
        self._next_group = 0
        #: The largest node's CPU (of those that declare it) and GPU milli (best-fit's scale).
        self.max_cpu_milli = max((c for c in cluster.cpu_capacity if c is not None), default=0)
        self.max_gpu_milli = max(node.total_gpus for node in cluster.nodes) * MILLI
        self._changed = cluster.watch()
        for node in range(len(cluster.nodes)):
            self._group_of_node.append(self._join(node, state_of(cluster, node)))
        self._changed.clear()

    def sync(self) -> None:
        """Move the nodes that changed since the last call to the groups of their new states."""
        changed = self._changed
        if not changed:
            return
        cluster = self.cluster
        for node in sorted(changed):
            self._leave(node)
            self._group_of_node[node] = self._join(node, state_of(cluster, node))
        changed.clear()

    def close(self) -> None:
        self.cluster.unwatch(self._changed)

    def _join(self, node: int, state: NodeState) -> int:
        group_id = self._group_of_state.get(state)
        if group_id is None:
            group_id = self._next_group
            self._next_group += 1
            self._group_of_state[state] = group_id
            self.groups[group_id] = _Group(state)
        bisect.insort(self.groups[group_id].nodes, node)
        return group_id

    def _leave(self, node: int) -> None:
        group_id = self._group_of_node[node]
        group = self.groups[group_id]
        group.nodes.remove(node)
        if not group.nodes:
            del self.groups[group_id]
            del self._group_of_state[group.state]


def _share_candidates(state: NodeState, shape: TaskShape) -> list[int]:
    """Distinct free amounts of the GPUs a share could go on, ascending."""
    start = bisect.bisect_left(state.gpu_free, shape.gpu_milli)
    return sorted(set(state.gpu_free[start:]))


class SharingPlacement(Placement):
    """Scores each group of identical nodes once per task shape and picks the lowest score."""

    name = "sharing"
    shares = True

    def __init__(self) -> None:
        self._index: NodeIndex | None = None
        self._memo: dict[TaskShape, dict[int, Verdict]] = {}
        self._calls = 0
        self._node_fit: dict[tuple[object, ...], bool] = {}

    # -- what the scheduler asks ------------------------------------------------------------

    def scope(self, cluster: Cluster, job: Job, now: float) -> str:
        return "node"

    def refusal(self, cluster: Cluster, spec: JobSpec) -> str | None:
        """A job no node could ever hold (empty), by its GPUs, types, CPU and memory."""
        key = (id(cluster), spec.gpus, spec.gpu_types, spec.cpu_milli, spec.memory_mib)
        fit = self._node_fit.get(key)
        if fit is None:
            cpu, memory = cluster.cpu_capacity, cluster.memory_capacity
            fit = self._node_fit[key] = any(
                (spec.gpus == 0 or spec.accepts(node.gpu_type))
                and node.total_gpus >= spec.gpus
                and (cpu[node.index] is None or spec.cpu_milli <= cpu[node.index])  # type: ignore[operator]
                and (memory[node.index] is None or spec.memory_mib <= memory[node.index])  # type: ignore[operator]
                for node in cluster.nodes
            )
        if fit:
            return None
        return f"asks for {spec.describe_request()} on one node, but no node could ever hold it"

    def place(self, cluster: Cluster, job: Job, now: float) -> Placed | NotPlaced:
        spec = job.spec
        shape = TaskShape.of(spec)
        index = self._sync(cluster)
        chosen = self.choose(index, shape)
        if chosen is None:
            return NotPlaced(f"no node has room for {spec.describe_request()}")
        node, gpus = chosen
        return Placed(gpus, milli=spec.gpu_milli if gpus else MILLI, node=node)

    # -- choosing ---------------------------------------------------------------------------

    def verdict(self, index: NodeIndex, state: NodeState, shape: TaskShape) -> Verdict:
        raise NotImplementedError

    def choose(self, index: NodeIndex, shape: TaskShape) -> tuple[int, tuple[int, ...]] | None:
        """The node and GPUs for a task of this shape, or None when it fits on no node."""
        memo = self._memo_for(index, shape)
        best: tuple[tuple[int, ...], int] | None = None
        best_choice: int | None = None
        for group_id, group in index.groups.items():
            if group_id in memo:
                verdict = memo[group_id]
            else:
                verdict = memo[group_id] = self.verdict(index, group.state, shape)
            if verdict is None:
                continue
            key = (verdict[0], group.nodes[0])
            if best is None or key < best:
                best, best_choice = key, verdict[1]
        if best is None:
            return None
        return best[1], gpus_on(index.cluster, best[1], shape, best_choice)

    def _sync(self, cluster: Cluster) -> NodeIndex:
        index = self._index
        if index is None or index.cluster is not cluster:
            if index is not None:
                index.close()
            index = self._index = NodeIndex(cluster)
            self._memo.clear()  # group ids are per index
        else:
            index.sync()
        return index

    def _memo_for(self, index: NodeIndex, shape: TaskShape) -> dict[int, Verdict]:
        self._calls += 1
        if self._calls % 2048 == 0:  # forget verdicts on states no node is in any more
            live = index.groups
            for memo in self._memo.values():
                for group_id in [g for g in memo if g not in live]:
                    del memo[group_id]
        return self._memo.setdefault(shape, {})


def gpus_on(
    cluster: Cluster, node: int, shape: TaskShape, gpu_free_value: int | None
) -> tuple[int, ...]:
    """Concrete GPUs for a verdict: a share goes on the first GPU of the node with exactly
    `gpu_free_value` free; whole GPUs are the first completely free ones."""
    if shape.num_gpu == 0:
        return ()
    ids = cluster.node_gpus[node]
    if shape.shares_gpu:
        if gpu_free_value is None:
            raise ValueError("a GPU share needs the free amount of its GPU")
        milli = cluster.gpu_milli_free
        return (next(g for g in ids if milli(g) == gpu_free_value),)
    free = cluster.gpu_free
    return tuple([g for g in ids if free[g]][: shape.num_gpu])


class Fgd(SharingPlacement):
    """Fragmentation Gradient Descent: the smallest growth of F_n(M) (Sec. 4). For a share each
    distinct free amount on the node is tried once; ties go to the fullest GPU."""

    name = "fgd"
    summary = "FGD: where the target workload's GPU fragmentation grows the least (shares too)"
    Options = FgdOptions

    def __init__(self, workload: Workload, coverage: float = 1.0) -> None:
        super().__init__()
        self.coverage = coverage
        self.workload = workload.covering(coverage)

    @classmethod
    def from_options(cls, options: Any, services: Services) -> Placement:
        needs(services.workload, "placement fgd", "a target workload (task types and counts)")
        assert services.workload is not None
        return cls(services.workload, options.coverage)

    def retarget(self, workload: Workload) -> None:
        """Measure fragmentation against another target workload from now on (a live shell
        learns it from the jobs it is given); the verdicts on the old one are forgotten."""
        self.workload = workload.covering(self.coverage)
        self._memo.clear()

    def verdict(self, index: NodeIndex, state: NodeState, shape: TaskShape) -> Verdict:
        if not fits(state, shape):
            return None
        weighted = self.workload.weighted_fragment
        before = weighted(state)
        if not shape.shares_gpu:
            return (weighted(after(state, shape, None)) - before,), None
        return min(
            ((weighted(after(state, shape, v)) - before, v), v)
            for v in _share_candidates(state, shape)
        )


class BestFit(SharingPlacement):
    """The node left with the least resources: 0.5 x free CPU / the largest node's CPU + 0.5 x
    free GPU / the largest node's GPUs, after placing (the paper's Best-fit baseline, Sec. 6.1); a
    share goes on the fullest GPU it fits on. Nodes without a CPU capacity count no CPU."""

    name = "best-fit"
    summary = "the node left with the least CPU and GPU (FGD's Best-fit baseline; shares too)"

    def verdict(self, index: NodeIndex, state: NodeState, shape: TaskShape) -> Verdict:
        if not fits(state, shape):
            return None
        max_cpu, max_gpu = max(index.max_cpu_milli, 1), max(index.max_gpu_milli, 1)
        cpu_free = state.cpu_free
        cpu_left = 0 if cpu_free == float("inf") else int(cpu_free) - shape.cpu_milli
        gpu_left = sum(state.gpu_free) - shape.total_gpu_milli
        # Both terms over the common denominator max_cpu x max_gpu: integer, exact.
        score = cpu_left * max_gpu + gpu_left * max_cpu
        choice = _share_candidates(state, shape)[0] if shape.shares_gpu else None
        return (score,), choice


class GpuPacking(SharingPlacement):
    """GPU packing (the paper's GPU Packing baseline, Sec. 6.1): a share goes on an already shared
    GPU if one has room (the fullest such GPU); otherwise tasks go on completely free GPUs of a
    node already in use (the fullest node), and only then on an idle node (the smallest).
    It looks at GPUs only: a task without GPUs goes on the first node it fits on."""

    name = "gpu-packing"
    summary = "shared GPUs first, then nodes in use, then idle ones (FGD's GPU Packing baseline)"

    def verdict(self, index: NodeIndex, state: NodeState, shape: TaskShape) -> Verdict:
        if not fits(state, shape):
            return None
        gpu_free = state.gpu_free
        free = sum(gpu_free)
        if shape.num_gpu == 0:
            return self.cpu_only_score(state, free), None
        if shape.shares_gpu:
            shared = [v for v in _share_candidates(state, shape) if v < MILLI]
            if shared:
                return (0, shared[0]), shared[0]
        if free < len(gpu_free) * MILLI:
            return (1, free), MILLI if shape.shares_gpu else None
        return (2, len(gpu_free)), MILLI if shape.shares_gpu else None

    def cpu_only_score(self, state: NodeState, gpu_free: int) -> tuple[int, ...]:
        return (0,)


class GpuPackingCpu(GpuPacking):
    """GPU packing that also places tasks without GPUs: on the node with the fewest free GPU milli
    (then the least free CPU), so they do not take the CPU that idle GPUs need. Not in the paper:
    it measures how much of FGD's gain on openb comes from where CPU-only tasks go."""

    name = "gpu-packing-cpu"
    summary = "gpu-packing, with CPU-only jobs where the fewest GPU milli are free"

    def cpu_only_score(self, state: NodeState, gpu_free: int) -> tuple[int, ...]:
        cpu = state.cpu_free
        return (0, gpu_free, 0 if cpu == float("inf") else int(cpu))


class RandomFit(SharingPlacement):
    """A node drawn uniformly among those the task fits on, and random GPUs on it (seeded)."""

    name = "random-fit"
    summary = "a node drawn among those the job fits, random GPUs there (FGD's baseline)"
    Options = RandomFitOptions

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.rng = random.Random(seed)

    @classmethod
    def from_options(cls, options: Any, services: Services) -> Placement:
        return cls(options.seed if options.seed is not None else services.seed)

    def verdict(self, index: NodeIndex, state: NodeState, shape: TaskShape) -> Verdict:
        return ((0,), None) if fits(state, shape) else None

    def choose(self, index: NodeIndex, shape: TaskShape) -> tuple[int, tuple[int, ...]] | None:
        memo = self._memo_for(index, shape)
        feasible: list[list[int]] = []
        count = 0
        for group_id, group in index.groups.items():
            if group_id not in memo:
                memo[group_id] = self.verdict(index, group.state, shape)
            if memo[group_id] is not None:
                feasible.append(group.nodes)
                count += len(group.nodes)
        if not count:
            return None
        pick = self.rng.randrange(count)
        node = -1
        for nodes in feasible:
            if pick < len(nodes):
                node = nodes[pick]
                break
            pick -= len(nodes)
        cluster = index.cluster
        ids = cluster.node_gpus[node]
        milli = cluster.gpu_milli_free
        roomy = (
            [i for i, g in enumerate(ids) if milli(g) >= shape.gpu_milli] if shape.num_gpu else []
        )
        picked = sorted(self.rng.sample(roomy, shape.num_gpu))
        return node, tuple(ids[i] for i in picked)
