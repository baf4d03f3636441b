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
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from corral.core.job import Job, JobStatus
from corral.core.options import option
from corral.core.plugin import Services
from corral.core.policy.base import Key, Policy, tie_break

#: Queue boundaries in GPU-seconds: 1 GPU-hour and 10 GPU-hours (three queues).
DEFAULT_THRESHOLDS_GPU_S = (3_600.0, 36_000.0)
#: Whether a waiting job preempts running jobs of its own queue (docs/policies.md: the rule).
PREEMPT_WITHIN_QUEUE = False


@dataclass(slots=True)
class LasState:
    """Per job: when it entered its current (lower) queue; None in the top queue, where it
    sorts by arrival. `promotions`: times the starvation rule moved it back to the top."""

    entered: float | None = None
    promotions: int = 0


@dataclass(frozen=True, slots=True)
class LasOptions:
    thresholds_gpu_s: tuple[float, ...] = option(
        DEFAULT_THRESHOLDS_GPU_S,
        help="queue boundaries in GPU-seconds of attained service, increasing",
        low=0,
        low_open=True,
    )
    starvation_factor: float | None = option(
        None,
        help="promote a job that waited this many times its executed time to the top queue",
        low=0,
        low_open=True,
    )
    preempt_within_queue: bool = option(
        PREEMPT_WITHIN_QUEUE,
        help="a waiting job may preempt running jobs of its own queue that come after it (off: "
        "only a job of a higher queue preempts, as in Tiresias)",
    )

    def validate(self) -> str | None:
        thresholds = list(self.thresholds_gpu_s)
        if thresholds != sorted(set(thresholds)):
            return "thresholds_gpu_s must be strictly increasing"
        return None


class LeastAttainedService(Policy):
    name = "las"
    summary = "Tiresias's discretized 2D-LAS: least attained GPU-service first, in queues"
    Options = LasOptions
    preemptive = True

    @classmethod
    def from_options(cls, options: Any, services: Services) -> Policy:
        return cls(
            options.thresholds_gpu_s, options.starvation_factor, options.preempt_within_queue
        )

    def __init__(
        self,
        thresholds_gpu_s: Sequence[float] = DEFAULT_THRESHOLDS_GPU_S,
        starvation_factor: float | None = None,
        preempt_within_queue: bool = PREEMPT_WITHIN_QUEUE,
    ) -> None:
        thresholds = list(thresholds_gpu_s)
        if any(t <= 0 for t in thresholds) or thresholds != sorted(set(thresholds)):
            raise ValueError("LAS thresholds must be positive and strictly increasing")
        if starvation_factor is not None and starvation_factor <= 0:
            raise ValueError("the starvation factor must be positive")
        self.thresholds = thresholds
        self.starvation_factor = starvation_factor
        self.preempt_within_queue = preempt_within_queue
        # The scheduler's keys start (level, queue, ...): without the within-queue rule only a
        # lower queue (or level) gives way.
        self.preempt_prefix = None if preempt_within_queue else 2

    def counted_service(self, job: Job, now: float) -> float:
        return job.attained_at(now) - job.service_offset_gpu_s

    def queue_of(self, job: Job, now: float) -> int:
        # The tolerance keeps a timer that fires exactly at a threshold from landing just short of it.
        return bisect.bisect_right(self.thresholds, self.counted_service(job, now) + 1e-6)

    def key(self, job: Job, now: float) -> Key:
        queue = self.queue_of(job, now)
        state = job.peek(LasState)
        entered = None if state is None else state.entered
        if queue == 0 or entered is None:
            return (queue, *tie_break(job))
        return (queue, entered, job.seq)

    def key_changes_at(self, job: Job, now: float) -> float:
        if job.status is JobStatus.RUNNING:
            queue = self.queue_of(job, now)
            if queue == len(self.thresholds):
                return math.inf
            missing = self.thresholds[queue] - self.counted_service(job, now)
            return now + missing / job.spec.gpus
        if job.status is JobStatus.PENDING:
            return self._promotion_time(job, now)
        return math.inf

    def _promotion_time(self, job: Job, now: float) -> float:
        if self.starvation_factor is None or self.queue_of(job, now) == 0:
            return math.inf
        return job.queued_since + self.starvation_factor * job.executed_at(now)

    def on_key_change(self, job: Job, now: float) -> None:
        if job.status is JobStatus.PENDING and self._promotion_time(job, now) <= now:
            job.service_offset_gpu_s = job.attained_at(now)
            state = job.record(LasState)
            state.promotions += 1
            state.entered = None  # back in the top queue, in arrival order
        elif job.status is JobStatus.RUNNING:
            job.record(LasState).entered = now  # dropped a queue: join its tail

    def describe_key(self, job: Job, now: float) -> str:
        return f"LAS queue {self.queue_of(job, now)} ({self.counted_service(job, now):.0f} GPU-s attained)"
