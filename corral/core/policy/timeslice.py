"""Gandiva's time-slicing: when jobs wait, running jobs take turns of `quantum_s` seconds.

Gandiva (Xiao et al., OSDI'18, section 4.1) lets an oversubscribed cluster time-share GPUs: jobs
are suspended and resumed in turn, round-robin. Here a turn ends by preemption through the
checkpoint contract, and the resumed job pays the scheduler's `restore_s` before it does work.

The round-robin queue is a key: `(1, ready_since, served_s, seq)` for every job waiting for a turn,
where `ready_since` is when the job joined the queue's tail (its arrival, or the end of its last
turn) and `served_s` (seconds it had run by then) breaks ties in favour of the job served least.
A running job is in its turn, key `(0, ...)`, above every waiting job, until the end of the round:
rounds end at multiples of the quantum, and a turn lasts at least half a quantum (so one quantum
on average). Then (the scheduler's timer) it joins the tail, and every waiting job that joined
before it may take its GPUs. When none does (nobody waits, or no waiting job fits in what it would
free) it keeps running and joins the tail again a quantum later: rotation only happens when the
cluster is oversubscribed, and a job that arrives meanwhile waits at most a round for a turn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from corral.core.job import Job, JobStatus
from corral.core.plugin import Services
from corral.core.policy.base import Key, Policy
from corral.core.policy.timeslice_options import DEFAULT_QUANTUM_S as DEFAULT_QUANTUM_S
from corral.core.policy.timeslice_options import TimeSliceOptions as TimeSliceOptions


@dataclass(slots=True)
class TurnState:
    """Per job: the attempt whose turn is over, when it joined the queue's tail and the seconds
    it had run by then, and the turns it has had."""

    over: int | None = None
    ready: float | None = None
    served_s: float = 0.0
    turns: int = 0


class TimeSlice(Policy):
    name = "timeslice"
    summary = "Gandiva's time-slicing: waiting and running jobs take turns of a quantum"
    Options = TimeSliceOptions
    preemptive = True

    @classmethod
    def from_options(cls, options: Any, services: Services) -> Policy:
        return cls(options.quantum_s)

    def __init__(self, quantum_s: float = DEFAULT_QUANTUM_S) -> None:
        if not quantum_s > 0 or math.isinf(quantum_s):
            raise ValueError(
                f"the time-slice quantum must be a positive number of seconds, got {quantum_s}"
            )
        self.quantum_s = quantum_s

    @staticmethod
    def in_turn(job: Job) -> bool:
        """Running, and its attempt has not yet used up a quantum."""
        if job.status is not JobStatus.RUNNING:
            return False
        state = job.peek(TurnState)
        return state is None or state.over != job.attempts

    @staticmethod
    def ready_since(job: Job) -> float:
        state = job.peek(TurnState)
        ready = None if state is None else state.ready
        return job.spec.submit_time if ready is None else ready

    def key(self, job: Job, now: float) -> Key:
        if self.in_turn(job):
            return (0, job.run_started_at, 0.0, job.seq)
        state = job.peek(TurnState)
        return (1, self.ready_since(job), 0.0 if state is None else state.served_s, job.seq)

    def key_changes_at(self, job: Job, now: float) -> float:
        if job.status is not JobStatus.RUNNING or job.run_started_at is None:
            return math.inf
        if self.in_turn(job):
            return self.turn_ends(job.run_started_at)
        return self.ready_since(job) + self.quantum_s

    def turn_ends(self, started_at: float) -> float:
        """Turns end on round boundaries (multiples of the quantum), so that all the jobs whose
        turns end rotate in one scheduling round; a turn lasts at least half a quantum, so a job
        is never suspended right after it paid for its restore."""
        quantum = self.quantum_s
        return math.ceil((started_at + quantum / 2) / quantum - 1e-9) * quantum

    def on_key_change(self, job: Job, now: float) -> None:
        if job.status is JobStatus.RUNNING:  # a quantum is over: join the tail of the queue
            state = job.record(TurnState)
            if self.in_turn(job):
                state.turns += 1
            state.over = job.attempts
            state.ready = now
            state.served_s = job.executed_at(now)

    def describe_key(self, job: Job, now: float) -> str:
        if self.in_turn(job):
            assert job.run_started_at is not None
            left = self.turn_ends(job.run_started_at) - now
            return f"in its turn ({left:.0f}s of the {self.quantum_s:.0f}s quantum left)"
        return f"waiting for a turn since t={self.ready_since(job):.0f}s"
