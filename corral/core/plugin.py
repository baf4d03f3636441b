"""What a plugin is, and what a shell offers the plugins it builds.

A plugin (an ordering policy, a placement, an admission scheme) is a class in a registry. It
declares its options as a dataclass (`Options`, see `corral.core.options`) and builds itself with
`from_options(options, services)`, as a Kubernetes scheduling-framework plugin builds itself from
its own arguments and the framework's handle. Nothing outside the plugin's module names its
options: the YAML section, the CLI flags and `corral config show` follow from the declaration.

`Services` is the handle: what the shell running the scheduler knows (the simulator: the whole
trace and its performance model; the live manager: the store's finished jobs, speed 1.0). A plugin
that needs something its shell cannot give refuses to build, in one line (`PluginError`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from corral.core.cluster import Cluster
from corral.core.options import NoOptions
from corral.core.queues import QueueTree

if TYPE_CHECKING:
    from corral.core.cache import DataCache
    from corral.core.colocation import PairSpeeds
    from corral.core.estimate import Progress
    from corral.core.fragmentation import Workload
    from corral.core.job import Job

#: Given a job and the GPUs chosen for it, its speed in ideal seconds per wall second.
SpeedModel = Callable[["Job", tuple[int, ...]], float]
#: A job's throughput (work per second) on a GPU count: ElasticFlow's scaling curve.
Throughput = Callable[["Job", int], float]
#: A job's training progress at an instant: its steps and losses so far (Optimus's fit).
Observe = Callable[["Job", float], "Progress"]


class PluginError(ValueError):
    """A plugin that cannot be built with these options in this shell; one line, naming it."""


@dataclass(slots=True)
class Services:
    """What a shell offers the plugins; anything may be missing (None)."""

    cluster: Cluster
    #: Each VC's guaranteed cells ({cell type: count}; {} is "the whole cluster").
    vc_cells: dict[str, dict[str, int]] = field(default_factory=lambda: {"default": {}})
    #: Each VC's GPU quota (the GPUs in its cells).
    vc_quota: dict[str, int] = field(default_factory=dict)
    #: The VCs' departments, weights and limits (hierarchical queues); None: flat VCs.
    vc_tree: QueueTree | None = None
    #: A speed model for a cluster (HiveD builds one per VC's virtual cluster); None: speed 1.0.
    speed_model_for: Callable[[Cluster], SpeedModel] | None = None
    #: GPU-seconds of past jobs, the distribution Gittins takes job sizes from.
    service_history: Callable[[], Sequence[float]] | None = None
    #: Whether every job declares its length (sjf, srtf need it).
    durations_known: bool = False
    #: A job's training progress (optimus's loss-curve fit).
    observe: Observe | None = None
    #: ElasticFlow's scaling curves.
    throughput: Throughput | None = None
    #: The nodes' data caches (SiloD).
    cache: DataCache | None = None
    #: Gandiva's co-location speeds (packing): a table (the simulator's Gavel table) or what
    #: the live manager measured (Profiles.pair_speeds).
    pair_table: PairSpeeds | None = None
    #: The target workload: task types and their counts (FGD's placement measures the
    #: fragmentation it would suffer).
    workload: Workload | None = None
    #: The run's seed, for plugins that draw at random (random-fit) unless told their own.
    seed: int = 0

    def vc_quota_or_whole(self) -> dict[str, int]:
        return self.vc_quota or {vc: self.cluster.total_gpus for vc in self.vc_cells}


class OptionsMixin:
    """Defaults for a plugin class: no options, built by calling the class."""

    Options: ClassVar[type[Any]] = NoOptions
    summary: ClassVar[str] = ""

    @classmethod
    def from_options(cls, options: Any, services: Services) -> Any:
        return cls()


def needs(what: object, plugin: str, thing: str) -> None:
    """Refuse to build `plugin` when the shell lacks `thing`."""
    if what is None or what is False:
        raise PluginError(f"{plugin}: needs {thing}")
