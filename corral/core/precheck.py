"""A job's pre-run ("precheck"): its first steps on one worker before it holds its whole gang.

Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN Training Workloads"
(USENIX ATC 2019) found many of Philly's failures to be user errors (the code, the configuration)
that show up in a job's first minutes, and proposed running a job's first iterations on a small
allocation before it is given all its GPUs: a gang that would only fail wastes one worker's GPUs,
not all of them, and does not wait for a whole gang to be free first.

How the scheduler (`corral.core.scheduler.Scheduler`) runs it:

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

from corral.core.job import JobSpec

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


__all__ = [
    "PRECHECK_PASSED",
    "PrecheckState",
    "precheck_problem",
    "precheck_timeout",
    "prerun_spec",
]
