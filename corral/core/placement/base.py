"""What a placement is: choose exact GPUs for a gang, or say why it cannot yet."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import ClassVar, Final, final

from corral.core.cluster import MILLI, Cluster
from corral.core.compiled import mypyc_attr
from corral.core.job import Job, JobSpec, Reason, reason_text
from corral.core.plugin import OptionsMixin, SpeedModel


@final
class Placed:
    """Where a job goes: its GPUs and, for a job that asks for a share of one GPU, CPU or memory
    (`JobSpec.plain` false), how much of each GPU it takes and the node its CPU and memory are
    taken on.

    Written out rather than a frozen dataclass, whose generated `__init__` stays interpreted in
    the compiled build (one is made at every start and placement): the same fields, `repr`,
    equality and hash. Its fields are `Final`: read-only at run time in the compiled build, and
    for mypy everywhere."""

    __slots__ = ("gpus", "relaxed", "milli", "node")

    gpus: Final[tuple[int, ...]]
    relaxed: Final[bool]
    #: Milli-GPU taken on each of `gpus` (below 1000: a share of the one GPU).
    milli: Final[int]
    #: The node whose CPU and memory the job takes (-1: it takes none).
    node: Final[int]

    def __init__(
        self, gpus: tuple[int, ...], relaxed: bool = False, milli: int = MILLI, node: int = -1
    ) -> None:
        self.gpus = gpus
        self.relaxed = relaxed
        self.milli = milli
        self.node = node

    def __repr__(self) -> str:
        return (
            f"Placed(gpus={self.gpus!r}, relaxed={self.relaxed!r}, milli={self.milli!r}, "
            f"node={self.node!r})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Placed):
            return NotImplemented
        return (self.gpus, self.relaxed, self.milli, self.node) == (
            other.gpus,
            other.relaxed,
            other.milli,
            other.node,
        )

    def __hash__(self) -> int:
        return hash((self.gpus, self.relaxed, self.milli, self.node))


@final
class NotPlaced:
    """Why a job cannot be placed yet (written out as `Placed` is)."""

    __slots__ = ("why",)

    #: Why, formatted only when read (`reason`): a failed attempt's text is seldom read.
    why: Final[Reason]

    def __init__(self, why: Reason) -> None:
        self.why = why

    @property
    def reason(self) -> str:
        return reason_text(self.why)

    def __repr__(self) -> str:
        return f"NotPlaced(why={self.why!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NotPlaced):
            return NotImplemented
        return self.why == other.why

    def __hash__(self) -> int:
        return hash((self.why,))


# Other modules (and plugins) subclass it: allowed when it is compiled (setup.py).
@mypyc_attr(allow_interpreted_subclasses=True)
class Placement(OptionsMixin):
    """A registry entry (`corral.core.placement.PLACEMENTS`): declares `Options` and builds itself
    with `from_options` (corral.core.plugin)."""

    name: ClassVar[str] = "base"
    #: It places jobs that ask for a share of a GPU, CPU or memory (JobSpec.plain false); the
    #: others give whole GPUs only, and the scheduler refuses such jobs under them.
    shares: ClassVar[bool] = False
    #: `place`, `mode` and `scope` depend only on the cluster's free GPUs, the job and the
    #: instants `changes_at` announces (no state of the placement's own): the scheduler may then
    #: skip a round in which nothing it looks at changed (`Scheduler.decide`).
    pure: ClassVar[bool] = False
    #: A job of whole GPUs whose `scope` is a node or a rack goes to one node or rack with free
    #: GPUs enough for it, chosen by the state of those alone (their free GPUs, and the order
    #: in which the cluster's buckets hold them), on a cluster of one GPU type: the free GPUs of
    #: the nodes and racks too small for it do not change `place`'s answer. A search for
    #: preemption victims then frees only the victims in places that could hold the job
    #: (`Preemption.lowest_first`).
    confined: ClassVar[bool] = False

    def refusal(self, cluster: Cluster, spec: JobSpec) -> str | None:
        """Why this placement could never place the job on this cluster (beyond the GPU counts
        the scheduler checks), or None."""
        return None

    def begin_round(
        self,
        cluster: Cluster,
        pending: Iterable[Job],
        running: Iterable[Job],
        speed_model: SpeedModel | None,
        now: float,
    ) -> None:
        """Called once at the start of each round, before any job is placed: a placement that
        decides for the round's jobs together (hetero's matching) looks at them here."""

    def place(self, cluster: Cluster, job: Job, now: float) -> Placed | NotPlaced:
        raise NotImplementedError

    def mode(self, job: Job, now: float) -> str:
        """Jobs with the same mode and GPU types that need more GPUs cannot fit where a smaller one
        did not: the scheduler uses this to skip hopeless placement attempts within a round."""
        return self.name

    def scope(self, cluster: Cluster, job: Job, now: float) -> str:
        """Where all of the job's GPUs must lie: "node", "rack" or "cluster". The scheduler uses it
        to choose preemption victims that free enough GPUs in one such place."""
        return "cluster"

    def changes_at(self, job: Job, now: float) -> float:
        """When this job's placement rules change (e.g. relax after waiting); inf when never."""
        return math.inf


