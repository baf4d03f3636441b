"""Admission by GPU counts: quota (YARN's capacity scheduler, as Philly ran it) and fair share.

`quota`: a VC is a GPU count. Its jobs may start while the VC uses no more than its quota. With
`oversubscribe`, a job may also start beyond it on idle GPUs: it runs *borrowed*, and a VC that is
under its quota and has a waiting job takes GPUs back by preempting jobs of VCs that are over
theirs (lowest priority first). Without oversubscription, idle quota of one VC is never used by
another.

`fairshare`: weighted fair sharing among the VCs that have work (with one resource, GPUs, this is
what DRF reduces to): a VC's share is the cluster's GPUs split by weight among the VCs with running
or waiting jobs, recomputed as VCs come and go. Idle shares are always lent, and a VC below its
share reclaims GPUs from VCs above theirs.
"""

from __future__ import annotations

from corral.core.job import Job


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

    def on_start(self, job: Job) -> None:
        self.usage[job.spec.vc] += job.spec.gpus
        if self.usage[job.spec.vc] > self.share(job.spec.vc):
            job.extra["borrowed"] = True

    def on_stop(self, job: Job) -> None:
        self.usage[job.spec.vc] -= job.spec.gpus
        job.extra.pop("borrowed", None)

    def on_queue(self, job: Job, delta: int) -> None:
        self.waiting[job.spec.vc] += delta


class FairShareAdmission(QuotaAdmission):
    name = "fairshare"

    def __init__(self, weights: dict[str, float], total_gpus: int) -> None:
        super().__init__({vc: total_gpus for vc in weights}, oversubscribe=True)
        self.weights = dict(weights)
        self.total_gpus = total_gpus
        self._active: set[str] = set()  # VCs with running or waiting jobs
        self._active_weight = 0.0  # their summed weights

    def share(self, vc: str) -> float:
        weight = self.weights[vc]
        active = self._active_weight + (0.0 if vc in self._active else weight)
        return self.total_gpus * weight / active

    def on_start(self, job: Job) -> None:
        super().on_start(job)
        self._recount(job.spec.vc)

    def on_stop(self, job: Job) -> None:
        super().on_stop(job)
        self._recount(job.spec.vc)

    def on_queue(self, job: Job, delta: int) -> None:
        super().on_queue(job, delta)
        self._recount(job.spec.vc)

    def _recount(self, vc: str) -> None:
        active = self.usage[vc] > 0 or self.waiting[vc] > 0
        if active and vc not in self._active:
            self._active.add(vc)
            self._active_weight += self.weights[vc]
        elif not active and vc in self._active:
            self._active.discard(vc)
            self._active_weight -= self.weights[vc]
