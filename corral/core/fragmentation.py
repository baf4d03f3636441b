"""FGD's measure of GPU fragmentation, over the one cluster model (corral.core.cluster).

After Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation
Gradient Descent", USENIX ATC'23 (section numbers below are the paper's).

A node has CPU (milli-cores), memory (MiB) and GPUs of one type, each GPU with 1000 milli-GPU
(`Cluster.claim`). A job (`JobSpec`) asks for CPU, memory and either no GPU, a share of one GPU
(`gpus` 1, `gpu_milli` below 1000, placed on a GPU with at least that much free), or `gpus` whole
GPUs (each a GPU that is completely free), of the GPU types it accepts. Its *task shape* is that
request; jobs of one shape are one task type of a workload.

**Fragmentation (Sec. 3.2).** The fragment size F_n(m) of node n for task m is the part of the
node's unallocated GPU resource that m cannot use:

- m cannot run on n (too little free CPU or memory, a GPU type m does not accept, fewer than
  `gpus` GPUs with `gpu_milli` free each): all of n's free GPU milli is fragment;
- m asks for no GPU: likewise all of it (m cannot use any GPU);
- otherwise: the free milli of each GPU whose free amount is below m's per-GPU request
  (`gpu_milli`, which is 1000 for whole-GPU tasks).

The target workload M is a distribution over task types with popularities p_m; the node's
fragmentation is the expectation F_n(M) = sum_m p_m F_n(m), and the cluster's is the sum over nodes.
The popularities are kept as integer counts so every comparison is exact.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from corral.core.cluster import MILLI, Cluster
from corral.core.job import JobSpec


class WorkloadError(ValueError):
    """An invalid task shape or workload; the message is one line."""


@dataclass(frozen=True, slots=True, order=True)
class TaskShape:
    """What a task asks for; tasks of one shape are one task type of the workload."""

    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int  # per GPU: below 1000 is a share of one GPU, 1000 a whole GPU; 0 without GPUs
    gpu_models: frozenset[str] | None = None  # accepted GPU types; None accepts any

    def __post_init__(self) -> None:
        for field in ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise WorkloadError(f"{field}: must be a non-negative integer, got {value!r}")
        if self.num_gpu == 0 and self.gpu_milli != 0:
            raise WorkloadError(f"gpu_milli: must be 0 when num_gpu is 0, got {self.gpu_milli}")
        if self.num_gpu >= 1 and not 1 <= self.gpu_milli <= MILLI:
            raise WorkloadError(
                f"gpu_milli: must be 1..{MILLI} for a GPU task, got {self.gpu_milli}"
            )
        if self.num_gpu > 1 and self.gpu_milli != MILLI:
            raise WorkloadError(
                f"gpu_milli: a task of {self.num_gpu} GPUs takes whole GPUs ({MILLI}), "
                f"got {self.gpu_milli}"
            )
        if self.gpu_models is not None and not self.gpu_models:
            raise WorkloadError("gpu_models: empty set (use None to accept any GPU model)")

    @classmethod
    def of(cls, spec: JobSpec) -> TaskShape:
        """The shape of a job's request."""
        gpus = spec.gpus
        return cls(
            cpu_milli=spec.cpu_milli,
            memory_mib=spec.memory_mib,
            num_gpu=gpus,
            gpu_milli=spec.gpu_milli if gpus else 0,
            gpu_models=spec.gpu_types if gpus else None,
        )

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


class NodeState(NamedTuple):
    """Everything placement and fragmentation look at on a node; identical nodes share it."""

    gpu_model: str
    cpu_free: float  # infinite where the node declares no CPU capacity
    memory_free: float  # likewise
    gpu_free: tuple[int, ...]  # free milli per GPU, ascending


def state_of(cluster: Cluster, node: int) -> NodeState:
    """A node's state now."""
    milli = cluster.gpu_milli_free
    return NodeState(
        cluster.nodes[node].gpu_type,
        cluster.cpu_free(node),
        cluster.memory_free(node),
        tuple(sorted(milli(g) for g in cluster.node_gpus[node])),
    )


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


class Workload:
    """The target workload: task shapes with integer weights (their counts in a trace).

    `covering` keeps only the most popular shapes that together cover a share of all tasks, as
    the paper's artifact does to save evaluation time (hkust-adsl/kubernetes-scheduler-simulator
    keeps 95%); the kept shapes' weights are renormalised by dividing by their sum.
    """

    __slots__ = ("_cache", "_cpu_only_weight", "_gpu_types", "total_weight", "types")

    def __init__(self, types: Sequence[tuple[TaskShape, int]]) -> None:
        merged: dict[TaskShape, int] = {}
        for shape, weight in types:
            if isinstance(weight, bool) or not isinstance(weight, int) or weight <= 0:
                raise WorkloadError(
                    f"workload: weight of {shape.describe()}: must be a positive integer"
                )
            merged[shape] = merged.get(shape, 0) + weight
        if not merged:
            raise WorkloadError("workload: no task types")
        self.types: tuple[tuple[TaskShape, int], ...] = tuple(merged.items())
        self.total_weight = sum(merged.values())
        self._cpu_only_weight = sum(w for s, w in self.types if s.num_gpu == 0)
        self._gpu_types = tuple((s, w) for s, w in self.types if s.num_gpu > 0)
        self._cache: dict[NodeState, int] = {}

    @classmethod
    def from_shapes(cls, shapes: Iterable[TaskShape], coverage: float = 1.0) -> Workload:
        """Each distinct shape weighted by its count, the most popular first."""
        counts: dict[TaskShape, int] = {}
        for shape in shapes:
            counts[shape] = counts.get(shape, 0) + 1
        if not counts:
            raise WorkloadError("workload: no tasks to learn task types from")
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], _shape_order(kv[0])))
        return cls(ranked).covering(coverage)

    @classmethod
    def from_specs(cls, specs: Iterable[JobSpec], coverage: float = 1.0) -> Workload:
        return cls.from_shapes((TaskShape.of(spec) for spec in specs), coverage)

    def covering(self, coverage: float) -> Workload:
        """The most popular shapes that together cover `coverage` of the tasks (ties: the
        smaller shape first)."""
        if not 0.0 < coverage <= 1.0:
            raise WorkloadError(f"coverage: must be in (0, 1], got {coverage}")
        if coverage == 1.0:
            return self
        ranked = sorted(self.types, key=lambda kv: (-kv[1], _shape_order(kv[0])))
        covered = 0
        kept: list[tuple[TaskShape, int]] = []
        for shape, count in ranked:
            kept.append((shape, count))
            covered += count
            if covered >= coverage * self.total_weight:
                break
        return Workload(kept)

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


def cluster_fragmentation(cluster: Cluster, workload: Workload) -> float:
    """F(M) = sum over nodes of F_n(M), in milli-GPU."""
    weighted = sum(
        workload.weighted_fragment(state_of(cluster, node)) for node in range(len(cluster.nodes))
    )
    return weighted / workload.total_weight
