"""Placing GPU-sharing tasks, and FGD's measure of GPU fragmentation.

After Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation
Gradient Descent", USENIX ATC'23 (section numbers below are the paper's).

A node has CPU (milli-cores), memory (MiB) and GPUs of one model; each GPU has 1000 milli-GPU.
A task asks for CPU, memory and either no GPU, a share of one GPU (`num_gpu` 1, `gpu_milli` below
1000, placed on a GPU with at least that much free), or `num_gpu` whole GPUs (`gpu_milli` 1000,
each on a GPU that is completely free). A task may name the GPU models it accepts.

**Fragmentation (Sec. 3.2).** The fragment size F_n(m) of node n for task m is the part of the
node's unallocated GPU resource that m cannot use:

- m cannot run on n (too little free CPU or memory, a GPU model m does not accept, fewer than
  `num_gpu` GPUs with `gpu_milli` free each): all of n's free GPU milli is fragment;
- m asks for no GPU: likewise all of it (m cannot use any GPU);
- otherwise: the free milli of each GPU whose free amount is below m's per-GPU request
  (`gpu_milli`, which is 1000 for whole-GPU tasks).

The target workload M is a distribution over task types with popularities p_m; the node's
fragmentation is the expectation F_n(M) = sum_m p_m F_n(m), and the cluster's is the sum over nodes.
The popularities are kept as integer counts so every comparison below is exact.

**FGD (Sec. 4).** A task goes to the node (and GPU) whose fragmentation grows the least when it is
placed there: argmin of F_n'(M) - F_n(M) over feasible nodes and, for a GPU share, over the GPUs
with room for it (GPUs with the same free amount are interchangeable, so each distinct free amount
is tried once).

Placements evaluate one *state* (GPU model, free CPU, free memory, sorted free milli per GPU) per
group of identical nodes and remember each verdict per (state, task shape): a state never changes,
only the node moves to another one, so an allocation invalidates nothing but the touched node's
group membership. Ties go to the lowest node index.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

MILLI = 1000


class SharingError(ValueError):
    """An invalid node, task, workload or placement; the message is one line."""


@dataclass(frozen=True, slots=True)
class GpuNode:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_model: str

    def __post_init__(self) -> None:
        for field in ("cpu_milli", "memory_mib", "num_gpu"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SharingError(f"node {self.name}: {field}: must be a non-negative integer")


@dataclass(frozen=True, slots=True, order=True)
class TaskShape:
    """What a task asks for; tasks of one shape are one task type of the workload."""

    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int  # per GPU: below 1000 is a share of one GPU, 1000 a whole GPU
    gpu_models: frozenset[str] | None = None  # accepted GPU models; None accepts any

    def __post_init__(self) -> None:
        for field in ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SharingError(f"{field}: must be a non-negative integer, got {value!r}")
        if self.num_gpu == 0 and self.gpu_milli != 0:
            raise SharingError(f"gpu_milli: must be 0 when num_gpu is 0, got {self.gpu_milli}")
        if self.num_gpu >= 1 and not 1 <= self.gpu_milli <= MILLI:
            raise SharingError(
                f"gpu_milli: must be 1..{MILLI} for a GPU task, got {self.gpu_milli}"
            )
        if self.num_gpu > 1 and self.gpu_milli != MILLI:
            raise SharingError(
                f"gpu_milli: a task of {self.num_gpu} GPUs takes whole GPUs ({MILLI}), "
                f"got {self.gpu_milli}"
            )
        if self.gpu_models is not None and not self.gpu_models:
            raise SharingError("gpu_models: empty set (use None to accept any GPU model)")

    @property
    def total_gpu_milli(self) -> int:
        return self.num_gpu * self.gpu_milli

    @property
    def shares_gpu(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < MILLI

    def describe(self) -> str:
        gpu = (
            "no GPU"
            if self.num_gpu == 0
            else f"{self.gpu_milli} milli-GPU"
            if self.shares_gpu
            else f"{self.num_gpu} GPU"
        )
        models = "" if self.gpu_models is None else f" on {'|'.join(sorted(self.gpu_models))}"
        return f"{self.cpu_milli} mCPU, {self.memory_mib} MiB, {gpu}{models}"


@dataclass(frozen=True, slots=True)
class SharingTask:
    name: str
    shape: TaskShape


class NodeState(NamedTuple):
    """Everything placement and fragmentation look at on a node; identical nodes share it."""

    gpu_model: str
    cpu_free: int
    memory_free: int
    gpu_free: tuple[int, ...]  # free milli per GPU, ascending


@dataclass(frozen=True, slots=True)
class SharingPlacement:
    node: int
    gpus: tuple[int, ...]  # GPU indices on the node; each gets the task's gpu_milli


# -- fragmentation -------------------------------------------------------------------------------


def fits(state: NodeState, shape: TaskShape) -> bool:
    """Can a task of this shape run on a node in this state now?"""
    if shape.cpu_milli > state.cpu_free or shape.memory_mib > state.memory_free:
        return False
    if shape.num_gpu == 0:
        return True
    if shape.gpu_models is not None and state.gpu_model not in shape.gpu_models:
        return False
    # gpu_free is ascending: the GPUs with room are the tail from the first one with enough.
    roomy = len(state.gpu_free) - bisect.bisect_left(state.gpu_free, shape.gpu_milli)
    return roomy >= shape.num_gpu


def task_fragment(state: NodeState, shape: TaskShape) -> int:
    """F_n(m) of Sec. 3.2: the node's free milli-GPU that a task of this shape cannot use."""
    free = sum(state.gpu_free)
    if shape.num_gpu == 0 or not fits(state, shape):
        return free
    return sum(g for g in state.gpu_free if g < shape.gpu_milli)


