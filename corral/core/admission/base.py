"""What an admission scheme is: the piece that decides how VCs share the cluster, and therefore
which scheduler the framework assembles from the policy and placement it built.

An admission scheme is a registry entry (`corral.core.admission.ADMISSIONS`) like a policy or a
placement: it declares `Options` and `build`s a `SchedulerCore` from an `Assembly`. It also
declares which round stages it supports (`stages`), so that a combination it cannot run is
refused when the configuration is read, in one line saying why (`unsupported`).

Most admissions only add verdicts in front of the plain scheduler (who may start, who may be
preempted): such an admission subclasses `Admission`, which is a scheme of its own, and
implements only the hooks it has an opinion on; every other hook has none. Admissions chain
(`admission: [hived, max-running-per-user]`): the first builds the scheduler, each later one adds
its verdicts to it (`Assembly.admissions`), and a job starts only if every one lets it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from corral.core.cluster import Cluster
from corral.core.placement.base import Placement
from corral.core.plugin import OptionsMixin, Services
from corral.core.policy.base import Policy
from corral.core.protocol import ADMISSION_HOOKS, SchedulerCore
from corral.core.protocol import Admission as AdmissionHooks
from corral.core.retry import RetryRule
from corral.core.scheduler import Scheduler, StartHook
from corral.core.stages import Stage

if TYPE_CHECKING:
    from corral.core.job import Job, JobSpec


@dataclass(slots=True)
class Assembly:
    """The parts the framework built, for an admission scheme to put together."""

    policy: Policy
    placement: Placement
    services: Services
    #: The backfill rule's name (corral.core.backfill).
    backfill: str | bool
    restore_s: float
    retry: RetryRule
    victims: str = "lowest"
    #: A running job is no victim until it has run this long since its last start.
    preempt_exempt_s: float = 0.0
    stages: list[Stage] = field(default_factory=list)
    on_start: StartHook | None = None
    #: The pre-run of jobs whose spec names none (corral.core.precheck); None: none.
    precheck_s: float | None = None
    #: The verdicts of the admissions chained after the one that builds (each scheduler it
    #: builds consults them, after its own).
    admissions: list[AdmissionHooks] = field(default_factory=list)

    def scheduler(
        self,
        cluster: Cluster | None = None,
        admission: AdmissionHooks | None = None,
        *,
        policy: Policy | None = None,
    ) -> Scheduler:
        """A plain scheduler over `cluster` (the physical one by default) with these parts,
        `admission` first in front of it, then the chained ones."""
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
            preempt_exempt_s=self.preempt_exempt_s,
            admission=[*([admission] if admission is not None else []), *self.admissions],
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
    #: It may come after another admission in a chain: it only adds verdicts (`admission`).
    follows: ClassVar[bool] = False
    #: Admissions may come after it in a chain (it passes `Assembly.admissions` on).
    leads: ClassVar[bool] = True
    #: It chooses who gives way, beyond the policy's order (so in-order victims cannot run).
    picks_victims: ClassVar[bool] = False
    #: It counts GPUs per job (so jobs that share GPUs cannot run with it).
    counts_gpus: ClassVar[bool] = False
    #: It runs with VCs under departments (the cluster config's `departments`, a VC's `parent`,
    #: `weight`, `limit`); the others refuse such a config.
    queues: ClassVar[bool] = False

    @classmethod
    def admission(cls, options: Any, services: Services) -> AdmissionHooks | None:
        """The verdicts it puts in front of the scheduler (None: none)."""
        return None

    @classmethod
    def build(cls, options: Any, parts: Assembly) -> SchedulerCore:
        """A plain scheduler with this scheme's verdicts first in front of it."""
        return parts.scheduler(admission=cls.admission(options, parts.services))

    @classmethod
    def unsupported(cls, stage: str) -> str | None:
        """Why this scheme cannot run with a stage (packing, migration, cache), or None."""
        if cls.stages is None or stage in cls.stages:
            return None
        return f"admission {cls.name} does not run with {stage}: {cls.why_not.get(stage, 'unsupported')}"

    #: It runs jobs that take shares of GPUs, CPU or memory (under a placement that `shares`).
    shares: ClassVar[bool] = False

    @classmethod
    def unsupported_stage_sharing(cls, stage: str) -> str | None:
        """Why this scheme cannot run with a stage under which jobs share GPUs, or None."""
        if not cls.counts_gpus:
            return None
        return (
            f"stages: {stage}: admission {cls.name} counts GPUs per job, and jobs under {stage} "
            "share GPUs"
        )

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


class Admission(AdmissionScheme):
    """An admission that only adds verdicts in front of the plain scheduler, with no opinion on
    anything it does not override: every job may start (`check`), any victim the policy chooses
    may be preempted (`may_preempt`), nothing is reclaimed, nothing is counted. It implements
    `corral.core.protocol.Admission` and is an admission scheme of its own: registered in
    `ADMISSIONS`, it is built by `from_options(options, services)` (default: the class called
    with no argument) and may follow another admission in a chain.

    Three class attributes declare what the scheduler must not take for granted with it; each
    is False unless it says otherwise: `volatile` (its verdicts change while the jobs do not),
    `picks_victims` (it restricts or adds victims) and `counts_gpus` (jobs sharing GPUs cannot
    run with it)."""

    name: ClassVar[str] = "admission"
    follows = True
    volatile: ClassVar[bool] = False
    #: The hooks this class overrides (set for each subclass): the only ones the scheduler asks.
    opinions: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.opinions = frozenset(
            hook for hook in ADMISSION_HOOKS if getattr(cls, hook) is not getattr(Admission, hook)
        )
        if "shares" not in cls.__dict__:  # jobs that share GPUs run unless it counts GPUs
            cls.shares = not cls.counts_gpus

    @classmethod
    def admission(cls, options: Any, services: Services) -> AdmissionHooks | None:
        built: AdmissionHooks = cls.from_options(options, services)
        return built

    # -- the hooks, each with no opinion ---------------------------------------------------

    def refusal(self, spec: JobSpec) -> str | None:
        return None

    def capacity(self, spec: JobSpec) -> int | None:
        return None

    def begin_round(self, now: float) -> None:
        return None

    def walks(self) -> Iterator[None]:
        return iter(())

    def check(self, job: Job) -> str | None:
        return None

    def queue(self, job: Job) -> str | None:
        return None

    def may_preempt(self, victim: Job, job: Job) -> bool:
        return True

    def reclaim(self, job: Job, running: Iterable[Job]) -> Iterator[Job]:
        return iter(())

    def can_reclaim(self, job: Job) -> bool:
        return False

    def someone_over_share(self) -> bool:
        return False

    def describe(self, job: Job) -> str | None:
        return None

    def on_start(self, job: Job, now: float) -> None:
        return None

    def on_stop(self, job: Job, now: float) -> None:
        return None

    def on_queue(self, job: Job, delta: int) -> None:
        return None

    def counters(self) -> dict[str, int]:
        return {}
