"""Turn one SimResult into numbers: a JSON-safe summary of the run and one row per job.

Per-job metrics (counts, JCT, queueing) cover only the measured jobs when the run has a measured
subset (the warm-up and cool-down jobs of a trace window still load the cluster but are not
judged); makespan and utilisation always cover the whole run, since they describe the cluster.
"""

from __future__ import annotations

import numpy as np

from corral.core.job import Job, JobStatus, Priority
from corral.sim.result import SimResult, Timeline, TimelineTotals

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
    """The jobs the per-job metrics cover, in submission order."""
    if result.measured is None:
        return list(result.jobs)
    return [job for job in result.jobs if job.id in result.measured]


def completion_times(result: SimResult) -> np.ndarray:
    """JCT in seconds (finish - submit) of every measured job that SUCCEEDED, in job order."""
    return np.array(
        [
            job.finished_at - job.spec.submit_time
            for job in measured_jobs(result)
            if job.status is JobStatus.SUCCEEDED and job.finished_at is not None
        ],
        dtype=float,
    )


def utilization(timeline: Timeline, total_gpus: int) -> float:
    """Time-weighted fraction of GPUs allocated between the first and last timeline points."""
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


def useful_utilization(result: SimResult) -> float:
    """Like utilization, but counting only the work jobs got done (GPUs x ideal seconds), not GPU
    time lost to slow spread placements, restores or failed attempts."""
    time_s = result.timeline.time_s
    span = (time_s[-1] - time_s[0]) if len(time_s) > 1 else 0.0
    if span <= 0.0 or result.total_gpus <= 0:
        return 0.0
    work = sum(job.spec.gpus * job.work_done_s for job in result.jobs)
    return float(work / (result.total_gpus * span))


def fragmentation(timeline: Timeline, total_gpus: int) -> float | None:
    """Time-weighted share of free GPUs that cannot host a job needing a whole node (the largest
    node size): free GPUs outside wholly free nodes over all free GPUs. None if nothing was free."""
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


def vc_of(job: Job) -> str:
    """The tenant a job's metrics are reported under; opportunistic jobs form their own group."""
    return "opportunistic" if job.spec.priority is Priority.OPPORTUNISTIC else job.spec.vc


def per_vc(result: SimResult) -> dict[str, dict[str, object]]:
    """Per tenant: jobs done, queueing (all jobs and multi-GPU ones), JCT, share of the GPU time
    used, and preemptions its jobs suffered."""
    groups: dict[str, list[Job]] = {}
    for job in measured_jobs(result):
        groups.setdefault(vc_of(job), []).append(job)
    used = sum(job.attained_gpu_s for job in result.jobs) or 1.0
    out: dict[str, dict[str, object]] = {}
    for name in sorted(groups):
        jobs = groups[name]
        queue = [
            j.first_started_at - j.spec.submit_time for j in jobs if j.first_started_at is not None
        ]
        multi = [
            j.first_started_at - j.spec.submit_time
            for j in jobs
            if j.first_started_at is not None and j.spec.gpus > 1
        ]
        jct = [
            j.finished_at - j.spec.submit_time
            for j in jobs
            if j.status is JobStatus.SUCCEEDED and j.finished_at is not None
        ]
        out[name] = {
            "jobs": sum(j.status is JobStatus.SUCCEEDED for j in jobs),
            "avg_queue_s": _mean(queue),
            "p95_queue_s": float(np.percentile(queue, 95)) if queue else None,
            "multi_gpu_avg_queue_s": _mean(multi),
            "avg_jct_s": _mean(jct),
            "gpu_share": sum(j.attained_gpu_s for j in jobs) / used,
            "preemptions_suffered": sum(j.preemptions for j in jobs),
        }
    return out


