"""Discrete-event simulation: replay a trace through the scheduling core in virtual time.

Events are arrivals (read in order from the sorted trace), attempt ends (finish or failure) and the
scheduler's own timers (LAS queue crossings, starvation promotions, relax deadlines). An attempt's
end is re-timed when the job's speed changes mid-attempt (Decision.respeeds: packed jobs). All
events at one instant are applied, then the scheduler decides once. Nothing ticks per second, and
a run is deterministic for a given seed.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from corral.core.actions import Start
from corral.core.cluster import Cluster
from corral.core.job import JobSpec, JobStatus
from corral.core.placement.base import Placement
from corral.core.policy.base import Policy
from corral.core.scheduler import Scheduler, SpeedModel
from corral.sim.result import SimResult, Timeline

_FINISH, _FAIL, _TIMER = 0, 1, 2


@dataclass(slots=True, frozen=True)
class FailureModel:
    """Per-attempt failures that grow with job size, retried up to a limit as Philly did.

    An attempt of a job on g GPUs fails with probability min(cap, rate x (1 + log2 g)), at a time
    drawn uniformly over what the attempt would have run; the work of a failed attempt is lost.
    """

    rate: float
    max_retries: int = 3
    cap: float = 0.9

    def probability(self, gpus: int) -> float:
        return min(self.cap, self.rate * (1.0 + math.log2(gpus)))


class Simulation:
    def __init__(
        self,
        jobs: Sequence[JobSpec],
        cluster: Cluster,
        policy: Policy,
        placement: Placement,
        *,
        backfill: bool = False,
        speed_model: SpeedModel | None = None,
        restore_s: float = 0.0,
        failures: FailureModel | None = None,
        seed: int = 0,
        measured: set[str] | None = None,
        on_progress: Callable[[int, int], None] | None = None,
        options: dict[str, object] | None = None,
        scheduler: Scheduler | None = None,
    ) -> None:
        """`scheduler`, when given, replaces the plain one built from cluster, policy and
        placement (e.g. a multi-tenant HivedScheduler over the same cluster)."""
        if failures is not None:
            jobs = [replace(spec, max_retries=failures.max_retries) for spec in jobs]
        self.specs = sorted(jobs, key=lambda s: s.submit_time)
        self.cluster = cluster
        self.scheduler = scheduler or Scheduler(
            cluster,
            policy,
            placement,
            backfill=backfill,
            speed_model=speed_model,
            restore_s=restore_s,
        )
        self.failures = failures
        self.rng = np.random.default_rng(seed)
        self.measured = measured
        self.on_progress = on_progress
        self.options = options or {}

    def run(self) -> SimResult:
        started = time.perf_counter()
        scheduler = self.scheduler
        cluster = self.cluster
        specs = self.specs
        events: list[tuple[float, int, int, str, int]] = []
        order = 0
        timers: set[float] = set()
        # The end event that counts for each running job (its order), and, if it is a failure,
        # when: a speed change re-times the end, and stale events are skipped.
        end_order: dict[str, int] = {}
        fails_at: dict[str, float] = {}
        timeline = Timeline()
        next_arrival = 0
        ended = 0
        measured_left = len(self.measured) if self.measured is not None else -1
        progress_every = max(1, len(specs) // 200)

        while True:
            arrival_at = specs[next_arrival].submit_time if next_arrival < len(specs) else math.inf
            event_at = events[0][0] if events else math.inf
            now = min(arrival_at, event_at)
            if now == math.inf or measured_left == 0:
                break
            if next_arrival == len(specs) and ended == len(specs):
                break  # only stale timers are left
            while next_arrival < len(specs) and specs[next_arrival].submit_time <= now:
                arrived = scheduler.submit(specs[next_arrival], now)
                next_arrival += 1
                if arrived.status.finished:  # refused at once by an admission control
                    ended += 1
                    measured_left -= self.measured is not None and arrived.id in self.measured
            while events and events[0][0] <= now:
                _, event_order, kind, job_id, attempt = heapq.heappop(events)
                if kind == _TIMER:
                    timers.discard(now)
                    continue
                job = scheduler.jobs[job_id]
                if job.status is not JobStatus.RUNNING or job.attempts != attempt:
                    continue  # the attempt this event belonged to was preempted
                if end_order.get(job_id) != event_order:
                    continue  # re-timed after a speed change
                if kind == _FINISH:
                    scheduler.finished(job_id, now)
                else:
                    scheduler.failed(job_id, now, "simulated failure")
                if job.status.finished:
                    ended += 1
                    if self.measured is not None and job_id in self.measured:
                        measured_left -= 1
                    if self.on_progress is not None and ended % progress_every == 0:
                        self.on_progress(ended, len(specs))

            decision = scheduler.decide(now)
            for action in decision.actions:
                if isinstance(action, Start):
                    job = scheduler.jobs[action.job_id]
                    runs_for = job.remaining_wall_s(now)
                    kind = _FINISH
                    if self.failures is not None and self.rng.random() < self.failures.probability(
                        job.spec.gpus
                    ):
                        kind = _FAIL
                        runs_for *= self.rng.random()
                    order += 1
                    heapq.heappush(events, (now + runs_for, order, kind, job.id, job.attempts))
                    end_order[job.id] = order
                    if kind == _FAIL:
                        fails_at[job.id] = now + runs_for
                    else:
                        fails_at.pop(job.id, None)
                # A Preempt needs nothing here: the end event of its attempt is now stale.
            for respeed in decision.respeeds:  # the work left now takes another time
                job = scheduler.jobs[respeed.job_id]
                ends_at = now + job.remaining_wall_s(now)
                if fails_at.get(job.id, math.inf) <= ends_at:
                    continue  # it still fails first, at the instant drawn when it started
                fails_at.pop(job.id, None)
                order += 1
                heapq.heappush(events, (ends_at, order, _FINISH, job.id, job.attempts))
                end_order[job.id] = order
            wake = decision.wake_at
            if wake is not None and wake > now and wake not in timers:
                timers.add(wake)
                order += 1
                heapq.heappush(events, (wake, order, _TIMER, "", 0))
            free = cluster.free_gpus
            timeline.record(
                now,
                cluster.total_gpus - free,
                scheduler.pending_count,
                scheduler.running_count,
                free - cluster.free_in_whole_nodes(),
            )

        for job in scheduler.jobs.values():  # close the books of jobs still waiting at the end
            if job.status is JobStatus.PENDING and timeline.time_s:
                job.pending_s += max(0.0, timeline.time_s[-1] - job.queued_since)
        if self.on_progress is not None:
            self.on_progress(ended, len(specs))
        return SimResult(
            policy=scheduler.policy.name,
            placement=scheduler.placement.name,
            cluster=cluster.describe(),
            total_gpus=cluster.total_gpus,
            jobs=list(scheduler.jobs.values()),
            measured=self.measured,
            timeline=timeline,
            preemptions=scheduler.preemptions,
            rounds=scheduler.rounds,
            wall_s=time.perf_counter() - started,
            options=self.options,
        )
