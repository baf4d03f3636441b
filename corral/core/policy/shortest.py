"""Oracle baselines that know every job's length: SJF (non-preemptive) and SRTF (preemptive).

Lengths are ideal seconds of work (`JobSpec.duration_s`); a job without one sorts last.
"""

from __future__ import annotations

from typing import Any

from corral.core.job import Job, JobStatus
from corral.core.plugin import Services, needs
from corral.core.policy.base import Key, Policy, tie_break


class ShortestJobFirst(Policy):
    name = "sjf"
    summary = "shortest job first, by the job's declared length (an oracle baseline)"
    needs_lengths = True

    @classmethod
    def from_options(cls, options: Any, services: Services) -> Policy:
        needs(
            services.durations_known,
            f"policy {cls.name}",
            "every job's length (a trace with durations)",
        )
        return cls()

    def key(self, job: Job, now: float) -> Key:
        duration = job.spec.duration_s if job.spec.duration_s is not None else float("inf")
        return (duration, *tie_break(job))

    def describe_key(self, job: Job, now: float) -> str:
        return f"length {job.spec.duration_s:.0f}s" if job.spec.duration_s is not None else ""


class ShortestRemainingTimeFirst(ShortestJobFirst):
    """Preempts a running job when a waiting one has less work left.

    The key is the work left in ideal seconds, the same measure for running and waiting jobs, so
    a job that preempted another can never be preempted back by it in the same round. The sorted
    index of running jobs stores their projected finish instant instead (it stays put while they
    run); that orders them exactly by work left when they run at full speed, and closely otherwise.
    """

    name = "srtf"
    summary = "shortest remaining time first, preemptive (an oracle baseline)"
    preemptive = True
    stored_is_key = False

    def key(self, job: Job, now: float) -> Key:
        return (job.remaining_work_s(now), *tie_break(job))

    def stored_key(self, job: Job, now: float) -> Key:
        if job.status is JobStatus.RUNNING:
            return (now + job.remaining_wall_s(now), *tie_break(job))
        return self.key(job, now)

    def describe_key(self, job: Job, now: float) -> str:
        return f"remaining {job.remaining_work_s(now):.0f}s of work"