def deadlines(jobs: list[Job]) -> dict[str, object]:
    """For jobs with a deadline (ElasticFlow's comparison): the share that succeeded by it, over
    all such jobs submitted (refused ones count as missed), and how many were admitted (not
    refused). Empty when no job has a deadline."""
    timed = [job for job in jobs if job.spec.deadline is not None]
    if not timed:
        return {}
    met = sum(
        bool(
            job.status is JobStatus.SUCCEEDED
            and job.finished_at is not None
            and job.finished_at <= job.spec.deadline + 1e-6  # type: ignore[operator]
        )
        for job in timed
    )
    return {
        "deadline_met_share": met / len(timed),
        "deadlines_met": met,
        "deadline_jobs": len(timed),
        "admitted": sum(job.status is not JobStatus.REFUSED for job in timed),
        "refused": sum(job.status is JobStatus.REFUSED for job in timed),
    }


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def summarize(result: SimResult) -> dict[str, object]:
    """One JSON-safe object describing the run; None marks a metric with no data to define it."""
    jobs = measured_jobs(result)
    jct = completion_times(result)
    avg_jct: float | None = None
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    if jct.size:
        avg_jct = float(jct.mean())
        p50, p95, p99 = (float(v) for v in np.percentile(jct, [50, 95, 99]))

    queue_s = [
        job.first_started_at - job.spec.submit_time
        for job in jobs
        if job.first_started_at is not None
    ]
    finished_at = [job.finished_at for job in result.jobs if job.finished_at is not None]
    makespan: float | None = None
    if finished_at and result.jobs:
        first_submit = min(job.spec.submit_time for job in result.jobs)
        makespan = float(max(finished_at) - first_submit)

    return {
        "policy": result.policy,
        "placement": result.placement,
        "cluster": result.cluster,
        "total_gpus": int(result.total_gpus),
        "measured_jobs": len(jobs),
        "jobs": sum(job.status is JobStatus.SUCCEEDED for job in jobs),
        "failed": sum(job.status is JobStatus.FAILED for job in jobs),
        "cancelled": sum(job.status is JobStatus.CANCELLED for job in jobs),
        "unfinished": sum(not job.status.finished for job in jobs),
        "avg_jct_s": avg_jct,
        "p50_jct_s": p50,
        "p95_jct_s": p95,
        "p99_jct_s": p99,
        "avg_queue_s": _mean(queue_s),
        "avg_pending_s": _mean([job.pending_s for job in jobs]),
        "makespan_s": makespan,
        "utilization": utilization(result.timeline, result.total_gpus),
        "useful_utilization": useful_utilization(result),
        # GPU time every attempt of every job held (failed, preempted and pre-run ones too).
        "gpu_hours": sum(job.attained_gpu_s for job in result.jobs) / 3600.0,
        "utilization_while_waiting": utilization_while_waiting(result.timeline, result.total_gpus),
        "preemptions": int(result.preemptions),
        "relaxed_jobs": sum(job.relaxed for job in jobs),
        "fragmentation": fragmentation(result.timeline, result.total_gpus),
        **deadlines(jobs),
        "per_vc": per_vc(result),
        "rounds": int(result.rounds),
        "wall_s": float(result.wall_s),
        "options": dict(result.options),
        **result.annotations,
    }


def job_rows(result: SimResult) -> list[dict[str, object]]:
    """One row per submitted job (measured or not), keyed by JOB_COLUMNS; None = no value."""
    rows: list[dict[str, object]] = []
    for job in result.jobs:
        spec = job.spec
        jct_s = None
        if job.status is JobStatus.SUCCEEDED and job.finished_at is not None:
            jct_s = job.finished_at - spec.submit_time
        rows.append(
            {
                "job_id": spec.id,
                "user": spec.user,
                "vc": spec.vc,
                "gpus": spec.gpus,
                "model": spec.model,
                "submit_s": spec.submit_time,
                "first_start_s": job.first_started_at,
                "finish_s": job.finished_at,
                # JCT only for successes, so that averaging this column gives summary's avg_jct_s.
                "jct_s": jct_s,
                "queue_s": (
                    job.first_started_at - spec.submit_time
                    if job.first_started_at is not None
                    else None
                ),
                "pending_s": job.pending_s,
                "status": job.status.value,
                "attempts": job.attempts,
                "preemptions": job.preemptions,
                "failures": job.failures,
                "relaxed": job.relaxed,
                "measured": result.measured is None or spec.id in result.measured,
            }
        )
    return rows
