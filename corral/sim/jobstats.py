"""What a run's summary needs from its jobs, gathered one job at a time.

`corral.sim.metrics.summarize` reads a run's jobs through a `JobStats`: built from the whole
list after the run, or filled as each job ends when the run is streamed (`corral simulate
--stream`), which then keeps no job once it is written out. Either way the numbers are the same
(up to the order of floating-point sums: a streamed run adds jobs in the order they end).

Memory: counters and sums, plus one float per measured job for each distribution whose
percentiles or mean the summary reports (JCT, queueing, pending time, and queueing per VC):
about 40 bytes per job, 40 MB for a million jobs, against a few kilobytes for a `Job`.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field

from corral.core.job import Job, JobStatus, Priority


def vc_of(job: Job) -> str:
    """The tenant a job's metrics are reported under; opportunistic jobs form their own group."""
    return "opportunistic" if job.spec.priority is Priority.OPPORTUNISTIC else job.spec.vc


@dataclass(slots=True)
class VcStats:
    """One tenant's measured jobs."""

    succeeded: int = 0
    queue_s: array[float] = field(default_factory=lambda: array("d"))
    multi_gpu_queue_s: array[float] = field(default_factory=lambda: array("d"))
    jct_s: array[float] = field(default_factory=lambda: array("d"))
    gpu_s: float = 0.0
    preemptions: int = 0


@dataclass(slots=True)
class JobStats:
    """Counts, sums and distributions of a run's jobs (`add` each job once, final)."""

    #: Of the measured jobs (all jobs unless the run measures a window).
    measured: int = 0
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    unfinished: int = 0
    relaxed: int = 0
    jct_s: array[float] = field(default_factory=lambda: array("d"))  # of the jobs that succeeded
    queue_s: array[float] = field(default_factory=lambda: array("d"))  # of the jobs that started
    pending_s: array[float] = field(default_factory=lambda: array("d"))
    deadline_jobs: int = 0
    deadlines_met: int = 0
    deadlines_refused: int = 0
    vcs: dict[str, VcStats] = field(default_factory=dict)
    #: Of every job, measured or not.
    jobs: int = 0
    first_submit_s: float = math.inf
    last_finish_s: float | None = None
    attained_gpu_s: float = 0.0
    work_gpu_s: float = 0.0  # GPUs x ideal seconds of work done

    @classmethod
    def of(cls, jobs: list[Job], measured: set[str] | None) -> JobStats:
        stats = cls()
        for job in jobs:
            stats.add(job, measured is None or job.id in measured)
        return stats

    def add(self, job: Job, measured: bool) -> None:
        spec = job.spec
        self.jobs += 1
        self.first_submit_s = min(self.first_submit_s, spec.submit_time)
        if job.finished_at is not None:
            last = self.last_finish_s
            self.last_finish_s = job.finished_at if last is None else max(last, job.finished_at)
        self.attained_gpu_s += job.attained_gpu_s
        self.work_gpu_s += spec.gpus * job.work_done_s
        if not measured:
            return
        status = job.status
        self.measured += 1
        self.succeeded += status is JobStatus.SUCCEEDED
        self.failed += status is JobStatus.FAILED
        self.cancelled += status is JobStatus.CANCELLED
        self.unfinished += not status.finished
        self.relaxed += job.relaxed
        self.pending_s.append(job.pending_s)
        vc = self.vcs.get(vc_of(job))
        if vc is None:
            vc = self.vcs[vc_of(job)] = VcStats()
        vc.gpu_s += job.attained_gpu_s
        vc.preemptions += job.preemptions
        if job.first_started_at is not None:
            queued = job.first_started_at - spec.submit_time
            self.queue_s.append(queued)
            vc.queue_s.append(queued)
            if spec.gpus > 1:
                vc.multi_gpu_queue_s.append(queued)
        succeeded = status is JobStatus.SUCCEEDED and job.finished_at is not None
        if succeeded:
            assert job.finished_at is not None
            jct = job.finished_at - spec.submit_time
            self.jct_s.append(jct)
            vc.jct_s.append(jct)
        vc.succeeded += status is JobStatus.SUCCEEDED
        if spec.deadline is not None:
            self.deadline_jobs += 1
            self.deadlines_met += succeeded and job.finished_at <= spec.deadline + 1e-6  # type: ignore[operator]
            self.deadlines_refused += status is JobStatus.REFUSED
