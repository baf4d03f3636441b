"""Lifecycle plugins: a mechanism that follows jobs through their lives (the pre-run of
corral.core.precheck) instead of branching the scheduler at each transition.

The scheduler calls the hooks at its transitions: a job enters (submitted, or adopted with its
history), an attempt starts, stops, exits successfully or fails, the job ends or is withdrawn,
a timer the plugin set comes due, the attempt reports its first progress. The per-job hooks are
asked only of the jobs the plugin follows (`jobs`, by id): with none, a plugin costs a round
nothing. A plugin acts on the scheduler only through `LifecycleHost`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Protocol

from corral.core.compiled import mypyc_attr

if TYPE_CHECKING:
    from corral.core.actions import Action, Preempt
    from corral.core.job import Job
    from corral.core.retry import FailureReport, Verdict


class LifecycleHost(Protocol):
    """What a lifecycle plugin may do to the scheduler."""

    def stop(self, job: Job, now: float) -> None:
        """End the running attempt: its GPUs freed, its run accounted (the job in no queue)."""
        ...

    def enqueue(self, job: Job, now: float) -> None:
        """Queue the job (again), in its place (`seq`)."""
        ...


@mypyc_attr(allow_interpreted_subclasses=True)
class Lifecycle:
    """Every hook does nothing by default."""

    def __init__(self) -> None:
        #: The jobs it follows now, by id: the per-job hooks are asked of these only.
        self.jobs: dict[str, Any] = {}

    def entered(self, job: Job, adopted: bool) -> None:
        """A job enters the scheduler, before it is queued: submitted, or (`adopted`) taken with
        its history (a shell rebuilding the core, another scheduler's job)."""

    def starting(self, job: Job) -> tuple[bool, bool]:
        """Any job's attempt starts: (whether it resumes from a checkpoint, whether the
        attempt is a trial of the plugin's rather than the job's own run)."""
        return job.attempts > 0, False

    def ran(self, job: Job, ran_s: float) -> bool:
        """A followed job's attempt stops after `ran_s` seconds: is its work the job's?"""
        return True

    def exited(self, job: Job, now: float) -> bool:
        """A followed job's attempt exited successfully (stopped already): True if that is not
        the job's end (the plugin queued it again)."""
        return False

    def failing(self, job: Job, report: FailureReport, verdict: Verdict) -> Verdict:
        """A followed job's attempt failed (stopped already): the verdict, maybe another."""
        return verdict

    def ended(self, job: Job) -> None:
        """A followed job ended (succeeded, failed, cancelled)."""

    def withdrawn(self, job: Job) -> None:
        """A job left the scheduler, to be adopted again later."""

    def due_at(self, job: Job) -> float:
        """When the plugin acts on a followed running job by itself (its timer), or inf."""
        return math.inf

    def due(self, job: Job, now: float, actions: list[Action]) -> bool:
        """A followed running job's timer fired: True if the plugin acted (stopped it)."""
        return False

    def progressed(self, job: Job, now: float) -> Preempt | None:
        """A followed running job reported its first progress: the stop it makes, if any."""
        return None

    def counters(self) -> dict[str, int]:
        return {}
