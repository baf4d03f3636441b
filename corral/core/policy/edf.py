"""Earliest deadline first, with each job on the GPU count it asked for.

The baseline ElasticFlow is compared with (Gu et al., ASPLOS'23, evaluation): a job with an earlier
deadline goes first and preempts running jobs whose deadlines are later; a job without a deadline
sorts after every job with one. Nothing is refused: a job that misses its deadline still runs to
completion (the simulator counts it as missed).

`elasticflow` is the same order without preemption: the queue order of the jobs inside
`core.elastic.ElasticScheduler`, which sizes, preempts and places them itself.
"""

from __future__ import annotations

import math

from corral.core.job import Job
from corral.core.policy.base import Key, Policy, tie_break


def deadline_of(job: Job) -> float:
    return job.spec.deadline if job.spec.deadline is not None else math.inf


class EarliestDeadlineFirst(Policy):
    name = "edf"
    summary = "earliest deadline first, preemptive, each job on the GPUs it asked for"
    preemptive = True

    def key(self, job: Job, now: float) -> Key:
        return (deadline_of(job), *tie_break(job))

    def describe_key(self, job: Job, now: float) -> str:
        deadline = job.spec.deadline
        if deadline is None:
            return "no deadline"
        return f"deadline in {deadline - now:.0f}s" if deadline >= now else "deadline passed"


class ElasticFlowOrder(EarliestDeadlineFirst):
    name = "elasticflow"
    summary = "ElasticFlow: deadline order inside its own admission and gang sizing"
    admission = "elasticflow"
    preemptive = False
