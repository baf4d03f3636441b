"""Small builders for hand-worked scheduling scenarios."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from corral.core import Cluster, JobSpec, Scheduler, Start
from corral.core.placement import make_placement
from corral.core.policy import make_policy


def spec(
    job_id: str, gpus: int, submit: float = 0.0, duration: float | None = 1000.0, **kw: object
) -> JobSpec:
    return JobSpec(id=job_id, submit_time=submit, gpus=gpus, duration_s=duration, **kw)  # type: ignore[arg-type]


def scheduler(
    nodes: int,
    gpus: int,
    policy: str = "fifo",
    placement: str = "consolidate",
    racks: int = 1,
    policy_options: dict | None = None,
    placement_options: dict | None = None,
    **kw: object,
) -> Scheduler:
    cluster = Cluster.shorthand(nodes, gpus, racks=racks)
    return Scheduler(
        cluster,
        make_policy(policy, **(policy_options or {})),
        make_placement(placement, **(placement_options or {})),
        **kw,  # type: ignore[arg-type]
    )


def started(decision_actions: list) -> dict[str, tuple[int, ...]]:
    return {a.job_id: a.gpus for a in decision_actions if isinstance(a, Start)}


def random_trace(seed: int, count: int, gap_s: float = 30.0) -> list[JobSpec]:
    """Jobs of 1 to 8 GPUs arriving every `gap_s` on average, with heavy-tailed lengths (median
    2.5 min): an offered load of about 40 GPUs at the default gap, an overload for a small cluster."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(gap_s, count))
    return [
        JobSpec(
            id=f"j{i}",
            submit_time=float(arrivals[i]),
            gpus=int(rng.choice([1, 1, 1, 2, 2, 4, 8])),
            duration_s=float(rng.lognormal(5.0, 1.5)),
        )
        for i in range(count)
    ]


def preset_gittins_options(seed: int, thresholds_gpu_s: list[float]) -> dict[str, object]:
    """The Tiresias preset's gittins: an index level at every one of 300 samples (a random
    trace's job sizes), its queues at `thresholds_gpu_s`, demoted at rounds (key changes held)."""
    history = random_trace(seed + 100, 300)
    return {
        "service_samples_gpu_s": [job.gpus * (job.duration_s or 0) for job in history],
        "queues": True,
        "formula": "tiresias",
        "delta_gpu_s": 300.0,
        "quantiles": 1000,
        "thresholds_gpu_s": thresholds_gpu_s,
        "demote_at_rounds": True,
    }


def stretches(
    seed: int, gaps_s: tuple[float, ...], level: Callable[[int], int] = lambda index: 0
) -> list[JobSpec]:
    """60 random jobs a stretch, one stretch after another, each arriving every `gaps_s[n]` on
    average (60 s: quiet, the queue empties; 10 s: busy, jobs wait and preempt); ids prefixed
    `pN-`, each job's level `level(index in its stretch)`."""
    trace: list[JobSpec] = []
    start = 0.0
    for part, gap in enumerate(gaps_s):
        jobs = random_trace(seed * 10 + part, 60, gap)
        trace += [
            replace(
                job, id=f"p{part}-{job.id}", submit_time=job.submit_time + start, level=level(i)
            )
            for i, job in enumerate(jobs)
        ]
        start = trace[-1].submit_time
    return trace
