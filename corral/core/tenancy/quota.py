"""Quota admission (YARN's capacity scheduler, as Philly ran it): a VC is a GPU count.

A VC's jobs may start while the VC uses no more than its quota. With `oversubscribe`, a job may
also start beyond it on idle GPUs: it runs *borrowed*, and a VC that is under its quota and has a
waiting job takes the GPUs back by preempting borrowed jobs of other VCs (lowest priority first).
Without oversubscription, idle quota of one VC is never used by another.
"""

from __future__ import annotations

from corral.core.job import Job


class QuotaAdmission:
    name = "quota"

    def __init__(self, quota_gpus: dict[str, int], oversubscribe: bool = False) -> None:
        self.quota = dict(quota_gpus)
        self.oversubscribe = oversubscribe
        self.usage: dict[str, int] = {vc: 0 for vc in self.quota}
        self.borrowed: dict[str, Job] = {}  # job id -> running job that holds borrowed GPUs

    def known(self, vc: str) -> bool:
        return vc in self.quota

    def capacity(self, vc: str) -> int:
        return self.quota[vc]

    def _fits_quota(self, job: Job) -> bool:
        return self.usage[job.spec.vc] + job.spec.gpus <= self.quota[job.spec.vc]

    def check(self, job: Job) -> str | None:
        """Why the job may not start now, or None."""
        if self._fits_quota(job) or self.oversubscribe:
            return None
        vc = job.spec.vc
        return (
            f"VC {vc} is at its quota: {self.usage[vc]} of {self.quota[vc]} GPUs in use, "
            f"{job.spec.gpus} more asked"
        )

    def may_preempt(self, victim: Job, job: Job) -> bool:
        """A job may preempt within its own VC, or take back GPUs another VC borrowed."""
        return victim.spec.vc == job.spec.vc or self.reclaimable(victim, job)

    def reclaimable(self, victim: Job, job: Job) -> bool:
        return (
            victim.id in self.borrowed and victim.spec.vc != job.spec.vc and self._fits_quota(job)
        )

    def can_reclaim(self, job: Job) -> bool:
        return bool(self.borrowed) and self._fits_quota(job)

    def on_start(self, job: Job) -> None:
        self.usage[job.spec.vc] += job.spec.gpus
        if self.usage[job.spec.vc] > self.quota[job.spec.vc]:
            self.borrowed[job.id] = job
            job.extra["borrowed"] = True

    def on_stop(self, job: Job) -> None:
        self.usage[job.spec.vc] -= job.spec.gpus
        if self.borrowed.pop(job.id, None) is not None:
            job.extra.pop("borrowed", None)
