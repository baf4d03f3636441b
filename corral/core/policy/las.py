"""Tiresias's discretized two-dimensional Least-Attained-Service (2D-LAS).

Attained service is GPUs x seconds run. K queues split by thresholds on it; a job sits in the
queue of its attained service, lower queues first, FIFO inside a queue: by arrival in the top
queue, and by the time it entered the queue below, so a job that drops a queue joins its tail (as
Tiresias's per-queue lists do) instead of jumping ahead of jobs that were there before it. Running
jobs that cross a threshold drop a queue, and a waiting job of a higher queue preempts them; a
waiting job does not preempt running jobs of its own queue (Tiresias's rule; `preempt_within_queue`
turns that on; docs/policies.md has the measurement behind the default). A job
that has waited longer than `starvation_factor` times its executed time is promoted back to the
top queue (Tiresias's starvation knob): its service so far stops counting.

`queue_order: started` orders inside a queue as the Tiresias simulator's lists end up after each
of its events (its `--preset tiresias`): running jobs first, in the order they started or dropped
into the queue, so the last of them gives way first; then waiting jobs, the most recently
preempted first, then the jobs that never ran (or were promoted) in the order they came.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from corral.core.job import Job, JobStatus
from corral.core.plugin import Services
from corral.core.policy.base import Key, Policy, tie_break
from corral.core.policy.las_options import DEFAULT_THRESHOLDS_GPU_S as DEFAULT_THRESHOLDS_GPU_S
from corral.core.policy.las_options import PREEMPT_WITHIN_QUEUE as PREEMPT_WITHIN_QUEUE
from corral.core.policy.las_options import LasOptions as LasOptions
from corral.core.policy.las_options import QueueOrder as QueueOrder

#: Job states read as module globals: a member looked up on its enum class costs several times as
#: much (as in corral.core.job), and these are asked at every start, stop, timer and key.
_RUNNING = JobStatus.RUNNING
_PENDING = JobStatus.PENDING


@dataclass(slots=True)
class LasState:
    """Per job: when it entered its current (lower) queue; None in the top queue, where it
    sorts by arrival. `promotions`: times the starvation rule moved it back to the top."""

    entered: float | None = None
    promotions: int = 0
    #: When the starvation rule last moved it to the top queue (None: never).
    promoted_at: float | None = None
    #: The queue it entered at `entered` (0 until it drops one).
    queue: int = 0
    #: `queue_order: started`: the number of its last start (counted by the policy), the
    #: attempt it numbers, and its place among running jobs (kept while it waits again).
    start_rank: int = 0
    ranked_attempt: int = -1
    running_order: tuple[float, int, int] = (0.0, 0, 0)


#: How far `tiresias_wake` may later fall below its value now, within one attempt (less than
#: one second; `tiresias_wake_bound`), with room for the floats' rounding of the floors.
TIRESIAS_WAKE_SLACK_S = 4.0


def tiresias_wake(job: Job, now: float, thresholds: Sequence[float], queue: int) -> float:
    """The Tiresias simulator's own wake-up for a running job in LAS `queue` (run_sim.py's
    dlas `jump_time`, recomputed at each of its events): the executed seconds, not
    GPU-seconds, subtracted from the queue's GPU-second limit, divided by the GPUs. Later
    than the crossing for a job of several GPUs (a bug of its own, kept to reproduce it)."""
    if job.status is not _RUNNING or queue >= len(thresholds):
        return math.inf
    executed = math.floor(job.executed_at(now))
    return now + max(0, math.floor((thresholds[queue] - executed) / job.spec.gpus))


def tiresias_wake_bound(wake: float) -> float:
    """A bound `tiresias_wake` stays at or after while the job runs on, given its value `wake`
    now. With x the executed seconds and n = floor(x), the wake is x + c(n) plus a constant, for
    c(n) = max(0, floor((T - n) / g)). Over d more seconds x grows by d, n by an integer k < d + 1,
    and c falls by at most ceil(k / g) <= k: the wake falls by less than one second. A higher
    queue (a larger T) or the last one (inf) only makes it later."""
    return wake - TIRESIAS_WAKE_SLACK_S


class LeastAttainedService(Policy):
    name = "las"
    summary = "Tiresias's discretized 2D-LAS: least attained GPU-service first, in queues"
    Options = LasOptions
    preemptive = True

    @classmethod
    def from_options(cls, options: Any, services: Services) -> Policy:
        return cls(
            options.thresholds_gpu_s,
            options.starvation_factor,
            options.preempt_within_queue,
            options.queue_order,
            options.demote_at_rounds,
        )

    def __init__(
        self,
        thresholds_gpu_s: Sequence[float] = DEFAULT_THRESHOLDS_GPU_S,
        starvation_factor: float | None = None,
        preempt_within_queue: bool = PREEMPT_WITHIN_QUEUE,
        queue_order: QueueOrder = "entered",
        demote_at_rounds: bool = False,
    ) -> None:
        thresholds = list(thresholds_gpu_s)
        if any(t <= 0 for t in thresholds) or thresholds != sorted(set(thresholds)):
            raise ValueError("LAS thresholds must be positive and strictly increasing")
        if starvation_factor is not None and starvation_factor <= 0:
            raise ValueError("the starvation factor must be positive")
        self.thresholds = thresholds
        self.starvation_factor = starvation_factor
        self.preempt_within_queue = preempt_within_queue
        self.queue_order = queue_order
        self.rekey_wakes = not demote_at_rounds
        self._starts = 0  # starts numbered so far (queue_order: started)
        # The scheduler's keys start (level, queue, ...): without the within-queue rule only a
        # lower queue (or level) gives way. Tiresias's order puts a queue's running jobs before
        # its waiting ones, so whole keys give its rule (and let a job at the tail give way).
        self.preempt_prefix = None if preempt_within_queue or queue_order == "started" else 2

    def counted_service(self, job: Job, now: float) -> float:
        return job.attained_at(now) - job.service_offset_gpu_s

    def queue_of(self, job: Job, now: float) -> int:
        # The tolerance keeps a timer that fires exactly at a threshold from landing just short of it.
        return bisect.bisect_right(self.thresholds, self.counted_service(job, now) + 1e-6)

    def key(self, job: Job, now: float) -> Key:
        # (`queue_of`, without its calls: asked at every key)
        service = job.attained_at(now) - job.service_offset_gpu_s
        queue = bisect.bisect_right(self.thresholds, service + 1e-6)
        state = job.peek(LasState)
        if self.queue_order == "started":
            return (queue, *self._started_order(job, state, now))
        entered = None if state is None else state.entered
        if queue == 0 or entered is None:
            return (queue, *tie_break(job))
        return (queue, entered, job.seq)

    def stored_key(self, job: Job, now: float) -> Key:
        if self.queue_order == "started" and job.status is _RUNNING:
            # Number the starts: jobs that start in one round keep the order they waited in.
            state = job.record(LasState)
            if state.ranked_attempt != job.attempts:
                self._starts += 1
                state.start_rank = self._starts
                state.ranked_attempt = job.attempts
            state.running_order = self._running_order(job, state)  # kept while it waits again
        return self.key(job, now)

    @staticmethod
    def _running_order(job: Job, state: LasState) -> tuple[float, int, int]:
        assert job.run_started_at is not None
        entered = state.entered
        if entered is None or entered < job.run_started_at:
            return (job.run_started_at, 0, state.start_rank)
        return (entered, 1, job.seq)

    def _started_order(self, job: Job, state: LasState | None, now: float) -> tuple[float, ...]:
        """Tiresias's list order inside a queue: running jobs (0) by the instant they started,
        in the order they started (0), or dropped into it, after those (1); then waiting jobs
        (1): the preempted ones (0) the latest first, in their order as running jobs, then the
        others (1) in the order they came. A job that drops into the queue joins the list's tail
        (2), behind the waiting jobs, for the round of that instant; preempted there, it stays
        at the tail, behind the jobs that dropped there before it."""
        if job.status is _RUNNING:
            assert state is not None
            order = self._running_order(job, state)
            at_tail = order[1] == 1 and now <= order[0]
            return (2 if at_tail else 0, *order)
        promoted_at = None if state is None else state.promoted_at
        if job.attempts == 0 or (promoted_at is not None and promoted_at >= job.queued_since):
            return (1, 1, job.spec.submit_time if promoted_at is None else promoted_at, job.seq)
        assert state is not None
        if state.entered == job.queued_since:
            return (2, *state.running_order)  # preempted at the tail: stays there
        return (1, 0, -job.queued_since, *state.running_order)

    def key_changes_at(self, job: Job, now: float) -> float:
        if job.status is _RUNNING:
            state = job.peek(LasState)
            if self.queue_order == "started" and state is not None and state.entered == now:
                return math.nextafter(now, math.inf)  # its round at the tail is over
            # (`queue_of` and `counted_service`, the service computed once)
            service = job.attained_at(now) - job.service_offset_gpu_s
            thresholds = self.thresholds
            queue = bisect.bisect_right(thresholds, service + 1e-6)
            if queue == len(thresholds):
                return math.inf
            missing = thresholds[queue] - service
            return now + missing / job.spec.gpus
        if job.status is _PENDING:
            return self._promotion_time(job, now)
        return math.inf

    def wakes_at(self, job: Job, now: float) -> float:
        return tiresias_wake(job, now, self.thresholds, self.queue_of(job, now))

    def wake_bound(self, job: Job, now: float, wake: float) -> float:
        return tiresias_wake_bound(wake)

    def _promotion_time(self, job: Job, now: float) -> float:
        if self.starvation_factor is None or self.queue_of(job, now) == 0:
            return math.inf
        return job.queued_since + self.starvation_factor * job.executed_at(now)

    def on_key_change(self, job: Job, now: float) -> None:
        if job.status is _PENDING and self._promotion_time(job, now) <= now:
            job.service_offset_gpu_s = job.attained_at(now)
            state = job.record(LasState)
            state.promotions += 1
            state.entered = None  # back in the top queue, in arrival order
            state.promoted_at = now
            state.queue = 0
        elif job.status is _RUNNING:
            state = job.record(LasState)
            queue = self.queue_of(job, now)
            if queue != state.queue:  # dropped a queue: join its tail
                state.queue = queue
                state.entered = now

    def describe_key(self, job: Job, now: float) -> str:
        return f"LAS queue {self.queue_of(job, now)} ({self.counted_service(job, now):.0f} GPU-s attained)"
