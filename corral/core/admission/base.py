"""What an admission scheme is: the piece that decides how VCs share the cluster, and therefore
which scheduler the framework assembles from the policy and placement it built.

An admission scheme is a registry entry (`corral.core.admission.ADMISSIONS`) like a policy or a
placement: it declares `Options` and `build`s a `SchedulerCore` from an `Assembly`. It also
declares which round stages it supports (`stages`), so that a combination it cannot run is
refused when the configuration is read, in one line saying why (`unsupported`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from corral.core.cluster import Cluster
from corral.core.placement.base import Placement
from corral.core.plugin import OptionsMixin, Services
from corral.core.policy.base import Policy
from corral.core.protocol import Admission, SchedulerCore
from corral.core.retry import RetryRule
from corral.core.scheduler import Scheduler, StartHook, Victims
from corral.core.stages import Stage


@dataclass(slots=True)
class Assembly:
    """The parts the framework built, for an admission scheme to put together."""

    policy: Policy
    placement: Placement
    services: Services
    backfill: bool
    restore_s: float
    retry: RetryRule
    victims: Victims = "lowest"
    stages: list[Stage] = field(default_factory=list)
    on_start: StartHook | None = None
    #: The pre-run of jobs whose spec names none (corral.core.precheck); None: none.
    precheck_s: float | None = None

    def scheduler(
        self,
        cluster: Cluster | None = None,
        admission: Admission | None = None,
        *,
        policy: Policy | None = None,
    ) -> Scheduler:
        """A plain scheduler over `cluster` (the physical one by default) with these parts."""
        target = cluster if cluster is not None else self.services.cluster
        speed_for = self.services.speed_model_for
        return Scheduler(
            target,
            policy or self.policy,
            self.placement,
            backfill=self.backfill,
            speed_model=speed_for(target) if speed_for is not None else None,
            restore_s=self.restore_s,
            victims=self.victims,
            admission=admission,
            on_start=self.on_start,
            stages=self.stages,
            retry=self.retry,
            precheck_s=self.precheck_s,
        )


class AdmissionScheme(OptionsMixin):
    name: ClassVar[str] = "base"
    #: Round stages (and "cache") this scheme runs with, and for each other one why not. None:
    #: every one, a stage registered after corral's own too (`none` runs with any).
    stages: ClassVar[frozenset[str] | None] = None
    why_not: ClassVar[dict[str, str]] = {}

    @classmethod
    def build(cls, options: Any, parts: Assembly) -> SchedulerCore:
        raise NotImplementedError

    @classmethod
    def unsupported(cls, stage: str) -> str | None:
        """Why this scheme cannot run with a stage (packing, migration, cache), or None."""
        if cls.stages is None or stage in cls.stages:
            return None
        return f"admission {cls.name} does not run with {stage}: {cls.why_not.get(stage, 'unsupported')}"

    #: It runs jobs that take shares of GPUs, CPU or memory (under a placement that `shares`).
    shares: ClassVar[bool] = False

    @classmethod
    def unsupported_placement(cls, options: Any, placement: str) -> str | None:
        """Why this scheme cannot run with a placement, or None."""
        return None

    @classmethod
    def unsupported_sharing(cls, placement: str) -> str | None:
        """Why this scheme cannot run with a placement whose jobs share GPUs, or None."""
        if cls.shares:
            return None
        return (
            f"admission {cls.name} does not run with placement {placement}: it counts whole GPUs, "
            "and jobs under that placement may take shares of GPUs, CPU and memory"
        )
