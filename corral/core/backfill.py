"""Backfill: which jobs may pass a blocking policy's head that does not start.

A blocking policy (fifo) stops its walk at the first waiting job that does not start, the head.
The `backfill` option (`CoreOptions.backfill`, `--backfill`) chooses a rule from `BACKFILLS`:

- `none`: the walk stops at the head (head-of-line blocking, as YARN's capacity scheduler);
- `greedy`: every later job that fits starts, whenever (a large head may starve);
- `easy`: EASY backfill, as Slurm's backfill plugin with time limits. The head gets a
  reservation at its earliest start: on the cluster as it is, the running jobs are released
  tentatively (a `Statement`, discarded after) in the order their time limits end (started +
  what is left of `JobSpec.time_limit_s`; a job without a limit never ends), until the
  placement fits the head, each time placed as the walk will place it: held off the GPUs of
  the admin reservations it may not start on then only where its placement takes some
  (corral.core.reservations.place_off; a window's end is an instant to try too). That instant is
  the shadow time and that placement the head's reserved GPUs. A later job then starts only if it ends by its own time limit at the latest by
  the shadow time, or on GPUs outside the reservation (placed again with the reserved free GPUs
  held out where its first placement took some). A job without a time limit is unbounded.
  Where no release of bounded jobs makes room for the head, it gets no reservation and later
  jobs start as under `greedy` (nothing is known of when the GPUs it needs come free).

The walk (corral.core.walk) asks a rule only through `Backfill`: `blocks` (does it stop at the
head), `reserve` (a head did not start) and `closed` (the GPUs a later job may not start on,
which the walk holds out as it does a reservation's: corral.core.reservations.place_off).
`none` and `greedy` compute nothing; `easy` computes one reservation per round, for the round's
first head (under an admission with queues too: one head for the whole round).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar

from corral.core.placement.base import NotPlaced, Placed
from corral.core.reservations import Closed, place_off
from corral.core.statement import Statement

if TYPE_CHECKING:
    from corral.core.cluster import Cluster
    from corral.core.job import Job
    from corral.core.placement.base import Placement
    from corral.core.reservations import Reservations


class Backfill:
    """A backfill rule. The base is `greedy`: it never stops at the head, never refuses."""

    name: ClassVar[str] = "greedy"
    summary: ClassVar[str] = "every later job that fits passes the head, whenever it ends"
    #: The walk stops at a blocking policy's head that does not start.
    blocks: ClassVar[bool] = False
    #: It reserves for the head (`reserve`, `admit` are asked).
    reserves: ClassVar[bool] = False
    #: The round's head that got a reservation (`reserve` asked), or None.
    head: str | None = None

    def __init__(
        self, cluster: Cluster, placement: Placement, reservations: Reservations | None = None
    ) -> None:
        self.cluster = cluster
        self.placement = placement
        #: The admin reservations the scheduler honours (the head's shadow honours them too).
        self.reservations = reservations

    def new_round(self) -> None:
        """A round begins: what was reserved in the last one is forgotten."""

    def reserve(self, head: Job, running: Iterable[Job], now: float) -> None:
        """The head of a blocking policy did not start: reserve for it (only if `reserves`)."""

    def closed(self, job: Job, now: float) -> list[Closed]:
        """The GPUs a later job may not start on (corral.core.reservations.place_off), each
        set with why: none but under `easy`."""
        return []


class NoBackfill(Backfill):
    name = "none"
    summary = "the walk stops at the head (head-of-line blocking)"
    blocks = True


class GreedyBackfill(Backfill):
    pass


def limit_end(job: Job, now: float) -> float:
    """The instant the job ends at the latest by its time limit, were it running from `now` on
    (running: its attempt's; waiting: one started now); infinite without a limit."""
    return now + job.limit_left_s(now)


class EasyBackfill(Backfill):
    name = "easy"
    summary = (
        "the head gets a reservation at its earliest start by the running jobs' time limits; "
        "a later job starts only if its time limit ends before then or it stays off the "
        "reserved GPUs (EASY backfill; a job without a time limit is unbounded)"
    )
    reserves = True

    def __init__(
        self, cluster: Cluster, placement: Placement, reservations: Reservations | None = None
    ) -> None:
        super().__init__(cluster, placement, reservations)
        #: The round's head: its id, the shadow time and its reserved GPUs (None: none yet).
        self.head = None
        self.shadow = math.inf
        self.reserved: frozenset[int] = frozenset()

    def new_round(self) -> None:
        self.head = None
        self.shadow = math.inf
        self.reserved = frozenset()

    def reserve(self, head: Job, running: Iterable[Job], now: float) -> None:
        if self.head is not None:
            return  # one reservation a round: the first head's
        self.head = head.id
        found = self.shadow_of(head, running, now)
        if found is None:
            head.pending_reason += (
                "; no reservation: jobs without a time limit hold the GPUs it needs"
            )
            return
        self.shadow, placed = found
        self.reserved = frozenset(placed.gpus)
        head.pending_reason += f"; reserved {len(placed.gpus)} GPUs to start by t={self.shadow:.0f}"

    def shadow_of(
        self, head: Job, running: Iterable[Job], now: float
    ) -> tuple[float, Placed] | None:
        """The head's earliest start by the running jobs' time limits and the admin reservations,
        and where: the running jobs released tentatively, earliest limit first, until the
        placement fits it, at each instant as the walk will place it then (`place_head`: off
        the GPUs of the reservations it may not start on where it takes some); a reservation's
        window closing is an instant too, releasing nothing."""
        events: list[tuple[float, int, Job | None]] = [
            (max(now, limit_end(job, now)), job.seq, job)
            for job in running
            if job.spec.time_limit_s is not None
        ]
        if self.reservations:
            events += [(end, -1, None) for end in self.reservations.ends_after(now)]
        events.sort(key=lambda event: (event[0], event[1]))
        statement = Statement(self.cluster)
        try:
            for end, _, job in events:
                if job is not None:
                    statement.free(job)
                placed = self.place_head(head, end)
                if isinstance(placed, Placed):
                    return end, placed
            return None
        finally:
            statement.discard()

    def place_head(self, head: Job, at: float) -> Placed | NotPlaced:
        """The head's placement were it to start at `at`, as the walk would place it then: as
        usual, and where that takes reserved GPUs it may not use then (a window it would run
        into, or is open), again with those held out (`place_off`). Holding free GPUs out from
        the first may choose other GPUs (a best fit counts each node's free GPUs)."""
        placed = self.placement.place(self.cluster, head, at)
        if not isinstance(placed, Placed) or not self.reservations:
            return placed
        closed = self.reservations.closed(head, at)
        if not closed:
            return placed
        admitted = place_off(self.cluster, self.placement, head, placed, at, closed)
        return admitted if isinstance(admitted, Placed) else NotPlaced(admitted)

    def closed(self, job: Job, now: float) -> list[Closed]:
        if self.head is None or self.shadow == math.inf or limit_end(job, now) <= self.shadow:
            return []
        return [(self.reserved, f"would delay job {self.head} reserved at t={self.shadow:.0f}")]


#: The backfill rules by name (`CoreOptions.backfill`).
BACKFILLS: dict[str, type[Backfill]] = {
    "none": NoBackfill,
    "greedy": GreedyBackfill,
    "easy": EasyBackfill,
}

#: What a config's old boolean `backfill` means (`backfill: true`, `--backfill` alone).
BACKFILL_ALIASES: dict[str, str] = {"true": "greedy", "false": "none"}


def backfill_name(value: str | bool) -> str:
    """The rule's name for a config value (an old boolean too)."""
    if isinstance(value, bool):
        return "greedy" if value else "none"
    return value


def make_backfill(
    value: str | bool,
    cluster: Cluster,
    placement: Placement,
    reservations: Reservations | None = None,
) -> Backfill:
    name = backfill_name(value)
    if name not in BACKFILLS:
        raise ValueError(f"backfill: unknown rule {name!r}; choose one of {', '.join(BACKFILLS)}")
    return BACKFILLS[name](cluster, placement, reservations)


__all__ = [
    "BACKFILLS",
    "BACKFILL_ALIASES",
    "Backfill",
    "EasyBackfill",
    "backfill_name",
    "limit_end",
    "make_backfill",
]
