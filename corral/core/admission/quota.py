"""Admission by GPU counts: quota (YARN's capacity scheduler, as Philly ran it) and fair share.

`quota`: a VC is a GPU count. Its guaranteed jobs may start while the VC uses no more than its
quota. With `oversubscribe`, a job may also start beyond it on idle GPUs: it runs *borrowed*, and
a VC that is under its quota and has a waiting job takes GPUs back by preempting jobs of VCs that
are over theirs (lowest priority first). Without oversubscription, idle quota of one VC is never
used by another VC's guaranteed jobs.

Opportunistic jobs (`priority: opportunistic`: HiveD's priority -1, OpenPAI's low-priority jobs)
never count against their VC's quota and are never within it. They start only on GPUs idle at
that moment, run borrowed, and are always reclaimable: any guaranteed job, of any VC (their own
too) and whether or not within its quota, may preempt them, and they are taken before any
guaranteed borrower is. They never preempt anything. A VC's opportunistic jobs wait in a queue of
their own, in the policy's order, so a blocking policy's opportunistic head blocks only them and
never the VC's guaranteed jobs (nor does a guaranteed head block them).

Without `oversubscribe` opportunistic jobs still run on idle GPUs. What the option turns off is
lending one VC's idle quota to another VC's guaranteed jobs, which then hold GPUs the lender can
only get back by preemption; an opportunistic job takes nothing from any guarantee (every
guaranteed job may preempt it, in the round it needs the GPUs), and harvesting idle GPUs is its
whole point, so refusing it would only leave them idle. For the same reason an opportunistic job
may ask for more GPUs than its VC's quota (submission refuses only what the cluster cannot hold).

With `lend_last` each round walks its queue up to three times: jobs within their quotas, then
guaranteed borrowers, then opportunistic jobs, each walk in the policy's order, so an
opportunistic job gets only what every guaranteed job of the round left idle and is never started
only to be preempted later in the same round (the second and third walks only when there is
anything to lend, or an opportunistic job waiting). Without it (`--no-quota-lend-last`) borrowers
and opportunistic jobs are placed in the queue's order with the rest.

`fairshare` (corral.core.admission.fairshare) is the same mechanism with shares that follow the
VCs' weights, their work and their recent usage.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

from corral.core.admission.base import Admission, AdmissionScheme
from corral.core.admission.quota_options import QuotaOptions as QuotaOptions
from corral.core.job import Job, JobSpec, Priority
from corral.core.plugin import Services
from corral.core.protocol import Admission as AdmissionHooks

OPPORTUNISTIC = Priority.OPPORTUNISTIC


class QuotaAdmission(Admission):
    name = "quota"
    #: Shares may follow time (fairshare), and who may be reclaimed follows who runs where.
    volatile = True
    picks_victims = True
    counts_gpus = True

    def __init__(
        self,
        quota_gpus: dict[str, int],
        oversubscribe: bool = False,
        lend_last: bool = False,
        *,
        opportunistic_last: bool | None = None,
    ) -> None:
        self.quota = dict(quota_gpus)
        self.oversubscribe = oversubscribe
        #: With oversubscription, each round first places only jobs within their VC's quota and
        #: lends idle GPUs after that: a borrower started in a round is never preempted by a
        #: job within its quota later in the same queue walk (which would undo the start).
        self.lend_last = lend_last and oversubscribe
        #: Each round places opportunistic jobs after every guaranteed job (by default with
        #: `lend_last`, whether or not guaranteed jobs may borrow).
        self.opportunistic_last = lend_last if opportunistic_last is None else opportunistic_last
        #: What `check` admits in the current walk of the round (`walks` narrows them).
        self.lending = True
        self.admit_opportunistic = True
        #: Guaranteed jobs' GPUs running, and guaranteed jobs waiting, per VC.
        self.usage: dict[str, int] = {vc: 0 for vc in self.quota}
        self.waiting: dict[str, int] = {vc: 0 for vc in self.quota}
        #: Opportunistic jobs' GPUs running, and opportunistic jobs waiting (all VCs).
        self.opportunistic_gpus = 0
        self.opportunistic_waiting = 0
        self.borrowed_starts = 0
        self.opportunistic_starts = 0

    def refusal(self, spec: JobSpec) -> str | None:
        return None if spec.vc in self.quota else f"unknown VC {spec.vc!r}"

    def capacity(self, spec: JobSpec) -> int | None:
        """The most GPUs the job may ask for: without oversubscription its VC's quota for a
        guaranteed job; else, and for an opportunistic one (which only uses idle GPUs), the
        cluster's (None)."""
        if self.oversubscribe or spec.priority is OPPORTUNISTIC:
            return None
        return self.quota[spec.vc]

    def share(self, vc: str) -> float:
        """GPUs the VC is entitled to now."""
        return self.quota[vc]

    def _within_share(self, job: Job) -> bool:
        if job.spec.priority is OPPORTUNISTIC:
            return False
        return self.usage[job.spec.vc] + job.spec.gpus <= self.share(job.spec.vc)

    def walks(self) -> Iterator[None]:
        """Before the round's last walk (which admits everything): within quotas only, with
        `lend_last`; then guaranteed jobs only, when opportunistic jobs go last and some wait."""
        try:
            if self.lend_last:
                self.lending, self.admit_opportunistic = False, False
                yield
            if self.opportunistic_last and self.opportunistic_waiting:
                self.lending, self.admit_opportunistic = True, False
                yield
        finally:
            self.lending, self.admit_opportunistic = True, True

    def check(self, job: Job) -> str | None:
        """Why the job may not start now, or None."""
        vc = job.spec.vc
        if job.spec.priority is OPPORTUNISTIC:
            if self.admit_opportunistic:
                return None
            return (
                "opportunistic: runs only on GPUs idle once the round's guaranteed jobs are placed"
            )
        if self._within_share(job):
            return None
        if self.oversubscribe:
            if self.lending:
                return None
            return f"VC {vc} is at its quota; idle GPUs are lent once jobs within quotas are placed"
        return (
            f"VC {vc} is at its quota: {self.usage[vc]} of {self.quota[vc]} GPUs in use, "
            f"{job.spec.gpus} more asked"
        )

    def queue(self, job: Job) -> str:
        """Each VC's guaranteed jobs form a queue, and its opportunistic jobs another."""
        if job.spec.priority is OPPORTUNISTIC:
            return f"the opportunistic queue of VC {job.spec.vc}"
        return f"VC {job.spec.vc}"

    def describe(self, job: Job) -> str | None:
        if job.spec.priority is OPPORTUNISTIC:
            return (
                "opportunistic: runs only on idle GPUs, never counts against VC "
                f"{job.spec.vc}'s quota, never preempts, and any guaranteed job may preempt it"
            )
        return None

    def may_preempt(self, victim: Job, job: Job) -> bool:
        """A guaranteed job may preempt within its own VC, take back GPUs of a VC over its share,
        and preempt any opportunistic job; an opportunistic job preempts nothing."""
        if job.spec.priority is OPPORTUNISTIC:
            return False
        return victim.spec.vc == job.spec.vc or self.reclaimable(victim, job)

    def reclaimable(self, victim: Job, job: Job) -> bool:
        """The job may take the victim's GPUs whatever their priorities: the victim is
        opportunistic (and the job is not), or the job is within its share and the victim is of
        another VC over its share."""
        if job.spec.priority is OPPORTUNISTIC:
            return False
        if victim.spec.priority is OPPORTUNISTIC:
            return True
        vc = victim.spec.vc
        return vc != job.spec.vc and self.usage[vc] > self.share(vc) and self._within_share(job)

    def reclaim(self, job: Job, running: Iterable[Job]) -> Iterator[Job]:
        """The reclaimable running jobs, opportunistic ones first, each kind lowest priority
        first (as `running` comes)."""
        if job.spec.priority is OPPORTUNISTIC:
            return
        if not self.opportunistic_gpus:
            yield from (victim for victim in running if self.reclaimable(victim, job))
            return
        borrowers: list[Job] = []
        for victim in running:
            if victim.spec.priority is OPPORTUNISTIC:
                yield victim
            elif self.reclaimable(victim, job):
                borrowers.append(victim)
        yield from borrowers

    def someone_over_share(self) -> bool:
        """Some running job may be reclaimed: an opportunistic one, or one of a VC over its share."""
        return self.opportunistic_gpus > 0 or any(
            self.usage[vc] > self.share(vc) for vc in self.usage
        )

    def can_reclaim(self, job: Job) -> bool:
        if job.spec.priority is OPPORTUNISTIC:
            return False
        return self.opportunistic_gpus > 0 or (
            self._within_share(job)
            and any(self.usage[vc] > self.share(vc) for vc in self.usage if vc != job.spec.vc)
        )

    def on_start(self, job: Job, now: float) -> None:
        if job.spec.priority is OPPORTUNISTIC:
            self.opportunistic_gpus += job.spec.gpus
            self.opportunistic_starts += 1
            job.borrowed = True
            return
        self.usage[job.spec.vc] += job.spec.gpus
        job.borrowed = self.usage[job.spec.vc] > self.share(job.spec.vc)
        self.borrowed_starts += job.borrowed

    def on_stop(self, job: Job, now: float) -> None:
        if job.spec.priority is OPPORTUNISTIC:
            self.opportunistic_gpus -= job.spec.gpus
        else:
            self.usage[job.spec.vc] -= job.spec.gpus
        job.borrowed = False

    def on_queue(self, job: Job, delta: int) -> None:
        if job.spec.priority is OPPORTUNISTIC:
            self.opportunistic_waiting += delta
        else:
            self.waiting[job.spec.vc] += delta

    def counters(self) -> dict[str, int]:
        return {
            "borrowed_starts": self.borrowed_starts,
            "opportunistic_starts": self.opportunistic_starts,
        }


_PACKING = "a packed pair shares GPUs that a quota would count twice"


class Quota(AdmissionScheme):
    name = "quota"
    summary = "each VC owns a GPU count (YARN-CS, as Philly ran it); idle quota is lent"
    Options: ClassVar[type[Any]] = QuotaOptions
    stages = frozenset({"migration", "cache"})
    why_not = {"packing": _PACKING}
    picks_victims = True
    counts_gpus = True

    @classmethod
    def admission(cls, options: Any, services: Services) -> AdmissionHooks | None:
        return QuotaAdmission(
            services.vc_quota_or_whole(),
            oversubscribe=options.oversubscribe,
            lend_last=options.lend_last,
        )
