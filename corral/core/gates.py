"""The gates a job waits at before the core is given it: a hold, its dependencies, its array's cap.

Pure: the shells keep the gated jobs and ask `gate_reason` each round, in `gate_order`; the live
manager (corral.server.controls) with its store's statuses, the simulator's replay of an exported
history (corral.sim.engine) with its own. The core never knows gates exist: a job whose gates
open is submitted to it then (its submit time kept), or adopted with its history if it ran
before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

#: Statuses a job never leaves.
ENDED = ("SUCCEEDED", "FAILED", "CANCELLED", "REFUSED")


@dataclass(frozen=True, slots=True)
class Gates:
    """What a job waits for besides the core: `after`, the jobs that must succeed first; its
    array (`array`, the array's id) and the array's cap on tasks in the core at once."""

    after: tuple[str, ...] = ()
    array: str | None = None
    cap: int | None = None

    @property
    def capped(self) -> bool:
        return self.array is not None and self.cap is not None

    def any(self, held: bool) -> bool:
        """Whether the job waits at a gate at all (otherwise it goes to the core at once)."""
        return held or self.capped or bool(self.after)


def gate_reason(
    held_by: str | None,
    gates: Gates,
    status_of: Callable[[str], str | None],
    in_core: Mapping[str, int],
) -> tuple[str | None, bool]:
    """Why the job still waits at a gate (None: it may be queued), and whether that is the end of
    it (a dependency that will never succeed: the job fails without starting). `status_of` gives
    a job's status (None: no such job); `in_core`, each array's tasks in the core now."""
    if held_by is not None:
        return f"held by {held_by}", False
    waiting = []
    for parent in gates.after:
        status = status_of(parent)
        if status == "SUCCEEDED":
            continue
        if status is None or status in ENDED:
            word = {None: "is unknown", "FAILED": "failed"}.get(
                status, f"was {str(status).lower()}"
            )
            return f"dependency {parent} {word}", True
        waiting.append(parent)
    if waiting:
        return f"waiting for {', '.join(waiting)} to succeed", False
    if gates.capped and in_core.get(gates.array or "", 0) >= (gates.cap or 0):
        return f"array cap {gates.cap} reached", False
    return None, False


def gate_order(job_ids: Iterable[str]) -> list[str]:
    """The order the gated jobs are looked at each round: by id (numeric ids as numbers)."""
    return sorted(
        job_ids, key=lambda job_id: (0, int(job_id), "") if job_id.isdigit() else (1, 0, job_id)
    )
