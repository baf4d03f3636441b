"""What a replay of a live manager's history honours besides the jobs' specs (corral.sim.engine).

A corral trace from `corral export-trace` says, for each job, what the live manager decided its
fate from outside the core (`corral.core.tracefile.JobReplay`): the gates it waited at (its
dependencies, its array's cap, the intervals it was held), the attempts that failed and after how
long, and the seconds it restored on a resume. `ReplayGates` keeps them for the simulation:

* gates: a job that waits at one is kept here, outside the core, and given to it once its gates
  open (`corral.core.gates`, the live manager's own rule: held, a dependency not yet succeeded,
  its array's cap of tasks in the core), looked at in id order before each round; submitted then
  as if it arrived (its submit time kept), or adopted with its history when it ran before (a job
  held while it waited after a preemption);
* holds: at its hold instant a waiting job leaves the core (`withdraw`), at its release it may go
  back; a hold the replay cannot make (the job runs, or has ended, in the replay) is a note;
* failures: the replay's attempt of the same number as a failed live one fails after the seconds
  that one ran, reported to the core with the live report's reason and signature, so that the
  core's retry rule decides the backoff and whether the job ends, as it did live;
* restores: a resumed attempt stalls the job's measured `restore_s`, not the scheduler's.

What the replay could not do as the manager did is kept as `notes` (instant, job, what and why),
which `corral simulate` lists beside its comparison of the decisions (corral.sim.replaydiff).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from corral.core.actions import Start
from corral.core.gates import gate_order, gate_reason
from corral.core.job import Job, JobSpec, JobStatus
from corral.core.protocol import SchedulerCore
from corral.core.tracefile import JobReplay, RecordedFailure
from corral.sim.failures import AttemptFailure


@dataclass(slots=True)
class ReplayNote:
    """A decision of the manager's the replay could not make as it did, and why."""

    at: float
    job: str
    what: str

    def record(self) -> dict[str, object]:
        return {"at": self.at, "job": self.job, "note": self.what}


