"""FIFO as YARN's capacity scheduler ran it in Philly: arrival order, never preempts.

A head job that cannot be placed blocks every job behind it (head-of-line blocking) unless the
scheduler runs with backfill, which lets smaller jobs that fit pass it.
"""

from __future__ import annotations

from corral.core.job import Job
from corral.core.policy.base import Key, Policy, tie_break


class Fifo(Policy):
    name = "fifo"
    summary = "first come, first served; the head job blocks the queue (YARN-CS, as Philly ran it)"
    blocking = True

    def key(self, job: Job, now: float) -> Key:
        return tie_break(job)
