"""Reservations: GPUs claimed over a time window for some users or VCs (Slurm's `scontrol create
reservation`, an admin's demo on Thursday 14:00-18:00 or a maintenance window).

A `Reservation` names its GPUs (a count, chosen when it is made, or whole nodes), its window
(`start`, `duration_s`) and whom it serves (users, VCs; none: no one, a maintenance window).
Within the window its GPUs serve only those. Before the window, another job starts on them only
if its time limit (`JobSpec.time_limit_s`) ends by the time the window opens; a job without a
limit is unbounded, so it never does. Members start on them whenever. Jobs that run on the
GPUs when a reservation is made keep running (nothing is preempted for one).

This is the rule EASY backfill's reservation for a blocking head follows (corral.core.backfill):
a later job is placed as usual, and where its placement takes GPUs it may not use, placed again
with those GPUs held out (the ones that are free; the others are not its to take anyway). The
walk (corral.core.walk) asks `Reservations.closed` of every job a placement places on free
GPUs, and holds the same GPUs out of a preemption's placements for the job (its victims may free
reserved GPUs: it takes none of them). Starts by a round stage (a job packed beside a running
one, a migration) are not asked. The scheduler wakes at each window's start and end while jobs
wait. Pure: times are the shell's clock, given in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from corral.core.placement.base import Placed

if TYPE_CHECKING:
    from corral.core.cluster import Cluster
    from corral.core.job import Job
    from corral.core.placement.base import NotPlaced, Placement


#: GPUs a job may not start on, and why (the job's pending reason where it cannot start).
Closed = tuple[frozenset[int], str]


def place_off(
    cluster: Cluster,
    placement: Placement,
    job: Job,
    placed: Placed,
    now: float,
    closed: list[Closed],
) -> Placed | str:
    """Where the job may start: `placed` where it takes none of the `closed` GPUs, else placed
    again with the free ones held out; or the reason of the first set it would take."""
    held_out = closed_gpus(closed)
    if held_out.isdisjoint(placed.gpus):
        return placed
    again = place_held_out(cluster, placement, job, now, held_out)
    if isinstance(again, Placed):
        return again
    return next(reason for gpus, reason in closed if not gpus.isdisjoint(placed.gpus))


def closed_gpus(closed: list[Closed]) -> frozenset[int]:
    """Every GPU of `closed`."""
    return frozenset().union(*(gpus for gpus, _ in closed))


def place_held_out(
    cluster: Cluster, placement: Placement, job: Job, now: float, held_out: frozenset[int]
) -> Placed | NotPlaced:
    """`placement.place` with the free GPUs of `held_out` taken for the time of the call (the
    others are not free anyway)."""
    held = [gpu for gpu in sorted(held_out) if cluster.gpu_free[gpu]]
    cluster.allocate(held)
    try:
        return placement.place(cluster, job, now)
    finally:
        cluster.release(held)


class ReservationError(ValueError):
    """A reservation that cannot be made as asked (one line, naming the field)."""


@dataclass(frozen=True, slots=True)
class Reservation:
    name: str
    start: float
    duration_s: float
    #: The GPUs it claims (ids of the scheduler's cluster).
    gpus: tuple[int, ...]
    users: frozenset[str] = field(default_factory=frozenset)
    vcs: frozenset[str] = field(default_factory=frozenset)

    @property
    def end(self) -> float:
        return self.start + self.duration_s

    def serves(self, job: Job) -> bool:
        return job.spec.user in self.users or job.spec.vc in self.vcs

    def who(self) -> str:
        names = [f"user {u}" for u in sorted(self.users)] + [f"VC {v}" for v in sorted(self.vcs)]
        return ", ".join(names) or "no one"


def choose_gpus(
    cluster: Cluster,
    *,
    gpus: int | None = None,
    nodes: Sequence[str] = (),
    taken: Iterable[int] = (),
    busy_until: Mapping[int, float] | None = None,
    start: float = 0.0,
) -> tuple[int, ...]:
    """The GPUs a reservation claims: every GPU of the nodes named, or `gpus` of them, none that
    another reservation of an overlapping window already claims (`taken`). A count prefers GPUs
    free when the window opens at `start`: first those idle now, then those whose jobs end by
    their time limits by `start` (`busy_until`: a busy GPU's latest end, infinite for a job
    without a limit; a GPU not in it is idle), each of the two whole nodes first, from the last
    node back (placements fill the first nodes first); only then GPUs whose jobs run into the
    window, the earliest to end first."""
    if (gpus is None) == (not nodes):
        raise ReservationError("gpus or nodes: give one of them")
    busy = set(taken)
    if nodes:
        by_name = {node.name: node.index for node in cluster.nodes}
        chosen: list[int] = []
        for name in nodes:
            if name not in by_name:
                raise ReservationError(f"nodes: no node {name!r} in the cluster")
            ids = cluster.node_gpus[by_name[name]]
            if busy.intersection(ids):
                raise ReservationError(f"nodes: node {name} is reserved in that window already")
            chosen += ids
        return tuple(sorted(set(chosen)))
    assert gpus is not None
    if gpus <= 0:
        raise ReservationError(f"gpus: must be a positive integer, got {gpus}")
    ends = busy_until or {}
    idle = [g for g in range(len(cluster.gpus)) if g not in busy and g not in ends]
    free_by_start = [g for g in ends if g not in busy and ends[g] <= start]
    chosen = _whole_nodes_first(cluster, idle, gpus)
    chosen += _whole_nodes_first(cluster, free_by_start, gpus - len(chosen))
    if len(chosen) < gpus:
        chosen += _running_into(cluster, ends, busy, start)[: gpus - len(chosen)]
    if len(chosen) < gpus:
        raise ReservationError(
            f"gpus: {gpus} asked, {len(chosen)} not reserved already in that window"
        )
    return tuple(sorted(chosen))


def _whole_nodes_first(cluster: Cluster, candidates: Iterable[int], count: int) -> list[int]:
    """Up to `count` of `candidates`: the nodes with most of them first, ties from the last
    node back."""
    on_node: dict[int, list[int]] = {}
    for gpu in sorted(candidates):
        on_node.setdefault(cluster.gpu_node[gpu], []).append(gpu)
    order = sorted(on_node, key=lambda node: (-len(on_node[node]), -node))
    return [gpu for node in order for gpu in on_node[node]][: max(count, 0)]


def _running_into(
    cluster: Cluster, busy_until: Mapping[int, float], taken: set[int], start: float
) -> list[int]:
    """The GPUs whose jobs run past `start`, not `taken`, the earliest to end first (ties: from
    the last node back)."""
    late = [g for g in busy_until if g not in taken and busy_until[g] > start]
    return sorted(late, key=lambda g: (busy_until[g], -cluster.gpu_node[g], g))


class Reservations:
    """The reservations a scheduler honours, by name."""

    def __init__(self, cluster: Cluster, placement: Placement) -> None:
        self.cluster = cluster
        self.placement = placement
        self.items: dict[str, Reservation] = {}

    def __bool__(self) -> bool:
        return bool(self.items)

    def add(self, reservation: Reservation) -> None:
        if reservation.name in self.items:
            raise ReservationError(f"name: a reservation {reservation.name!r} exists already")
        if not reservation.duration_s > 0:
            raise ReservationError(f"duration: must be positive, got {reservation.duration_s}")
        if not reservation.gpus or any(
            not 0 <= gpu < len(self.cluster.gpus) for gpu in reservation.gpus
        ):
            raise ReservationError("gpus: not GPUs of this cluster")
        for other in self.items.values():
            if (
                other.start < reservation.end
                and reservation.start < other.end
                and set(other.gpus) & set(reservation.gpus)
            ):
                raise ReservationError(
                    f"gpus: reservation {other.name} claims some of them in that window"
                )
        self.items[reservation.name] = reservation

    def remove(self, name: str) -> Reservation:
        if name not in self.items:
            raise ReservationError(f"name: no reservation {name!r}")
        return self.items.pop(name)

    def taken(self, start: float, end: float) -> set[int]:
        """The GPUs reservations claim at some instant of [start, end)."""
        return {
            gpu
            for other in self.items.values()
            if other.start < end and start < other.end
            for gpu in other.gpus
        }

    def forget_ended(self, now: float) -> None:
        for name in [name for name, r in self.items.items() if r.end <= now]:
            del self.items[name]

    def closed_to(self, job: Job, now: float) -> list[Reservation]:
        """The reservations whose GPUs the job may not start on now."""
        if not self.items:
            return []
        ends_by = now + job.limit_left_s(now)
        return [
            r
            for r in self.items.values()
            if now < r.end and not r.serves(job) and (now >= r.start or ends_by > r.start)
        ]

    def closed(self, job: Job, now: float) -> list[Closed]:
        """The GPUs the job may not start on now, each set with why."""
        return [
            (
                frozenset(r.gpus),
                f"reservation {r.name} keeps {len(r.gpus)} GPUs for {r.who()} "
                f"from t={r.start:.0f} to t={r.end:.0f}",
            )
            for r in self.closed_to(job, now)
        ]

    def ends_after(self, now: float) -> list[float]:
        """The instants windows close after `now`."""
        return sorted(r.end for r in self.items.values() if r.end > now)

    def next_boundary(self, now: float) -> float:
        """The next window start or end after `now` (infinite: none)."""
        return min(
            (t for r in self.items.values() for t in (r.start, r.end) if t > now),
            default=math.inf,
        )

    def boundary_between(self, after: float, until: float) -> bool:
        """A window opened or closed in (after, until]."""
        return any(after < t <= until for r in self.items.values() for t in (r.start, r.end))


__all__ = [
    "Closed",
    "Reservation",
    "ReservationError",
    "Reservations",
    "choose_gpus",
    "closed_gpus",
    "place_held_out",
    "place_off",
]
