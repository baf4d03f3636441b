"""A job's speed on each GPU type of a cluster, and which types the jobs ran on.

The measures of heterogeneity that the `hetero` placement (corral.core.placement.hetero) and the
simulator's report share: a job's speed on a consolidated set of each type's GPUs, Gavel's
equal-share speed, and a log of the type each attempt ran on (`TypeLog`), whatever the placement.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from corral.core.cluster import Cluster
from corral.core.job import Job
from corral.core.plugin import SpeedModel


def equal_share_speed(speeds: Mapping[str, float], capacity: Mapping[str, int]) -> float:
    """What a job would get from an equal share of every type it may use (Gavel's reference for
    max-min fairness): the capacity-weighted mean of its speeds on them."""
    return sum(capacity[t] * s for t, s in speeds.items()) / sum(capacity[t] for t in speeds)


def representative_gpus(cluster: Cluster) -> dict[str, tuple[int, ...]]:
    """Per GPU type, its GPUs with the largest nodes first: the first g of them are a
    consolidated set of g GPUs whenever one node of the type can hold g."""
    ordered: dict[str, list[int]] = {t: [] for t in cluster.gpu_types}
    for node in sorted(cluster.nodes, key=lambda n: (-n.total_gpus, n.index)):
        ordered[node.gpu_type].extend(cluster.node_gpus[node.index])
    return {t: tuple(gpus) for t, gpus in ordered.items()}


def type_speeds(
    cluster: Cluster,
    job: Job,
    speed_model: SpeedModel | None,
    representatives: Mapping[str, tuple[int, ...]] | None = None,
) -> dict[str, float]:
    """The job's speed on each GPU type it accepts that can hold it (its workers too: each on one
    node), read from the speed model on a consolidated set of that type's GPUs (see
    `representative_gpus`)."""
    if representatives is None:
        representatives = representative_gpus(cluster)
    need = job.spec.gpus
    unit = job.spec.gpus_per_worker
    return {
        t: 1.0 if speed_model is None else speed_model(job, gpus[:need])
        for t, gpus in representatives.items()
        if job.spec.accepts(t)
        and len(gpus) >= need
        and (unit == 1 or _whole_worker_gpus(cluster, t, unit) >= need)
    }


def _whole_worker_gpus(cluster: Cluster, gpu_type: str, unit: int) -> int:
    """GPUs of the type that workers of `unit` GPUs each could have, every worker on one node."""
    return cluster.worker_room(frozenset({gpu_type}), unit)[1]


class TypeLog:
    """Which GPU type each job ran on, and for how long, whatever the placement.

    `wrap` returns the shell's SpeedModel with a record added. The scheduler calls it once per
    start, the job already placed on those GPUs and its `executed_s` still the time of its earlier
    attempts, so attempt i ran for the difference of that value at starts i and i + 1 (the job's
    final `executed_s` for the last attempt). Other calls (hetero's what-ifs) are not recorded."""

    def __init__(self) -> None:
        self.starts: dict[str, list[tuple[str, float]]] = {}

    def wrap(self, cluster: Cluster, speed_model: SpeedModel) -> SpeedModel:
        def speed(job: Job, gpus: tuple[int, ...]) -> float:
            if gpus and job.placement == gpus:  # a start, not a placement's what-if (hetero)
                self.starts.setdefault(job.id, []).append(
                    (cluster.gpus[gpus[0]].gpu_type, job.executed_s)
                )
            return speed_model(job, gpus)

        return speed

    def seconds_by_type(self, job: Job) -> dict[str, float]:
        starts = self.starts.get(job.id, [])
        ends = [executed for _, executed in starts[1:]] + [job.executed_s] if starts else []
        seconds: dict[str, float] = {}
        for (gpu_type, began), ended in zip(starts, ends, strict=True):
            seconds[gpu_type] = seconds.get(gpu_type, 0.0) + max(0.0, ended - began)
        return seconds

    def summary(
        self, jobs: Iterable[Job], cluster: Cluster, speed_model: SpeedModel | None
    ) -> dict[str, float | None]:
        """Over the jobs that ran (None when none did):

        * `best_type_share`: the share of their GPU-seconds spent on a type where they run
          fastest;
        * `min_equal_share_ratio`: the lowest, over jobs, of a job's mean speed while it ran
          divided by its equal-share speed (`equal_share_speed`);
        * `below_half_equal_share`: the share of jobs whose ratio is below 0.5."""
        on_best = total = 0.0
        ratios: list[float] = []
        capacity = cluster.total_by_type
        for job in jobs:
            seconds = self.seconds_by_type(job)
            ran = sum(seconds.values())
            if ran <= 0:  # never ran, or runs still (a trace whose jobs never end)
                continue
            speeds = type_speeds(cluster, job, speed_model)
            if not speeds:
                continue
            fastest = max(speeds.values())
            for gpu_type, part in seconds.items():
                total += job.spec.gpus * part
                if speeds.get(gpu_type, 0.0) >= fastest * (1 - 1e-9):
                    on_best += job.spec.gpus * part
            mean_speed = sum(speeds.get(t, 0.0) * part for t, part in seconds.items()) / ran
            ratios.append(mean_speed / equal_share_speed(speeds, capacity))
        return {
            "best_type_share": on_best / total if total > 0 else None,
            "min_equal_share_ratio": min(ratios) if ratios else None,
            "below_half_equal_share": (
                sum(r < 0.5 for r in ratios) / len(ratios) if ratios else None
            ),
        }
