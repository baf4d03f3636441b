"""What an executor entry is: how `corral up` builds the executor it is told by name.

An entry is a class in `corral.server.executors.EXECUTORS`, as a policy is one in `POLICIES`: a
`name`, a one-line `summary`, its options as a dataclass (`Options`, see corral.core.options; its
fields become `corral up`'s flags `--NAME-OPTION`), what it refuses before anything starts
(`refusal`), and `start`, which makes the executor and says on which cluster it runs. Boot and
the CLI call these and nothing else: they know no executor by name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from corral.core.cluster import Cluster, NodeDef
from corral.core.options import NoOptions
from corral.core.queues import QueueTree
from corral.server.state import Executor, ManagerSettings


class ExecutorError(ValueError):
    """A setting an executor cannot start with: one line naming the flag (`corral up` exits 2)."""


@dataclass(slots=True)
class Boot:
    """What `corral up` knows when it builds an executor (its flags, resolved)."""

    data_dir: Path
    #: The manager's settings: an entry may refuse some (a stage), or fill in what it learns
    #: (`gpu_memory_mib`), before the manager is made.
    settings: ManagerSettings
    gpus: int | None = None  # `--gpus`: declared GPUs; None: none declared
    gpu_type: str = "gpu"
    gpu_memory_mib: int | None = None  # `--gpu-memory`
    config: Path | None = None  # `--config`: the cluster and VC config
    demo: bool = False  # `--demo`
    #: With managers sharing a database (docs/ha.md): `shared(key, mine)` is the value every one
    #: of them uses for `key`, the first leader's (`mine` recorded if none is yet). None: a
    #: manager alone, whose own values are the ones.
    shared: Callable[[str, str], str] | None = None


@dataclass(slots=True)
class Started:
    """An executor and the cluster its attempts run on."""

    executor: Executor
    cluster: Cluster
    #: Each VC's guaranteed GPUs; None: one VC, `default`, with all of them.
    vc_quota: dict[str, int] | None = None
    #: Each VC's guaranteed cells (HiveD's), from the config; None: none.
    vc_cells: dict[str, dict[str, int]] | None = None
    #: The VCs' departments, weights and limits, from the config; None: flat VCs.
    vc_tree: QueueTree | None = None
    #: The live nodes, for a cluster whose machines come and go (read every `node_check_s`).
    nodes: Callable[[], list[NodeDef]] | None = None
    #: With `nodes`: keep `cluster` as it is, holding out the nodes that are not live.
    fixed_cluster: bool = False


class ExecutorEntry:
    """An executor `corral up --executor NAME` can run. Subclass it, set `name` and `summary`,
    declare `Options` if it takes any, implement `start`, and add it to `EXECUTORS`."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    Options: ClassVar[type[Any]] = NoOptions
    #: Whether root's manager runs each user's attempts under that user's Unix account (and
    #: prepares the data directory for it); False: every attempt is the manager's own.
    accounts: ClassVar[bool] = True

    @classmethod
    def refusal(cls, options: Any, boot: Boot) -> str | None:
        """A setting it cannot run with, in one line naming the flag; None: none. Called before
        anything is made or written (and again by `build_manager`)."""
        return None

    @classmethod
    def start(cls, options: Any, boot: Boot, given: Executor | None) -> Started:
        """The executor (`given` when a caller made it already: a test's) and its cluster; an
        ExecutorError for what it finds wrong. A failure after it made its executor closes it."""
        raise NotImplementedError

    @classmethod
    def prepare(
        cls, options: Any, boot: Boot, recorded: Callable[[str], str | None]
    ) -> Executor | None:
        """What a standby may make while it waits to lead (docs/ha.md), handed to `start` as
        `given` once it leads, so that a takeover costs less: an executor connected but that has
        started, stopped and found nothing. `recorded(key)` reads a value the managers share
        (`Boot.shared`'s) without recording one. None (the default): made at the takeover."""
        return None

    @classmethod
    def where(cls, options: Any) -> str:
        """What `corral up`'s first line adds after the nodes ("of the Ray cluster at ...")."""
        return ""
