"""Small builders for hand-worked scheduling scenarios."""

from __future__ import annotations

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