class Workload:
    """The target workload: task shapes with integer weights (their counts in a trace).

    `from_shapes` can keep only the most popular shapes that together cover `coverage` of all
    tasks, as the paper's artifact does to save evaluation time
    (hkust-adsl/kubernetes-scheduler-simulator keeps 95%); the default keeps them all. The kept
    shapes' weights are renormalised by dividing by their sum.
    """

    __slots__ = ("_cache", "_cpu_only_weight", "_gpu_types", "total_weight", "types")

    def __init__(self, types: Sequence[tuple[TaskShape, int]]) -> None:
        merged: dict[TaskShape, int] = {}
        for shape, weight in types:
            if isinstance(weight, bool) or not isinstance(weight, int) or weight <= 0:
                raise SharingError(
                    f"workload: weight of {shape.describe()}: must be a positive integer"
                )
            merged[shape] = merged.get(shape, 0) + weight
        if not merged:
            raise SharingError("workload: no task types")
        self.types: tuple[tuple[TaskShape, int], ...] = tuple(merged.items())
        self.total_weight = sum(merged.values())
        self._cpu_only_weight = sum(w for s, w in self.types if s.num_gpu == 0)
        self._gpu_types = tuple((s, w) for s, w in self.types if s.num_gpu > 0)
        self._cache: dict[NodeState, int] = {}

    @classmethod
    def from_shapes(cls, shapes: Iterable[TaskShape], coverage: float = 1.0) -> Workload:
        if not 0.0 < coverage <= 1.0:
            raise SharingError(f"coverage: must be in (0, 1], got {coverage}")
        counts: dict[TaskShape, int] = {}
        for shape in shapes:
            counts[shape] = counts.get(shape, 0) + 1
        if not counts:
            raise SharingError("workload: no tasks to learn task types from")
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], _shape_order(kv[0])))
        total, covered = sum(counts.values()), 0
        kept: list[tuple[TaskShape, int]] = []
        for shape, count in ranked:
            kept.append((shape, count))
            covered += count
            if covered >= coverage * total:
                break
        return cls(kept)

    def probability(self, shape: TaskShape) -> float:
        return dict(self.types).get(shape, 0) / self.total_weight

    def weighted_fragment(self, state: NodeState) -> int:
        """total_weight x F_n(M): an integer, so FGD compares placements exactly."""
        cached = self._cache.get(state)
        if cached is not None:
            return cached
        gpu_free = state.gpu_free
        free = sum(gpu_free)
        total = self._cpu_only_weight * free  # a task without GPUs can use none of them
        if free:
            for shape, weight in self._gpu_types:
                total += weight * (
                    sum(g for g in gpu_free if g < shape.gpu_milli) if fits(state, shape) else free
                )
        if len(self._cache) >= 1 << 18:  # bound memory on long runs; recomputing is cheap
            self._cache.clear()
        self._cache[state] = total
        return total

    def fragmentation(self, state: NodeState) -> float:
        """F_n(M) in milli-GPU."""
        return self.weighted_fragment(state) / self.total_weight


