"""A job's pre-run ("precheck"): its first steps on one worker before it holds its whole gang.

Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN Training Workloads"
(USENIX ATC 2019) found many of Philly's failures to be user errors (the code, the configuration)
that show up in a job's first minutes, and proposed running a job's first iterations on a small
allocation before it is given all its GPUs: a gang that would only fail wastes one worker's GPUs,
not all of them, and does not wait for a whole gang to be free first.

How the scheduler (`corral.core.scheduler.Scheduler`) runs it, through the lifecycle plugin
`PreRuns` (corral.core.lifecycle):

* A job with `JobSpec.precheck_s` (or the scheduler's default, `CoreOptions.precheck_s`) whose
  gang is more than one worker (`gpus > gpus_per_worker`) waits and starts as ONE worker: its
  `job.spec` is the one-worker spec (`prerun_spec`), its own spec is kept in its
  `PrecheckState.full`, as ElasticFlow's resize swaps the spec of a waiting job. It waits in the
  queue where the policy puts it, and is placed by the placement like any job; its `Start` says
  `precheck=True`.
* It passes when the shell reports its first progress (`progressed(job_id, now)`), when
  `timeout_s` seconds of the pre-run attempt have passed (a timer: `Decision.wake_at` covers that
  instant), or when the attempt exits successfully (`finished` during a pre-run is a pass, not
  the job's end). The attempt is stopped (a `Preempt` with `precheck=True`, unless it had exited)
  and the job waits again with its own spec, keeping its place (`seq`); the pre-run's work is not
  the job's (it starts over, not resumed), its GPU time counts as any attempt's.
* A failure in the pre-run that is not the infrastructure's ends the job at once, FAILED, whatever
  its retries: it never holds its gang. An infrastructure failure retries the pre-run by the
  `RetryRule`, as for any attempt.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from corral.core.actions import Preempt
from corral.core.job import Job, JobSpec
from corral.core.lifecycle import Lifecycle, LifecycleHost
from corral.core.retry import FailureReport, Verdict

if TYPE_CHECKING:
    from corral.core.actions import Action

#: `Preempt.by_job_id` of the stop that ends a pre-run that passed.
PRECHECK_PASSED = "pre-run passed"


@dataclass(slots=True)
class PrecheckState:
    """A job's pre-run (`job.record(PrecheckState)`). `full` is the job's own spec while the job
    waits for or runs its pre-run, None once it passed (or ended). `attempts`: pre-run attempts
    started; `gpu_s`: GPU-seconds they ran (passed or failed); `passed_by`: how it passed
    ("progress", "timer", "exited"), empty until then."""

    full: JobSpec | None = None
    timeout_s: float = math.inf
    #: `job.work_done_s` when the pre-run began: what it goes back to when the pre-run ends.
    work_before: float = 0.0
    attempts: int = 0
    gpu_s: float = 0.0
    passed_by: str = ""


def precheck_timeout(spec: JobSpec, default_s: float | None) -> float | None:
    """How long the job's pre-run may run before it passes by the timer (seconds), or None when
    the job runs no pre-run: none asked (the spec's value, else `default_s`; 0 is none), or a
    gang of one worker."""
    timeout = spec.precheck_s if spec.precheck_s is not None else default_s
    if not timeout or spec.gpus <= spec.gpus_per_worker:
        return None
    return timeout


def prerun_spec(spec: JobSpec) -> JobSpec:
    """The spec a job waits and runs with during its pre-run: one worker of its gang."""
    return replace(spec, gpus=spec.gpus_per_worker)


def precheck_problem(value: float | None) -> str | None:
    """Why a `precheck_s` is malformed (negative, not a number), or None."""
    if value is None or value >= 0:  # NaN fails `>= 0`; inf: pass only by progress or exit
        return None
    return f"precheck_s must be a number >= 0 (0: no pre-run), got {value!r}"


class PreRuns(Lifecycle):
    """The pre-runs of one scheduler: the jobs waiting for or running theirs (`jobs`, each its
    `PrecheckState`), and how many started, passed and failed."""

    def __init__(self, host: LifecycleHost, default_s: float | None) -> None:
        super().__init__()
        self.host = host
        #: The pre-run of jobs whose spec names none (None or 0: none).
        self.default_s = default_s
        self.jobs: dict[str, PrecheckState] = {}
        self.started = 0  # jobs whose pre-run started
        self.passed = 0
        self.failed = 0  # jobs ended by a failure in their pre-run

    def entered(self, job: Job, adopted: bool) -> None:
        """A new job that should run a pre-run waits as one worker from now on. An adopted job in
        the middle of its pre-run (its `PrecheckState.full` set, its spec one worker) goes on
        with it; one that never started begins one if it should; any other job runs its whole
        gang (a shell rebuilding the core gives a job found in its pre-run that record: `full`
        its own spec, `job.spec` its `prerun_spec`)."""
        if adopted:
            state = job.peek(PrecheckState)
            if state is not None and state.full is not None:
                self.jobs[job.id] = state
                return
            if job.attempts != 0 or state is not None:
                return
        timeout = precheck_timeout(job.spec, self.default_s)
        if timeout is None:
            return
        state = job.record(PrecheckState)
        state.full = job.spec
        state.timeout_s = timeout
        state.work_before = job.work_done_s
        job.spec = prerun_spec(job.spec)
        self.jobs[job.id] = state

    def starting(self, job: Job) -> tuple[bool, bool]:
        """A pre-run runs the job's first steps: nothing to restore; after it, the job starts
        over (it resumes only from attempts after its first whole one)."""
        state = self.jobs.get(job.id) if self.jobs else None
        if state is not None:
            state.attempts += 1
            if state.attempts == 1:
                self.started += 1
            return False, True
        if job.records is not None and (done := job.peek(PrecheckState)) is not None:
            return job.attempts > done.attempts, False
        return job.attempts > 0, False

    def ran(self, job: Job, ran_s: float) -> bool:
        """A pre-run's work is not the job's; its GPU time is (and the pre-run's)."""
        self.jobs[job.id].gpu_s += ran_s * job.spec.gpus
        return False

    def exited(self, job: Job, now: float) -> bool:
        self._pass(job, now, "exited")
        return True

    def failing(self, job: Job, report: FailureReport, verdict: Verdict) -> Verdict:
        """It failed on one worker: a user error, before it ever held its gang (an
        infrastructure failure retries the pre-run by the verdict)."""
        if report.infrastructure:
            return verdict
        self.failed += 1
        return Verdict(True, 0.0, f"user error: failed its pre-run on one worker ({report.reason})")

    def ended(self, job: Job) -> None:
        self._end(job)  # it reports its own spec

    def withdrawn(self, job: Job) -> None:
        self.jobs.pop(job.id, None)  # its record goes with it

    def due_at(self, job: Job) -> float:
        """When the running pre-run passes by its timer."""
        assert job.run_started_at is not None
        return job.run_started_at + self.jobs[job.id].timeout_s

    def due(self, job: Job, now: float, actions: list[Action]) -> bool:
        if self.due_at(job) > now:
            return False
        actions.append(self._stop_passed(job, now, "timer"))  # it ran its `timeout_s`: passed
        return True

    def progressed(self, job: Job, now: float) -> Preempt | None:
        return self._stop_passed(job, now, "progress")

    def counters(self) -> dict[str, int]:
        return {
            "prechecks": self.started,
            "precheck_passed": self.passed,
            "precheck_failed": self.failed,
        }

    def _stop_passed(self, job: Job, now: float, how: str) -> Preempt:
        """Stop the running pre-run, which passed (`how`), and queue the job for its gang."""
        gpus = job.placement
        self.host.stop(job, now)
        self._pass(job, now, how)
        return Preempt(job.id, gpus, PRECHECK_PASSED, precheck=True)

    def _pass(self, job: Job, now: float, how: str) -> None:
        """The stopped pre-run passed: the job waits again with its own spec, starting over."""
        state = self._end(job)
        state.passed_by = how
        self.passed += 1
        job.last_event = f"passed its pre-run ({how}); waits for its {job.spec.gpus} GPUs"
        self.host.enqueue(job, now)

    def _end(self, job: Job) -> PrecheckState:
        """The job (not indexed) leaves its pre-run: its own spec back, the pre-run's work
        dropped."""
        state = self.jobs.pop(job.id)
        assert state.full is not None
        job.spec = state.full
        state.full = None
        job.work_done_s = state.work_before
        return state


__all__ = [
    "PRECHECK_PASSED",
    "PreRuns",
    "PrecheckState",
    "precheck_problem",
    "precheck_timeout",
    "prerun_spec",
]