#: What a round's walk tells waiting jobs apart by (`placement_kind`).
Kind = tuple[object, ...]


def placement_kind(placement: Placement, job: Job, now: float) -> Kind:
    """Within a round, a job of the same kind needing at least as many GPUs as one that did not
    fit cannot fit either: its GPU types, the placement's mode, its GPUs per worker (a job of
    smaller workers fits where larger did not), and for a job asking for a share, CPU or memory
    that request. Under a `pure` placement a waiting job's kind changes only at the instants
    `changes_at` announces (when the scheduler's timers index the job again)."""
    spec = job.spec
    kind: Kind = (spec.gpu_types, placement.mode(job, now), spec.gpus_per_worker)
    if not spec.plain:
        kind += (spec.gpu_milli, spec.cpu_milli, spec.memory_mib)
    return kind


def types_for(cluster: Cluster, job: Job) -> list[str]:
    """The job's acceptable GPU types present in the cluster, most free first (ties: by name)."""
    if job.spec.gpu_types is None and len(cluster.gpu_types) == 1:
        return cluster.gpu_types
    types = (
        cluster.gpu_types
        if job.spec.gpu_types is None
        else sorted(t for t in job.spec.gpu_types if t in cluster.total_by_type)
    )
    return sorted(types, key=lambda t: -cluster.free_by_type.get(t, 0))


def whole_worker_gpus(cluster: Cluster, nodes: list[int], unit: int) -> int:
    """GPUs these nodes could give to workers of `unit` GPUs each, every worker on one node."""
    return sum(total - total % unit for total in (cluster.nodes[n].total_gpus for n in nodes))


def largest_rack(cluster: Cluster, unit: int = 1) -> int:
    """The most GPUs one rack could give a gang whose workers need `unit` GPUs on one node."""
    if unit == 1:
        return max(r.total_gpus for r in cluster.racks)
    return max(whole_worker_gpus(cluster, nodes, unit) for nodes in cluster.rack_nodes)


def not_enough(cluster: Cluster, job: Job) -> NotPlaced | None:
    if job.spec.gpu_types is None and len(cluster.gpu_types) == 1:  # (asked at every place)
        free = cluster.free_by_type.get(cluster.gpu_types[0], 0)
    else:
        free = max((cluster.free_by_type.get(t, 0) for t in types_for(cluster, job)), default=0)
    if free < job.spec.gpus:
        types = job.spec.gpu_types
        what = "" if types is None else f" of type {'|'.join(sorted(types))}"
        return NotPlaced(("waiting for {} free GPUs{} ({} free)", job.spec.gpus, what, free))
    return None
