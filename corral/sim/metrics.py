"""Turn one SimResult into numbers: a JSON-safe summary of the run and one row per job.

Per-job metrics (counts, JCT, queueing) cover only the measured jobs when the run has a measured
subset (the warm-up and cool-down jobs of a trace window still load the cluster but are not
judged); makespan and utilisation always cover the whole run, since they describe the cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from corral.core.job import Job, JobStatus
from corral.sim.jobstats import JobStats
from corral.sim.result import SimResult, Timeline, TimelineTotals

if TYPE_CHECKING:
    import numpy as np

JOB_COLUMNS: tuple[str, ...] = (
    "job_id",
    "user",
    "vc",
    "gpus",
    "model",
    "submit_s",
    "first_start_s",
    "finish_s",
    "jct_s",
    "queue_s",
    "pending_s",
    "status",
    "attempts",
    "preemptions",
    "failures",
    "relaxed",
    "measured",
)


def measured_jobs(result: SimResult) -> list[Job]:
    """The jobs the per-job metrics cover, in submission order (of a streamed run: those still
    waiting or running at its end; the others were written out as they ended)."""
    if result.measured is None:
        return list(result.jobs)
    return [job for job in result.jobs if job.id in result.measured]


def job_stats(result: SimResult) -> JobStats:
    """The run's jobs as the summary reads them: gathered as they ended (a streamed run), or
    from the whole list."""
    if result.stats is not None:
        return result.stats
    return JobStats.of(result.jobs, result.measured)


def completion_times(result: SimResult) -> np.ndarray:
    """JCT in seconds (finish - submit) of every measured job that SUCCEEDED, in job order (of
    a streamed run: in the order they ended)."""
    import numpy as np

    return np.asarray(job_stats(result).jct_s, dtype=float)


def utilization(timeline: Timeline, total_gpus: int) -> float:
    """Time-weighted fraction of GPUs allocated between the first and last timeline points."""
    import numpy as np

    if isinstance(timeline, TimelineTotals):
        span = timeline.time_s[-1] - timeline.time_s[0] if len(timeline.time_s) > 1 else 0.0
        if span <= 0.0 or total_gpus <= 0:
            return 0.0
        return timeline.allocated_gpu_s / (total_gpus * span)
    if len(timeline.time_s) < 2 or total_gpus <= 0:
        return 0.0
    time_s = np.asarray(timeline.time_s, dtype=float)
    span = float(time_s[-1] - time_s[0])
    if span <= 0.0:
        return 0.0
    # Step function: allocated[i] holds on [t[i], t[i+1]); the last sample only closes the span.
    allocated = np.asarray(timeline.allocated_gpus, dtype=float)[:-1]
    gpu_seconds = float(np.dot(allocated, np.diff(time_s)))
    return gpu_seconds / (total_gpus * span)


def utilization_while_waiting(timeline: Timeline, total_gpus: int) -> float | None:
    """Time-weighted fraction of GPUs allocated while at least one job was waiting: 1.0 means
    no GPU ever stood idle while a job waited. None if no job ever waited.

    Unlike `utilization`, it does not depend on how long the run's tail is (a makespan set by one
    long job that ran alone at the end), only on whether GPUs were left idle when there was work.
    """
    import numpy as np

    if len(timeline.time_s) < 2 or total_gpus <= 0:
        return None
    if isinstance(timeline, TimelineTotals):
        if timeline.waiting_s <= 0.0:
            return None
        return timeline.allocated_waiting_gpu_s / (total_gpus * timeline.waiting_s)
    dt = np.diff(np.asarray(timeline.time_s, dtype=float))
    waiting = np.asarray(timeline.pending_jobs, dtype=float)[:-1] > 0
    span = float(dt[waiting].sum())
    if span <= 0.0:
        return None
    allocated = np.asarray(timeline.allocated_gpus, dtype=float)[:-1]
    return float(np.dot(allocated[waiting], dt[waiting])) / (total_gpus * span)


def useful_utilization(result: SimResult, stats: JobStats | None = None) -> float:
    """Like utilization, but counting only the work jobs got done (GPUs x ideal seconds), not GPU
    time lost to slow spread placements, restores or failed attempts."""
    time_s = result.timeline.time_s
    span = (time_s[-1] - time_s[0]) if len(time_s) > 1 else 0.0
    if span <= 0.0 or result.total_gpus <= 0:
        return 0.0
    work = (stats or job_stats(result)).work_gpu_s
    return float(work / (result.total_gpus * span))


def fragmentation(timeline: Timeline, total_gpus: int) -> float | None:
    """Time-weighted share of free GPUs that cannot host a job needing a whole node (the largest
    node size): free GPUs outside wholly free nodes over all free GPUs. None if nothing was free."""
    import numpy as np

    if len(timeline.time_s) < 2 or len(timeline.stranded_gpus) != len(timeline.time_s):
        return None
    if isinstance(timeline, TimelineTotals):
        if timeline.free_gpu_s <= 0.0:
            return None
        return timeline.stranded_gpu_s / timeline.free_gpu_s
    dt = np.diff(np.asarray(timeline.time_s, dtype=float))
    free = total_gpus - np.asarray(timeline.allocated_gpus, dtype=float)[:-1]
    stranded = np.asarray(timeline.stranded_gpus, dtype=float)[:-1]
    free_gpu_seconds = float(np.dot(free, dt))
    if free_gpu_seconds <= 0.0:
        return None
    return float(np.dot(stranded, dt)) / free_gpu_seconds


def per_vc(result: SimResult, stats: JobStats | None = None) -> dict[str, dict[str, object]]:
    """Per tenant: jobs done, queueing (all jobs and multi-GPU ones), JCT, share of the GPU time
    used, and preemptions its jobs suffered."""
    import numpy as np

    stats = stats or job_stats(result)
    used = stats.attained_gpu_s or 1.0
    out: dict[str, dict[str, object]] = {}
    for name in sorted(stats.vcs):
        vc = stats.vcs[name]
        out[name] = {
            "jobs": vc.succeeded,
            "avg_queue_s": _mean(vc.queue_s),
            "p95_queue_s": float(np.percentile(vc.queue_s, 95)) if vc.queue_s else None,
            "multi_gpu_avg_queue_s": _mean(vc.multi_gpu_queue_s),
            "avg_jct_s": _mean(vc.jct_s),
            "gpu_share": vc.gpu_s / used,
            "preemptions_suffered": vc.preemptions,
        }
    return out


def deadlines(stats: JobStats) -> dict[str, object]:
    """For jobs with a deadline (ElasticFlow's comparison): the share that succeeded by it, over
    all such jobs submitted (refused ones count as missed), and how many were admitted (not
    refused). Empty when no job has a deadline."""
    if not stats.deadline_jobs:
        return {}
    return {
        "deadline_met_share": stats.deadlines_met / stats.deadline_jobs,
        "deadlines_met": stats.deadlines_met,
        "deadline_jobs": stats.deadline_jobs,
        "admitted": stats.deadline_jobs - stats.deadlines_refused,
        "refused": stats.deadlines_refused,
    }


def _mean(values: Sequence[float]) -> float | None:
    import numpy as np

    return float(np.mean(values)) if values else None


def summarize(result: SimResult) -> dict[str, object]:
    """One JSON-safe object describing the run; None marks a metric with no data to define it."""
    import numpy as np

    stats = job_stats(result)
    jct = np.asarray(stats.jct_s, dtype=float)
    avg_jct: float | None = None
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    if jct.size:
        avg_jct = float(jct.mean())
        p50, p95, p99 = (float(v) for v in np.percentile(jct, [50, 95, 99]))
    makespan: float | None = None
    if stats.last_finish_s is not None:
        makespan = float(stats.last_finish_s - stats.first_submit_s)

    return {
        "policy": result.policy,
        "placement": result.placement,
        "cluster": result.cluster,
        "total_gpus": int(result.total_gpus),
        "measured_jobs": stats.measured,
        "jobs": stats.succeeded,
        "failed": stats.failed,
        "cancelled": stats.cancelled,
        "unfinished": stats.unfinished,
        "avg_jct_s": avg_jct,
        "p50_jct_s": p50,
        "p95_jct_s": p95,
        "p99_jct_s": p99,
        "avg_queue_s": _mean(stats.queue_s),
        "avg_pending_s": _mean(stats.pending_s),
        "makespan_s": makespan,
        "utilization": utilization(result.timeline, result.total_gpus),
        "useful_utilization": useful_utilization(result, stats),
        # GPU time every attempt of every job held (failed, preempted and pre-run ones too).
        "gpu_hours": stats.attained_gpu_s / 3600.0,
        "utilization_while_waiting": utilization_while_waiting(result.timeline, result.total_gpus),
        "preemptions": int(result.preemptions),
        "relaxed_jobs": stats.relaxed,
        "fragmentation": fragmentation(result.timeline, result.total_gpus),
        **deadlines(stats),
        "per_vc": per_vc(result, stats),
        "rounds": int(result.rounds),
        "wall_s": float(result.wall_s),
        "options": dict(result.options),
        **result.annotations,
    }


def job_rows(result: SimResult) -> list[dict[str, object]]:
    """One row per submitted job (measured or not), keyed by JOB_COLUMNS; None = no value."""
    measured = result.measured
    return [job_row(job, measured is None or job.id in measured) for job in result.jobs]


def job_row(job: Job, measured: bool) -> dict[str, object]:
    """The job's row of jobs-POLICY-PLACEMENT.csv, keyed by JOB_COLUMNS; None = no value."""
    return dict(zip(JOB_COLUMNS, job_values(job, measured), strict=True))


def job_values(job: Job, measured: bool) -> tuple[object, ...]:
    """`job_row`'s values in the order of JOB_COLUMNS, as `csv.writer` writes a row (None: an
    empty cell): what the jobs CSV is written from, without a dict per job."""
    spec = job.spec
    submitted = spec.submit_time
    started = job.first_started_at
    finished = job.finished_at
    status = job.status
    return (
        spec.id,
        spec.user,
        spec.vc,
        spec.gpus,
        spec.model,
        submitted,
        started,
        finished,
        # JCT only for successes, so that averaging this column gives summary's avg_jct_s.
        finished - submitted if status is JobStatus.SUCCEEDED and finished is not None else None,
        started - submitted if started is not None else None,
        job.pending_s,
        status.value,
        job.attempts,
        job.preemptions,
        job.failures,
        job.relaxed,
        measured,
    )