def _shape_order(shape: TaskShape) -> tuple[int, int, int, int, tuple[str, ...]]:
    models = () if shape.gpu_models is None else tuple(sorted(shape.gpu_models))
    return (shape.cpu_milli, shape.memory_mib, shape.num_gpu, shape.gpu_milli, models)


# -- the cluster ---------------------------------------------------------------------------------


class _Group:
    """The nodes (ascending indices) that are in one state right now."""

    __slots__ = ("nodes", "state")

    def __init__(self, state: NodeState) -> None:
        self.state = state
        self.nodes: list[int] = []


class SharingCluster:
    """Free CPU, memory and per-GPU milli of every node, with nodes grouped by identical state.

    Group ids are never reused, so a verdict remembered for a group id stays true.
    """

    def __init__(self, nodes: Sequence[GpuNode]) -> None:
        names: set[str] = set()
        for node in nodes:
            if node.name in names:
                raise SharingError(f"node {node.name}: duplicate node name")
            names.add(node.name)
        self.nodes = tuple(nodes)
        self.cpu_free = [n.cpu_milli for n in nodes]
        self.memory_free = [n.memory_mib for n in nodes]
        self.gpu_free = [[MILLI] * n.num_gpu for n in nodes]
        self.capacity_gpu_milli = sum(n.num_gpu for n in nodes) * MILLI
        self.allocated_gpu_milli = 0
        self.max_cpu_milli = max((n.cpu_milli for n in nodes), default=0)
        self.max_gpu_milli = max((n.num_gpu for n in nodes), default=0) * MILLI
        self.groups: dict[int, _Group] = {}
        self._group_of_state: dict[NodeState, int] = {}
        self._group_of_node: list[int] = []
        self._next_group = 0
        for index in range(len(nodes)):
            self._group_of_node.append(self._join(index, self.state(index)))

    def state(self, node: int) -> NodeState:
        return NodeState(
            self.nodes[node].gpu_model,
            self.cpu_free[node],
            self.memory_free[node],
            tuple(sorted(self.gpu_free[node])),
        )

    def allocate(self, shape: TaskShape, placement: SharingPlacement) -> None:
        self._apply(shape, placement, -1)

    def release(self, shape: TaskShape, placement: SharingPlacement) -> None:
        """Give back what `allocate` took (a task that ended)."""
        self._apply(shape, placement, +1)

    def placement(
        self, node: int, shape: TaskShape, gpu_free_value: int | None
    ) -> SharingPlacement:
        """Concrete GPUs for a verdict: a share goes on the first GPU with exactly
        `gpu_free_value` free; whole GPUs are the first completely free ones."""
        free = self.gpu_free[node]
        if shape.num_gpu == 0:
            return SharingPlacement(node, ())
        if shape.shares_gpu:
            if gpu_free_value is None:
                raise SharingError("placement: a GPU share needs the free amount of its GPU")
            return SharingPlacement(node, (free.index(gpu_free_value),))
        whole = [i for i, g in enumerate(free) if g == MILLI]
        return SharingPlacement(node, tuple(whole[: shape.num_gpu]))

    def _apply(self, shape: TaskShape, placement: SharingPlacement, sign: int) -> None:
        node = placement.node
        if not 0 <= node < len(self.nodes):
            raise SharingError(f"placement: no node {node}")
        if len(placement.gpus) != shape.num_gpu or len(set(placement.gpus)) != shape.num_gpu:
            raise SharingError(
                f"placement: {shape.num_gpu} distinct GPUs needed, got {placement.gpus}"
            )
        free = self.gpu_free[node]
        cpu = self.cpu_free[node] + sign * shape.cpu_milli
        memory = self.memory_free[node] + sign * shape.memory_mib
        spec = self.nodes[node]
        if not (0 <= cpu <= spec.cpu_milli and 0 <= memory <= spec.memory_mib):
            raise SharingError(f"placement: node {spec.name} has too little CPU or memory left")
        if sign < 0 and shape.num_gpu and shape.gpu_models is not None:
            if spec.gpu_model not in shape.gpu_models:
                raise SharingError(f"placement: node {spec.name} has {spec.gpu_model} GPUs")
        new_free = list(free)
        for gpu in placement.gpus:
            if not 0 <= gpu < len(free):
                raise SharingError(f"placement: node {spec.name} has no GPU {gpu}")
            if sign < 0 and shape.gpu_milli == MILLI and free[gpu] != MILLI:
                raise SharingError(f"placement: GPU {gpu} of {spec.name} is not completely free")
            new_free[gpu] += sign * shape.gpu_milli
            if not 0 <= new_free[gpu] <= MILLI:
                raise SharingError(f"placement: GPU {gpu} of {spec.name} has too little free")
        self._leave(node)
        self.cpu_free[node], self.memory_free[node], self.gpu_free[node] = cpu, memory, new_free
        self.allocated_gpu_milli -= sign * shape.total_gpu_milli
        self._group_of_node[node] = self._join(node, self.state(node))

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


