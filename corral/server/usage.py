"""Usage accounting over a period, per user or per VC (`corral usage`, GET /api/v1/usage).

GPU-hours: each attempt's GPUs (a share of one GPU: its share) x the part of its run inside the
period; an attempt still running counts up to `now`, one whose end was never recorded up to its
job's end. Jobs: submitted in the period, and ended in it by status. Queueing: of the jobs whose
first attempt started in the period, the mean and the 95th percentile (nearest rank) of the time
from submission to that start. The store reads the rows that touch the period (two queries);
this module adds them up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from corral.server.store import Store

GROUPINGS = ("user", "vc")
#: Statuses every row lists (0 when none ended so); others appear when some did (REFUSED).
ENDED = ("SUCCEEDED", "FAILED", "CANCELLED")
TOTAL = "total"


@dataclass(slots=True)
class _Row:
    gpu_s: float = 0.0
    submitted: int = 0
    finished: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ENDED, 0))
    waits: list[float] = field(default_factory=list)

    def view(self, key: str) -> dict[str, Any]:
        waits = sorted(self.waits)
        return {
            "key": key,
            "gpu_hours": self.gpu_s / 3600,
            "submitted": self.submitted,
            "finished": dict(self.finished),
            "started": len(waits),
            "mean_wait_s": sum(waits) / len(waits) if waits else None,
            "p95_wait_s": nearest_rank(waits, 0.95),
        }


def nearest_rank(ordered: list[float], q: float) -> float | None:
    """The smallest value that at least `q` of `ordered` (sorted) do not exceed."""
    if not ordered:
        return None
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def share_of(gpus: int, share: float | None) -> float:
    """GPUs an attempt counts for: its GPUs, or the share of its one GPU."""
    if share is not None and 0 < share < 1:
        return share * gpus
    return float(gpus)


def usage_report(
    store: Store,
    since: float,
    until: float,
    by: str,
    now: float,
    visible_to: tuple[str, str | None] | None = None,
) -> dict[str, Any]:
    """Usage in [since, until) per `by` ("user" or "vc"), and the total; ValueError (naming the
    parameter) for a period or grouping that makes no sense."""
    if by not in GROUPINGS:
        raise ValueError(f"by: must be one of {', '.join(GROUPINGS)} (got {by!r})")
    for name, value in (("since", since), ("until", until)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name}: must be a time in epoch seconds (got {value!r})")
    if until <= since:
        raise ValueError(f"until: must be after since ({until:g} <= {since:g})")
    rows: dict[str, _Row] = {}
    total = _Row()

    def row_of(user: str, vc: str) -> _Row:
        key = user if by == "user" else vc
        return rows.setdefault(key, _Row())

    for attempt in store.usage_attempts(since, until, visible_to):
        ended = attempt.ended_at if attempt.ended_at is not None else now
        inside = min(ended, until) - max(attempt.started_at, since)
        if inside <= 0:
            continue
        gpu_s = share_of(attempt.gpus, attempt.share) * inside
        row_of(attempt.user, attempt.vc).gpu_s += gpu_s
        total.gpu_s += gpu_s
    for job in store.usage_jobs(since, until, visible_to):
        mine = row_of(job.user, job.vc)
        for counted in (mine, total):
            if since <= job.submitted_at < until:
                counted.submitted += 1
            if job.finished_at is not None and since <= job.finished_at < until:
                counted.finished[job.status] = counted.finished.get(job.status, 0) + 1
            if job.started_at is not None and since <= job.started_at < until:
                counted.waits.append(max(0.0, job.started_at - job.submitted_at))
    return {
        "since": since,
        "until": until,
        "by": by,
        "rows": [rows[key].view(key) for key in sorted(rows)],
        "total": total.view(TOTAL),
    }