@dataclass(slots=True)
class ReplayGates:
    """The gates, holds, failures and restores of a replayed history (see the module)."""

    facts: Mapping[str, JobReplay]
    scheduler: SchedulerCore
    #: Every job of the trace (a dependency on a job outside it counts as succeeded).
    trace_ids: set[str] = field(default_factory=set)
    #: Jobs waiting at a gate, outside the core, by id.
    gated: dict[str, Job] = field(default_factory=dict)
    held: set[str] = field(default_factory=set)
    #: Each capped array's tasks that arrived, are not gated and have not ended.
    in_core: Counter[str] = field(default_factory=Counter)
    counted: set[str] = field(default_factory=set)  # the capped tasks `in_core` counts
    #: Jobs that arrived (a dependency on one that has not is waited for, as live).
    arrived: set[str] = field(default_factory=set)
    #: Failed attempts not replayed yet, per job, in order.
    failures: dict[str, list[RecordedFailure]] = field(default_factory=dict)
    notes: list[ReplayNote] = field(default_factory=list)
    #: Jobs the replay ended because a dependency did not succeed (live, they ran).
    failed_at_gate: list[Job] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.failures = {job: list(f.failures) for job, f in self.facts.items() if f.failures}

    def events(self) -> list[tuple[float, str, bool]]:
        """(instant, job, True: held / False: released) of every hold, in time."""
        found = []
        for job_id, facts in self.facts.items():
            for start, end in facts.holds:
                found.append((start, job_id, True))
                if end is not None:
                    found.append((end, job_id, False))
        return sorted(found)

    # -- gates -----------------------------------------------------------------------------------

    def arrive(self, spec: JobSpec, now: float) -> bool:
        """A job arrives: True when it waits at a gate (kept here), False: submit it."""
        self.arrived.add(spec.id)
        facts = self.facts.get(spec.id)
        if facts is None:
            return False
        held = facts.held_at(now)
        if held:
            self.held.add(spec.id)
        if facts.gates.any(held):
            self.gated[spec.id] = Job(spec=spec)
            return True
        self._count(spec.id, 1)
        return False

    def _count(self, job_id: str, change: int) -> None:
        """The job entered (1) or left (-1) the core: its array's count, once each way."""
        facts = self.facts.get(job_id)
        if facts is None or not facts.gates.capped or facts.gates.array is None:
            return
        if (change > 0) == (job_id in self.counted):
            return
        self.counted.symmetric_difference_update((job_id,))
        self.in_core[facts.gates.array] += change

    def ended(self, job: Job) -> None:
        """A job of the core ended: its array has one task fewer in the core."""
        self._count(job.id, -1)

    def _status_of(self, job_id: str) -> str | None:
        if job_id in self.gated:
            return "PENDING"
        if job_id not in self.arrived:
            # A job of the trace not arrived yet waits; one outside it (live it succeeded before
            # the history exported began, or the export left it out) has succeeded.
            return "PENDING" if job_id in self.trace_ids else "SUCCEEDED"
        job = self.scheduler.jobs.get(job_id)
        if job is None:
            return "SUCCEEDED"  # ended and dropped (a streamed run): only ended jobs are dropped
        return job.status.value

    def open(self, now: float) -> None:
        """Give the core the gated jobs whose gates are open, in id order, as the manager does
        before each round (Manager._open_gates)."""
        for job_id in gate_order(list(self.gated)):
            facts = self.facts[job_id]
            held_by = "the replay" if job_id in self.held else None
            reason, fails = gate_reason(held_by, facts.gates, self._status_of, self.in_core)
            if fails:
                job = self.gated.pop(job_id)
                self.notes.append(
                    ReplayNote(now, job_id, f"{reason}: the replay ends it unstarted; live it ran")
                )
                self.failed_at_gate.append(job)
                continue
            if reason is not None:
                continue
            job = self.gated.pop(job_id)
            if job.attempts:
                self.scheduler.adopt(job, now)
            else:
                job = self.scheduler.submit(job.spec, now)
                if job.status.finished:
                    self.notes.append(ReplayNote(now, job_id, f"refused: {job.last_event}"))
                    continue
            self._count(job_id, 1)

    # -- holds -----------------------------------------------------------------------------------

    def hold(self, job_id: str, now: float) -> None:
        if job_id not in self.arrived:
            self.notes.append(ReplayNote(now, job_id, "held before it arrived in the replay"))
            return
        self.held.add(job_id)
        if job_id in self.gated:
            return
        job = self.scheduler.jobs.get(job_id)
        if job is not None and job.status is JobStatus.PENDING:
            self.gated[job_id] = self.scheduler.withdraw(job_id, now)
            self._count(job_id, -1)
            return
        status = "ended" if job is None or job.status.finished else job.status.value.lower()
        self.notes.append(
            ReplayNote(
                now,
                job_id,
                f"held live while it waited; in the replay it is {status} then, and runs on",
            )
        )

    def release(self, job_id: str, now: float) -> None:
        self.held.discard(job_id)

    # -- attempts --------------------------------------------------------------------------------

    def started(self, job: Job, action: Start, now: float, core_restore_s: float) -> None:
        """The job's attempt started: a resume stalls its own measured restore."""
        facts = self.facts.get(job.id)
        if facts is None or facts.restore_s is None or not action.resumed:
            return
        job.stall_until += facts.restore_s - core_restore_s

    def failure(self, job: Job) -> AttemptFailure | None:
        """How the attempt the job just started fails, if a live attempt of its number did:
        after the seconds that one ran, as it was reported."""
        queue = self.failures.get(job.id)
        if not queue or queue[0].attempt > job.attempts:
            return None
        recorded = queue[0]
        if recorded.attempt < job.attempts:
            self.notes.append(
                ReplayNote(
                    job.run_started_at or 0.0,
                    job.id,
                    f"attempt {recorded.attempt} failed live; the replay's attempt "
                    f"{recorded.attempt} did not run as long: its failure replayed on attempt "
                    f"{job.attempts}",
                )
            )
        return AttemptFailure(
            recorded.ran_s,
            recorded.reason,
            recorded.signature or recorded.reason,
            recorded.infrastructure,
        )

    def failed_by_node(self, job: Job) -> None:
        """The job's attempt failed as its node was found unhealthy (a replayed node change):
        that is the live failure of this attempt, which is not replayed again."""
        queue = self.failures.get(job.id)
        if queue and queue[0].attempt <= job.attempts and queue[0].infrastructure:
            queue.pop(0)

    def failed(self, job: Job) -> None:
        """The job's replayed failure happened."""
        queue = self.failures.get(job.id)
        if queue:
            queue.pop(0)
