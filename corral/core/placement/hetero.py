"""hetero: choose each waiting job's GPU type by min-cost matching, then place it on that type.

On a cluster with several GPU types, a job's speed depends on the type it lands on, and not by the
same factor for every job (Gavel's table: a CycleGAN job runs 9x faster on a V100 than on a K80, a
Recommendation job faster on the K80). A type-agnostic placement takes whichever type has room;
`hetero` decides the type first, for the waiting jobs of a round together:

* **Matching (AlloX, Le et al., EuroSys'20, section 3.1).** AlloX minimises the total completion
  time of queued jobs on machines of different speeds by a min-cost bipartite matching of jobs to
  (machine, position) slots: the job k-th from last on a machine delays itself and the k - 1 jobs
  after it, so the slot costs k times its processing time there. Here each GPU type is one such
  machine of `C_t` GPUs shared fluidly: a job of `g` GPUs that runs `p` seconds on type t finishes
  `p` after it starts and holds a share `g p / C_t` of the type's time from the jobs behind it.
  Slot k of type t therefore costs `backlog_t + p (1 + (k - 1) g / C_t)`; `backlog_t` is the share
  of the type's time the running jobs still hold. scipy's `linear_sum_assignment` solves it.
* **Speeds** come from the shell's `SpeedModel` (the same function that sets a running job's
  speed: Gavel's throughput table in the simulator, measured throughputs live), read on a
  consolidated set of GPUs of each type. Job lengths are not used (the live manager does not
  know them): every job is taken to have one unit of work, the time it takes on its fastest
  type, so `p = best speed / speed on t`; running jobs count with one unit as well.
  (`match_types` also takes a known amount of work per job, AlloX's processing times.)
* **Fairness (after Gavel, Narayanan et al., OSDI'20, section 4.1).** Gavel's max-min fairness
  compares a job's throughput with what it would get from an equal share of every GPU type.
  With `fairness = f`, a job may only be matched to a type where its speed is at least `f` times
  that equal-share speed: the capacity-weighted mean of its speeds over the types it may use.
  The fastest type always qualifies, so every job keeps a type.
* **Constraints.** A job's `gpu_types` are always honoured: a type it does not accept, a type
  with fewer GPUs than it needs (counting only whole workers per node, for a job whose workers
  need several GPUs each) and a type where its speed is not positive have infinite cost.

The matching runs once per scheduling round, lazily (only if the round tries to place a job), over
the first `max_jobs` waiting jobs in the ordering policy's order; a job further back is matched
alone against the same backlog (it takes the type where it would finish first). The ordering
policy still decides who runs first; `hetero` only restricts each job to its matched type and
lets the wrapped placement (`relax` by default) choose the GPUs there.

The scheduler calls `begin_round` at the start of each round for a placement that has it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import Any

from corral.core.cluster import Cluster
from corral.core.gputypes import equal_share_speed, representative_gpus, type_speeds
from corral.core.job import Job
from corral.core.placement.base import NotPlaced, Placed, Placement
from corral.core.placement.hetero_options import HeteroOptions as HeteroOptions
from corral.core.placement.named import Relax
from corral.core.plugin import PluginError, Services, SpeedModel


@dataclass(slots=True, frozen=True)
class JobSpeeds:
    """What the matching needs of one job: its GPU count, its speed on each type it may use (a
    missing or non-positive speed: it cannot run there) and its work, in the unit that makes
    `work / speed` a time. Without `work`, the job has one unit of work: one time unit on its
    fastest type."""

    gpus: int
    speeds: Mapping[str, float]
    work: float | None = None


def run_times(job: JobSpeeds, capacity: Mapping[str, int]) -> dict[str, float]:
    """How long the job runs on each type it may use (`work / speed`)."""
    usable = {
        t: s
        for t, s in job.speeds.items()
        if capacity.get(t, 0) >= job.gpus and s > 0 and math.isfinite(s)
    }
    if job.work is not None and not (job.work > 0 and math.isfinite(job.work)):
        raise ValueError(f"work must be a positive number, got {job.work}")
    if not usable:
        return {}
    work = job.work if job.work is not None else max(usable.values())
    return {t: work / s for t, s in usable.items()}


def fair_types(
    times: Mapping[str, float], capacity: Mapping[str, int], fairness: float
) -> dict[str, float]:
    """Keep the types where the job runs at least `fairness` times its equal-share speed."""
    fastest = min(times.values())
    relative = {t: fastest / time for t, time in times.items()}
    floor = fairness * equal_share_speed(relative, capacity) * (1 - 1e-12)  # keeps the fastest
    return {t: times[t] for t, s in relative.items() if s >= floor}


def type_backlog(
    running: Iterable[tuple[int, Mapping[str, float], str]], capacity: Mapping[str, int]
) -> dict[str, float]:
    """Per type, the share of its time the running jobs still hold. `running` gives, for each
    running job, its GPUs, its run times (`run_times`) and the type it runs on; the backlog of
    type t is the sum over its jobs of gpus x time on t / C_t."""
    backlog: dict[str, float] = {}
    for gpus, times, gpu_type in running:
        time = times.get(gpu_type)
        if time is not None:
            backlog[gpu_type] = backlog.get(gpu_type, 0.0) + gpus * time / capacity[gpu_type]
    return backlog


def assign_types(
    options: Sequence[tuple[int, Mapping[str, float]]],
    capacity: Mapping[str, int],
    backlog: Mapping[str, float],
) -> list[str | None]:
    """The min-cost matching itself: `options` gives each job's GPUs and its run time on each
    type it may be matched to (none: the job gets None)."""
    import numpy as np

    types = sorted(t for t, c in capacity.items() if c > 0)
    rows = [i for i, (_, times) in enumerate(options) if times]
    result: list[str | None] = [None] * len(options)
    if not rows:
        return result
    n = len(rows)
    times = np.array([[options[i][1].get(t, np.inf) for t in types] for i in rows])  # n x T
    gpus = np.array([options[i][0] for i in rows], dtype=float)
    sizes = np.array([capacity[t] for t in types], dtype=float)
    waits = np.array([backlog.get(t, 0.0) for t in types])
    positions = np.arange(n, dtype=float)  # k - 1 for the slots k = 1..n of each type
    # cost[job, type, k - 1] = backlog_t + time (1 + (k - 1) g / C_t); inf where not allowed
    cost = waits[None, :, None] + times[:, :, None] * (
        1.0 + positions[None, None, :] * (gpus[:, None, None] / sizes[None, :, None])
    )
    chosen_rows, chosen_columns = _linear_sum_assignment()(cost.reshape(n, len(types) * n))
    for row, column in zip(chosen_rows, chosen_columns, strict=True):
        result[rows[row]] = types[column // n]
    return result


def _linear_sum_assignment() -> Any:
    """scipy's; PluginError (one line) where scipy is not installed (a manager-only install:
    scipy comes with corral[sim])."""
    try:
        from scipy.optimize import linear_sum_assignment  # type: ignore[import-untyped]
    except ImportError:
        raise PluginError(
            "placement hetero: needs scipy, which comes with the sim extra "
            "(pip install -e '.[sim]')"
        ) from None
    return linear_sum_assignment


def match_types(
    jobs: Sequence[JobSpeeds],
    capacity: Mapping[str, int],
    backlog: Mapping[str, float] | None = None,
    fairness: float | None = None,
) -> list[str | None]:
    """The GPU type of each job (None: no type can hold it) minimising the summed completion
    times of the module docstring's model."""
    check_fairness(fairness)
    options = []
    for job in jobs:
        times = run_times(job, capacity)
        if times and fairness is not None:
            times = fair_types(times, capacity, fairness)
        options.append((job.gpus, times))
    return assign_types(options, capacity, backlog or {})


