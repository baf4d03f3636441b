"""Admission by GPU counts: quota (YARN's capacity scheduler, as Philly ran it) and fair share.

`quota`: a VC is a GPU count. Its jobs may start while the VC uses no more than its quota. With
`oversubscribe`, a job may also start beyond it on idle GPUs: it runs *borrowed*, and a VC that is
under its quota and has a waiting job takes GPUs back by preempting jobs of VCs that are over
theirs (lowest priority first). Without oversubscription, idle quota of one VC is never used by
another.

`fairshare` (corral.core.admission.fairshare) is the same mechanism with shares that follow the
VCs' weights, their work and their recent usage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from corral.core.admission.base import AdmissionScheme, Assembly
from corral.core.job import Job
from corral.core.options import option
from corral.core.protocol import SchedulerCore


@dataclass(frozen=True, slots=True)
class QuotaOptions:
    oversubscribe: bool = option(
        True, help="lend idle quota to other VCs' jobs, reclaimed by preemption when needed"
    )
    lend_last: bool = option(
        True, help="each round, place jobs within their quotas before lending idle GPUs"
    )


class QuotaAdmission:
    name = "quota"

    def __init__(
        self, quota_gpus: dict[str, int], oversubscribe: bool = False, lend_last: bool = False
    ) -> None:
        self.quota = dict(quota_gpus)
        self.oversubscribe = oversubscribe
        #: With oversubscription, each round first places only jobs within their VC's quota and
        #: lends idle GPUs after that: a borrower started in a round is never preempted by a
        #: job within its quota later in the same queue walk (which would undo the start).
        self.lend_last = lend_last and oversubscribe
        self.lending = True  # the scheduler turns it off for the first walk of a round
        self.usage: dict[str, int] = {vc: 0 for vc in self.quota}
        self.waiting: dict[str, int] = {vc: 0 for vc in self.quota}
        self.borrowed_starts = 0

    def known(self, vc: str) -> bool:
        return vc in self.quota

    def capacity(self, vc: str) -> int:
        """The most GPUs one job of the VC may ask for without oversubscription."""
        return self.quota[vc]

    def share(self, vc: str) -> float:
        """GPUs the VC is entitled to now."""
        return self.quota[vc]

    def _within_share(self, job: Job) -> bool:
        return self.usage[job.spec.vc] + job.spec.gpus <= self.share(job.spec.vc)

    def check(self, job: Job) -> str | None:
        """Why the job may not start now, or None."""
        if self._within_share(job):
            return None
        vc = job.spec.vc
        if self.oversubscribe:
            if self.lending:
                return None
            return f"VC {vc} is at its quota; idle GPUs are lent once jobs within quotas are placed"
        return (
            f"VC {vc} is at its quota: {self.usage[vc]} of {self.quota[vc]} GPUs in use, "
            f"{job.spec.gpus} more asked"
        )

    def may_preempt(self, victim: Job, job: Job) -> bool:
        """A job may preempt within its own VC, or take back GPUs of a VC over its share."""
        return victim.spec.vc == job.spec.vc or self.reclaimable(victim, job)

    def reclaimable(self, victim: Job, job: Job) -> bool:
        vc = victim.spec.vc
        return vc != job.spec.vc and self.usage[vc] > self.share(vc) and self._within_share(job)

    def someone_over_share(self) -> bool:
        return any(self.usage[vc] > self.share(vc) for vc in self.usage)

    def can_reclaim(self, job: Job) -> bool:
        return self._within_share(job) and any(
            self.usage[vc] > self.share(vc) for vc in self.usage if vc != job.spec.vc
        )

    def on_start(self, job: Job, now: float) -> None:
        self.usage[job.spec.vc] += job.spec.gpus
        job.borrowed = self.usage[job.spec.vc] > self.share(job.spec.vc)
        self.borrowed_starts += job.borrowed

    def on_stop(self, job: Job, now: float) -> None:
        self.usage[job.spec.vc] -= job.spec.gpus
        job.borrowed = False

    def on_queue(self, job: Job, delta: int) -> None:
        self.waiting[job.spec.vc] += delta

    def begin_round(self, now: float) -> None:
        """Quotas do not change with time."""

    def counters(self) -> dict[str, int]:
        return {"borrowed_starts": self.borrowed_starts}


_PACKING = "a packed pair shares GPUs that a quota would count twice"


class Quota(AdmissionScheme):
    name = "quota"
    summary = "each VC owns a GPU count (YARN-CS, as Philly ran it); idle quota is lent"
    Options: ClassVar[type[Any]] = QuotaOptions
    stages = frozenset({"migration", "cache"})
    why_not = {"packing": _PACKING}

    @classmethod
    def build(cls, options: Any, parts: Assembly) -> SchedulerCore:
        quota = parts.services.vc_quota_or_whole()
        admission = QuotaAdmission(
            quota, oversubscribe=options.oversubscribe, lend_last=options.lend_last
        )
        return parts.scheduler(admission=admission)
