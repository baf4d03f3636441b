"""Round stages: mechanisms that register into a scheduling round instead of branching it.

A round (`Scheduler.decide`) walks the waiting jobs in the policy's order; for each one it tries,
in turn, its placement on free GPUs, the `defragment` stages (Gandiva's migration: move running
jobs so the free GPUs come together), preemption of lower-priority jobs, then the `share` stages
(Gandiva's packing: start on the GPUs of a running job it runs well beside). As in Volcano, the
round owns the loop and the stages are consulted; as in the Kubernetes scheduling framework, a
stage is a small plugin that builds itself from its own options (`Options`, `from_options`) and
is chosen by name (`corral.core.framework.STAGES`).

What a stage may do to the round goes through `RoundHost`, a narrow view of the scheduler: start a
job on GPUs, move a running job, stop one and queue it again, change a running job's speed. Besides
the waiting jobs it is consulted for, a stage may act on the running ones once as the round
begins (`begin_round`: packing splits the pairs it has measured not to gain). A stage that lets
jobs share GPUs also answers the questions preemption and release ask of shared GPUs
(`partner_release`, `frees_gpus`, `shares`), and takes back a pair a shell found running after a
restart (`restore_shared`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar, Protocol

from corral.core.plugin import OptionsMixin

if TYPE_CHECKING:
    from corral.core.actions import Action
    from corral.core.cluster import Cluster
    from corral.core.job import Job
    from corral.core.placement.base import Placed, Placement


class RoundHost(Protocol):
    """What a stage may read and do during a round (the scheduler implements it)."""

    @property
    def cluster(self) -> Cluster: ...

    @property
    def placement(self) -> Placement: ...

    def running_jobs(self) -> Iterable[Job]: ...

    def start_on(self, job: Job, placed: Placed, now: float, actions: list[Action]) -> None:
        """Start a waiting job on GPUs the stage chose (allocated by the scheduler)."""
        ...

    def move(self, job: Job, node: int, by: str, now: float, actions: list[Action]) -> None:
        """Migrate a running job to free GPUs of `node` (a stop and a start, restore paid)."""
        ...

    def requeue(
        self, job: Job, by: str, now: float, actions: list[Action], *, kind: str = "preempted"
    ) -> None:
        """Stop a running job and queue it again (`Preempt` of that `kind`); a partner it shared
        its GPUs with keeps them."""
        ...

    def change_speed(self, job: Job, speed: float, now: float) -> None: ...

    def is_shared(self, job: Job) -> bool:
        """Does another job run on the job's GPUs (a stage made them share)?"""
        ...


class Stage(OptionsMixin):
    name: ClassVar[str] = "base"
    #: Where the round consults it for a waiting job that did not fit: "defragment" (before
    #: preemption) or "share" (after it).
    point: ClassVar[str] = "share"
    #: Jobs may share GPUs under it (an admission counting GPUs per VC cannot run with it).
    shares_gpus: ClassVar[bool] = False

    def new_round(self) -> None:
        """A round begins (bounds on a round's work reset here)."""

    def begin_round(self, host: RoundHost, now: float, actions: list[Action]) -> None:
        """Act on the running jobs before the round walks the waiting ones (after `new_round`)."""

    def keeps_walking(self) -> bool:
        """May it still start a job when no GPU is free (so the round walks on)?"""
        return False

    def try_start(self, host: RoundHost, job: Job, now: float, actions: list[Action]) -> bool:
        """Start the waiting job its own way; True if it did."""
        return False

    def shares(self, job: Job) -> bool:
        """Does another job run on this job's GPUs?"""
        return False

    def frees_gpus(self, victim: Job, chosen: dict[str, Job]) -> bool:
        """Would preempting the victim free its GPUs (see Packing)?"""
        return True

    def partner_release(self, job: Job, now: float) -> tuple[Job, float] | None:
        """The job stops: the job that keeps running on its GPUs, at its speed alone, if any."""
        return None

    def restore_shared(self, host: RoundHost, job: Job, holder: Job, now: float) -> None:
        """After a shell's restart, `job` was found running on the GPUs of `holder` (both already
        running in the scheduler, the GPUs held once): take them back as sharing, speeds set.
        Asked only of a stage that `shares_gpus`, and only while `holder` shares with no one."""
        raise NotImplementedError(f"stage {self.name} does not let jobs share GPUs")

    def counters(self) -> dict[str, int]:
        return {}