# -- placement policies --------------------------------------------------------------------------

# A verdict on one state for one task shape: (score, chosen free amount of the GPU that takes a
# share, or None), lower scores first; None when the shape does not fit.
Verdict = tuple[tuple[int, ...], int | None] | None


def _share_candidates(state: NodeState, shape: TaskShape) -> list[int]:
    """Distinct free amounts of the GPUs a share could go on, ascending."""
    start = bisect.bisect_left(state.gpu_free, shape.gpu_milli)
    return sorted(set(state.gpu_free[start:]))


def after(state: NodeState, shape: TaskShape, gpu_free_value: int | None) -> NodeState:
    """The state once a task of `shape` is placed (a share on a GPU with `gpu_free_value` free)."""
    gpu_free = list(state.gpu_free)
    if shape.shares_gpu:
        assert gpu_free_value is not None
        gpu_free.remove(gpu_free_value)
        bisect.insort(gpu_free, gpu_free_value - shape.gpu_milli)
    elif shape.num_gpu:
        for _ in range(shape.num_gpu):
            gpu_free.remove(MILLI)
        gpu_free[:0] = [0] * shape.num_gpu
    return NodeState(
        state.gpu_model,
        state.cpu_free - shape.cpu_milli,
        state.memory_free - shape.memory_mib,
        tuple(gpu_free),
    )


class SharingPlacer:
    """Scores each group of identical nodes once per task shape and picks the lowest score."""

    name = "base"

    def __init__(self) -> None:
        self._memo: dict[TaskShape, dict[int, Verdict]] = {}
        self._cluster_id: int | None = None
        self._calls = 0

    def verdict(self, cluster: SharingCluster, state: NodeState, shape: TaskShape) -> Verdict:
        raise NotImplementedError

    def choose(self, cluster: SharingCluster, shape: TaskShape) -> SharingPlacement | None:
        """Where a task of this shape goes, or None when it fits on no node."""
        memo = self._memo_for(cluster, shape)
        best: tuple[tuple[int, ...], int] | None = None
        best_choice: int | None = None
        for group_id, group in cluster.groups.items():
            if group_id in memo:
                verdict = memo[group_id]
            else:
                verdict = memo[group_id] = self.verdict(cluster, group.state, shape)
            if verdict is None:
                continue
            key = (verdict[0], group.nodes[0])
            if best is None or key < best:
                best, best_choice = key, verdict[1]
        if best is None:
            return None
        return cluster.placement(best[1], shape, best_choice)

    def _memo_for(self, cluster: SharingCluster, shape: TaskShape) -> dict[int, Verdict]:
        if self._cluster_id != id(cluster):  # group ids are per cluster
            self._memo.clear()
            self._cluster_id = id(cluster)
        self._calls += 1
        if self._calls % 2048 == 0:  # forget verdicts on states no node is in any more
            live = cluster.groups
            for memo in self._memo.values():
                for group_id in [g for g in memo if g not in live]:
                    del memo[group_id]
        return self._memo.setdefault(shape, {})


class FgdPlacer(SharingPlacer):
    """Fragmentation Gradient Descent: the smallest growth of F_n(M) (Sec. 4)."""

    name = "fgd"

    def __init__(self, workload: Workload) -> None:
        super().__init__()
        self.workload = workload

    def verdict(self, cluster: SharingCluster, state: NodeState, shape: TaskShape) -> Verdict:
        if not fits(state, shape):
            return None
        before = self.workload.weighted_fragment(state)
        if not shape.shares_gpu:
            return (self.workload.weighted_fragment(after(state, shape, None)) - before,), None
        # Each distinct free amount once; ties go to the fullest GPU (smallest free amount).
        return min(
            ((self.workload.weighted_fragment(after(state, shape, v)) - before, v), v)
            for v in _share_candidates(state, shape)
        )


