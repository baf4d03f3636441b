"""Failures the simulator replays: nodes that die and come back, and Philly's failure classes.

The core decides what a failure means (`corral.core.retry`: the backoff before a retry, and the
user-error rule that ends a job failing the same way, fast, again and again); these models only
say when attempts fail, and how.

`NodeFailures(mtbf_s, mttr_s)`: every node fails after an exponential time with mean `mtbf_s`
and comes back after an exponential time with mean `mttr_s`, again and again, independent of
what runs on it. The attempts on a failing node end as infrastructure failures (they do not use
up the job's retries) and its GPUs stay out of allocation until it recovers.

`PhillyFailures`: two of the failure classes of Jeon et al., "Analysis of Large-Scale Multi-Tenant
GPU Clusters for DNN Training Workloads" (USENIX ATC 2019, arXiv:1901.05758), which studied the
failures of Microsoft's Philly cluster:

* **User errors** (the code or the configuration: a bad import, a wrong path, a syntax error):
  a property of the job, drawn once. A job with one fails every attempt the same way (one
  signature), `user_error_s` seconds after the attempt starts (drawn once per job, uniform in that
  range), so the core's user-error rule ends it after `fast_fail_repeats` + 1 attempts when that
  time is within `fast_fail_s`; a slower user error is retried until `max_retries`.
* **Infrastructure failures** (a GPU, the network, the storage): any attempt of a g-GPU job
  fails after an exponential time with mean `infra_mtbf_gpu_h` / g hours (bigger gangs fail
  sooner), each with its own signature, with `infrastructure=True`: they never use up a job's
  retries, and a job never fails for them alone (unless it keeps failing the same way, fast).

The numbers, and where they come from:

| number | value | source | checked |
|---|---|---|---|
| Philly trace size | 117,325 jobs submitted 2017-08-07 to 2017-12-22 | msr-fiddle/philly-traces README | yes |
| final job states | `Pass`, `Killed`, `Failed`; each job lists its attempts (retries) | same README (`cluster_job_log` schema) | yes |
| failures are studied by class (infrastructure, AI engine, user) and user errors are many, early, and repeat on retries | - | the ATC'19 paper, Section 4 ("Job Failures"); its abstract names "failures during training" as one of its three studies | the abstract only: the section's text and tables could not be retrieved here |
| share of jobs with a user error, `user_error_share` | 0.10 | assumption | no: the paper's failure shares per class could not be checked; the trace's `Failed` share needs the 1 GB trace, which is not here |
| time to a user error, `user_error_s` | uniform 5..120 s | assumption ("within the first minutes") | no: the paper's runtime-to-failure figures could not be checked |
| infrastructure failure rate, `infra_mtbf_gpu_h` | one per 5,000 GPU-hours of running | assumption | no: not checked against the paper |
| retries per job, `max_retries` | 3 (as `FailureModel`) | assumption | no: Philly's retry limit could not be checked |

The third-party summary at emergentmind.com/papers/1901.05758 says the paper finds about 30 % of
jobs fail, mostly from user errors; that is not the paper's text and no number here rests on it.
The assumptions are options: set them from the paper's tables (or from the trace, counting
`Failed` jobs and their attempts) when those are at hand.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from corral.core.job import JobSpec

if TYPE_CHECKING:
    import numpy as np

#: The reason and signature of a simulated user error: the same on every attempt of the job.
USER_ERROR = "simulated user error"
#: The reason of a simulated infrastructure failure (its signature adds the attempt number).
INFRA_FAILURE = "simulated infrastructure failure"


@dataclass(frozen=True, slots=True)
class AttemptFailure:
    """An attempt drawn to fail `after_s` wall seconds after it starts, and how."""

    after_s: float
    reason: str
    signature: str
    infrastructure: bool = False
    #: The job ends (FAILED) whatever its retries (it ran past its time limit).
    give_up: bool = False


@dataclass(frozen=True, slots=True)
class NodeFailures:
    """Every node fails after Exp(mean `mtbf_s`) seconds up and recovers after Exp(mean
    `mttr_s`) seconds down, independently of the others and of its jobs."""

    mtbf_s: float
    mttr_s: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.mtbf_s) and self.mtbf_s > 0):
            raise ValueError(f"node failures: MTBF must be a positive number, got {self.mtbf_s}")
        if not (math.isfinite(self.mttr_s) and self.mttr_s >= 0):
            raise ValueError(f"node failures: MTTR must be a number >= 0, got {self.mttr_s}")

    def up_for(self, rng: np.random.Generator) -> float:
        return float(rng.exponential(self.mtbf_s))

    def down_for(self, rng: np.random.Generator) -> float:
        return float(rng.exponential(self.mttr_s)) if self.mttr_s > 0 else 0.0

    @classmethod
    def parse(cls, text: str) -> NodeFailures:
        """`MTBF,MTTR` in seconds, as a CLI flag gives it (e.g. `86400,3600`)."""
        parts = [p.strip() for p in text.split(",")]
        if len(parts) != 2:
            raise ValueError(f"--node-failures: expected MTBF,MTTR in seconds, got {text!r}")
        try:
            mtbf, mttr = float(parts[0]), float(parts[1])
        except ValueError:
            raise ValueError(
                f"--node-failures: expected MTBF,MTTR in seconds, got {text!r}"
            ) from None
        return cls(mtbf, mttr)


@dataclass(frozen=True, slots=True)
class PhillyFailures:
    """User errors (a per-job property) and infrastructure failures (per attempt), after Philly;
    see the module's docstring for the numbers and their sources."""

    user_error_share: float = 0.10
    user_error_s: tuple[float, float] = (5.0, 120.0)
    infra_mtbf_gpu_h: float = 5000.0
    max_retries: int = 3

    def __post_init__(self) -> None:
        if not 0.0 <= self.user_error_share <= 1.0:
            raise ValueError(
                f"philly failures: user_error_share must be in [0, 1], got {self.user_error_share}"
            )
        low, high = self.user_error_s
        if not 0.0 <= low <= high:
            raise ValueError(
                f"philly failures: user_error_s must be 0 <= low <= high, got {self.user_error_s}"
            )
        if not self.infra_mtbf_gpu_h > 0:
            raise ValueError(
                f"philly failures: infra_mtbf_gpu_h must be > 0, got {self.infra_mtbf_gpu_h}"
            )
        if self.max_retries < 0:
            raise ValueError(f"philly failures: max_retries must be >= 0, got {self.max_retries}")

    def user_errors(self, specs: Sequence[JobSpec], rng: np.random.Generator) -> dict[str, float]:
        """Which jobs have a user error, and how long after an attempt's start it shows (drawn
        once per job, in the order given: two numbers for every job, so the draws of one job do
        not depend on the others')."""
        low, high = self.user_error_s
        errors: dict[str, float] = {}
        for spec in specs:
            has_error, position = rng.random(2)
            if has_error < self.user_error_share:
                errors[spec.id] = low + (high - low) * float(position)
        return errors

    def draw(
        self,
        gpus: int,
        attempt: int,
        runs_for: float,
        user_error_after_s: float | None,
        rng: np.random.Generator,
    ) -> AttemptFailure | None:
        """How the attempt that would run `runs_for` seconds ends early, if it does. A job with a
        user error fails every attempt (at the latest when it would have ended)."""
        infra_after = float(rng.exponential(self.infra_mtbf_gpu_h * 3600.0 / max(gpus, 1)))
        if user_error_after_s is not None and user_error_after_s <= infra_after:
            return AttemptFailure(min(user_error_after_s, runs_for), USER_ERROR, USER_ERROR)
        if infra_after < runs_for:
            return AttemptFailure(
                infra_after, INFRA_FAILURE, f"{INFRA_FAILURE} (attempt {attempt})", True
            )
        return None


__all__ = ["INFRA_FAILURE", "USER_ERROR", "AttemptFailure", "NodeFailures", "PhillyFailures"]