def check_fairness(fairness: float | None) -> None:
    if fairness is not None and not 0 < fairness <= 1:
        raise ValueError(f"fairness must be in (0, 1], got {fairness}")


def restricted(job: Job, gpu_type: str) -> Job:
    """A copy of the job that accepts only `gpu_type`, for the wrapped placement to search."""
    return replace(job, spec=replace(job.spec, gpu_types=frozenset((gpu_type,))))


@dataclass(slots=True)
class _Seen:
    """What `Hetero` keeps per cluster and speed model it places for (HiveD's per-VC schedulers
    share one placement): representative GPUs, and the run times of the jobs in view this
    round and the round before (they never change; two generations keep the cache to the jobs
    still in view)."""

    cluster: Cluster | None
    speed_model: SpeedModel | None
    representatives: dict[str, tuple[int, ...]]
    known: dict[str, tuple[dict[str, float], dict[str, float]]] = field(default_factory=dict)
    known_before: dict[str, tuple[dict[str, float], dict[str, float]]] = field(default_factory=dict)

    def new_generation(self) -> None:
        self.known_before, self.known = self.known, {}


class Hetero(Placement):
    name = "hetero"
    summary = "Gavel/AlloX: match waiting jobs to GPU types by measured speed, min-cost"
    Options = HeteroOptions

    @classmethod
    def from_options(cls, options: Any, services: Services) -> Placement:
        return cls(
            fairness=options.fairness,
            max_jobs=options.max_jobs,
            relax_after_s=options.relax_after_s,
        )

    def __init__(
        self,
        within: Placement | None = None,
        fairness: float | None = None,
        max_jobs: int = 32,
        relax_after_s: float = 600.0,
    ) -> None:
        check_fairness(fairness)
        _linear_sum_assignment()  # refuse to build without scipy, not in the first round
        if max_jobs < 1:
            raise ValueError(f"max_jobs must be at least 1, got {max_jobs}")
        self.within = within if within is not None else Relax(relax_after_s)
        self.fairness = fairness
        self.max_jobs = max_jobs
        self._waiting: list[Job] = []
        self._running: list[Job] = []
        self._plan: dict[str, str | None] | None = None
        self._views: dict[str, Job] = {}
        self._backlog: dict[str, float] = {}
        self._seen: dict[tuple[int, int], _Seen] = {}
        self._current = _Seen(None, None, {})

    # -- the round ------------------------------------------------------------------------------

    def begin_round(
        self,
        cluster: Cluster,
        pending: Iterable[Job],
        running: Iterable[Job],
        speed_model: SpeedModel | None,
        now: float,
    ) -> None:
        """Note the round's view; the matching itself waits until a job is to be placed."""
        key = (id(cluster), id(speed_model))
        seen = self._seen.get(key)
        if seen is None or seen.cluster is not cluster or seen.speed_model is not speed_model:
            seen = self._seen[key] = _Seen(cluster, speed_model, representative_gpus(cluster))
        self._current = seen
        self._plan = None
        self._views = {}
        if len(cluster.gpu_types) < 2:
            self._waiting, self._running = [], []
            return
        self._waiting = list(islice(pending, self.max_jobs))
        self._running = list(running)

    def gpu_type_for(self, cluster: Cluster, job: Job) -> str | None:
        """The type this round matched the job to; None outside a round, on a cluster of one
        type, or when no type can hold the job (the wrapped placement then decides alone)."""
        plan = self._plan
        if plan is None:
            if cluster is not self._current.cluster or len(cluster.gpu_types) < 2:
                return None
            self._current.new_generation()
            plan = self._plan = self._match(cluster)
        elif cluster is not self._current.cluster:
            return None
        key = job.spec.id
        if key in plan:
            return plan[key]
        # Behind the matched window: the type where it would finish first, from its slot 1.
        best: str | None = None
        best_cost = math.inf
        backlog = self._backlog
        for gpu_type, time in self._options(cluster, job).items():
            cost = backlog.get(gpu_type, 0.0) + time
            if cost < best_cost or (cost == best_cost and best is not None and gpu_type < best):
                best, best_cost = gpu_type, cost
        plan[key] = best
        return best

    def _match(self, cluster: Cluster) -> dict[str, str | None]:
        capacity = cluster.total_by_type
        self._backlog = type_backlog(
            (
                (
                    job.spec.gpus,
                    self._times(cluster, job)[0],
                    cluster.gpus[job.placement[0]].gpu_type,
                )
                for job in self._running
                if job.placement
            ),
            capacity,
        )
        chosen = assign_types(
            [(job.spec.gpus, self._options(cluster, job)) for job in self._waiting],
            capacity,
            self._backlog,
        )
        return {job.id: gpu_type for job, gpu_type in zip(self._waiting, chosen, strict=True)}

    def _options(self, cluster: Cluster, job: Job) -> dict[str, float]:
        """The run times on the types the job may be matched to (after the fairness rule)."""
        return self._times(cluster, job)[1]

    def _times(self, cluster: Cluster, job: Job) -> tuple[dict[str, float], dict[str, float]]:
        """The job's run time on every type that can hold it, and on those fairness allows."""
        seen = self._current
        known = seen.known.get(job.id) or seen.known_before.get(job.id)
        if known is None:
            speeds = type_speeds(cluster, job, seen.speed_model, seen.representatives)
            capacity = cluster.total_by_type
            times = run_times(JobSpeeds(job.spec.gpus, speeds), capacity)
            fair = (
                fair_types(times, capacity, self.fairness)
                if times and self.fairness is not None
                else times
            )
            known = (times, fair)
        seen.known[job.id] = known
        return known

    # -- the Placement interface -----------------------------------------------------------------

    def _view(self, cluster: Cluster, job: Job) -> tuple[Job, str | None]:
        gpu_type = self.gpu_type_for(cluster, job)
        if gpu_type is None:
            return job, None
        view = self._views.get(job.id)
        if view is None or view.queued_since != job.queued_since:
            view = self._views[job.id] = restricted(job, gpu_type)
        return view, gpu_type

    def place(self, cluster: Cluster, job: Job, now: float) -> Placed | NotPlaced:
        view, gpu_type = self._view(cluster, job)
        if gpu_type is None:
            return self.within.place(cluster, job, now)
        free = cluster.free_by_type.get(gpu_type, 0)
        if free < job.spec.gpus:  # the common refusal, without searching
            return NotPlaced(
                f"waiting for {job.spec.gpus} free GPUs of type {gpu_type} ({free} free); "
                f"hetero: matched to {gpu_type}"
            )
        result = self.within.place(cluster, view, now)
        if isinstance(result, NotPlaced):
            return NotPlaced(f"{result.reason}; hetero: matched to {gpu_type}")
        return result

    def mode(self, job: Job, now: float) -> str:
        cluster = self._current.cluster
        gpu_type = None if cluster is None else self.gpu_type_for(cluster, job)
        return f"{self.within.mode(job, now)}@{gpu_type}"

    def scope(self, cluster: Cluster, job: Job, now: float) -> str:
        return self.within.scope(cluster, self._view(cluster, job)[0], now)

    def changes_at(self, job: Job, now: float) -> float:
        return self.within.changes_at(job, now)