class BestFitPlacer(SharingPlacer):
    """The node left with the least resources: 0.5 x free CPU / the largest node's CPU + 0.5 x free
    GPU / the largest node's GPUs, after placing (the paper's Best-fit baseline, Sec. 6.1); a share
    goes on the fullest GPU it fits on."""

    name = "best-fit"

    def verdict(self, cluster: SharingCluster, state: NodeState, shape: TaskShape) -> Verdict:
        if not fits(state, shape):
            return None
        max_cpu, max_gpu = max(cluster.max_cpu_milli, 1), max(cluster.max_gpu_milli, 1)
        cpu_left = state.cpu_free - shape.cpu_milli
        gpu_left = sum(state.gpu_free) - shape.total_gpu_milli
        # Both terms over the common denominator max_cpu x max_gpu: integer, exact.
        score = cpu_left * max_gpu + gpu_left * max_cpu
        choice = _share_candidates(state, shape)[0] if shape.shares_gpu else None
        return (score,), choice


class PackingPlacer(SharingPlacer):
    """GPU packing (the paper's GPU Packing baseline, Sec. 6.1): a share goes on an already shared
    GPU if one has room (the fullest such GPU); otherwise tasks go on completely free GPUs of a
    node already in use (the fullest node), and only then on an idle node (the smallest).
    It looks at GPUs only: a task without GPUs goes on the first node it fits on."""

    name = "packing"

    def verdict(self, cluster: SharingCluster, state: NodeState, shape: TaskShape) -> Verdict:
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


class PackingCpuPlacer(PackingPlacer):
    """GPU packing that also places tasks without GPUs: on the node with the fewest free GPU milli
    (then the least free CPU), so they do not take the CPU that idle GPUs need. Not in the paper:
    it measures how much of FGD's gain on openb comes from where CPU-only tasks go."""

    name = "packing-cpu"

    def cpu_only_score(self, state: NodeState, gpu_free: int) -> tuple[int, ...]:
        return (0, gpu_free, state.cpu_free)


class RandomFitPlacer(SharingPlacer):
    """A node drawn uniformly among those the task fits on, and random GPUs on it (seeded)."""

    name = "random-fit"

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.rng = random.Random(seed)

    def verdict(self, cluster: SharingCluster, state: NodeState, shape: TaskShape) -> Verdict:
        return ((0,), None) if fits(state, shape) else None

    def choose(self, cluster: SharingCluster, shape: TaskShape) -> SharingPlacement | None:
        memo = self._memo_for(cluster, shape)
        feasible: list[list[int]] = []
        count = 0
        for group_id, group in cluster.groups.items():
            if group_id not in memo:
                memo[group_id] = self.verdict(cluster, group.state, shape)
            if memo[group_id] is not None:
                feasible.append(group.nodes)
                count += len(group.nodes)
        if not count:
            return None
        pick = self.rng.randrange(count)
        for nodes in feasible:
            if pick < len(nodes):
                node = nodes[pick]
                break
            pick -= len(nodes)
        free = cluster.gpu_free[node]
        roomy = [i for i, g in enumerate(free) if g >= shape.gpu_milli] if shape.num_gpu else []
        return SharingPlacement(node, tuple(sorted(self.rng.sample(roomy, shape.num_gpu))))


PLACERS: dict[str, Callable[[Workload, int], SharingPlacer]] = {
    "fgd": lambda workload, seed: FgdPlacer(workload),
    "best-fit": lambda workload, seed: BestFitPlacer(),
    "random-fit": lambda workload, seed: RandomFitPlacer(seed),
    "packing": lambda workload, seed: PackingPlacer(),
    "packing-cpu": lambda workload, seed: PackingCpuPlacer(),
}


def make_placer(name: str, workload: Workload, seed: int = 0) -> SharingPlacer:
    """A placement policy by name; `workload` is FGD's target workload, `seed` random-fit's."""
    try:
        factory = PLACERS[name]
    except KeyError:
        raise SharingError(
            f"unknown sharing placement {name!r}; choose one of {', '.join(PLACERS)}"
        ) from None
    return factory(workload, seed)


def cluster_fragmentation(cluster: SharingCluster, workload: Workload) -> float:
    """F(M) = sum over nodes of F_n(M), in milli-GPU."""
    weighted = sum(
        workload.weighted_fragment(group.state) * len(group.nodes)
        for group in cluster.groups.values()
    )
    return weighted / workload.total_weight
