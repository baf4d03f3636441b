"""The body of a scheduling round: the waiting jobs walked in the policy's order.

For each waiting job, until nothing more can change, the walk asks the round's extension points
in turn and goes on to the next job at the first that starts it:

1. admit: its retry backoff, a queue blocked this round, the admissions' `check`;
2. place: the placement, on free GPUs;
3. defragment: the stages at that point (`Stage.point`), which may move running jobs first;
4. preempt: the preemption plugin (corral.core.preempt), within the bounds below;
5. share: the stages at that point, which may start it beside a running job;
6. block: a blocking policy without backfill stops the walk (or, under an admission with queues,
   that queue: YARN's capacity scheduler); with a backfill rule that reserves (EASY,
   corral.core.backfill), that head gets its reservation, and a later job placed on free GPUs
   starts only off the GPUs reserved for it (or it ends before they are needed), as it starts
   only off the GPUs of reservations it may not use (corral.core.reservations).

Within a round a failure is remembered where it holds for the jobs behind: a job of the same kind
needing at least as many GPUs as one that did not fit cannot fit either, nor find more victims.
The walk stops early once no GPU is free (or fewer than the smallest waiting job asks), nothing
may be preempted, and no stage may start a job without free GPUs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from corral.core.index import FlatIndex
from corral.core.placement.base import Kind, Placed, not_enough, placement_kind
from corral.core.reservations import closed_gpus, place_off
from corral.core.stages import RoundHost, Stage

if TYPE_CHECKING:
    from collections.abc import Iterable

    from corral.core.actions import Action
    from corral.core.backfill import Backfill
    from corral.core.chain import AdmissionChain
    from corral.core.cluster import Cluster
    from corral.core.index import Index
    from corral.core.job import Job
    from corral.core.placement.base import Placement
    from corral.core.policy.base import Key, Policy
    from corral.core.preempt import Preemption
    from corral.core.reservations import Closed, Reservations


_NO_ROOM_OF_KIND = "no room: a job of the same kind needing fewer GPUs did not fit"
_HELD = "retry backoff: held for {:.0f} s more"


class WalkHost(RoundHost, Protocol):
    """What the walk reads and does of the scheduler."""

    #: The waiting jobs' keys, in order (the index may be replaced as jobs start).
    pending: Index
    #: Waiting jobs of whole GPUs by GPU count, and those asking for shares.
    waiting_sizes: dict[int, int]
    waiting_shares: int
    #: Each waiting job's `placement_kind` by seq, kept as it is indexed (a `pure` placement),
    #: or None: asked at each look.
    waiting_kinds: dict[int, Kind] | None
    #: The job that blocked the last walk (a blocking policy without backfill), or None.
    blocked_by: str | None
    #: GPUs claimed over time windows (corral.core.reservations).
    reservations: Reservations

    def start_on(self, job: Job, placed: Placed, now: float, actions: list[Action]) -> None: ...

    def running_jobs(self) -> Iterable[Job]: ...


class QueueWalk:
    def __init__(
        self,
        host: WalkHost,
        cluster: Cluster,
        policy: Policy,
        placement: Placement,
        admission: AdmissionChain,
        preemption: Preemption,
        stages: Sequence[Stage],
        by_seq: Mapping[int, Job],
        backfill: Backfill,
        *,
        late_preempt_check: bool = False,
    ) -> None:
        """`late_preempt_check`: ask whether a waiting job may preempt only once that matters
        (no GPU free for it, or no placement on free GPUs), so that a round whose jobs all start
        on free GPUs never reads the running jobs' keys (whose changes may then be held back,
        corral.core.timers)."""
        self.host = host
        self.cluster = cluster
        self.placement = placement
        self.admission = admission
        self.preemption = preemption
        self.by_seq = by_seq
        self.defragmenters = [s for s in stages if s.point == "defragment"]
        self.sharers = [s for s in stages if s.point == "share"]
        #: Does the walk stop at a job that does not start (policy blocking, backfill off)?
        self.blocks = policy.blocking and backfill.blocks
        #: The backfill rule that reserves for a blocking policy's head (EASY), or None.
        self.reserves = backfill if policy.blocking and backfill.reserves else None
        self._checks = admission.having("check")
        self._queues = admission.having("queue")
        self._picks = admission.picks_victims
        # Once a job may not preempt, no job behind it may in this round: their keys are higher,
        # jobs started meanwhile have lower keys than theirs, and none is preempted from here
        # on. Not so where an admission or a stage decides otherwise (a reclaim, a move).
        self._settles = not self._picks and not stages
        # Asked late, the answer is the same: the jobs placed before it was asked have lower
        # keys than the job's, and none was preempted in between (preempting needs a job that
        # may, and once one may not, no later one may).
        self._late = late_preempt_check and self._settles

    def walk(self, now: float, preempt: bool, actions: list[Action]) -> None:
        """Start (and preempt for) waiting jobs in the policy's order, as far as anything can
        change."""
        host = self.host
        host.blocked_by = None
        cluster = self.cluster
        by_seq = self.by_seq
        # Within a round, a job of the same kind (`placement_kind`) needing at least as many GPUs
        # as one that did not fit cannot fit either (and, being of lower priority, has no more
        # victims to preempt). The host may keep each waiting job's kind (`waiting_kinds`).
        kinds = host.waiting_kinds
        no_fit: dict[Kind, float] = {}
        # Both bounds on preempting hold for the later jobs with the same victims: of those GPU
        # types, and of that queue when a quota decides who may be preempted (another VC's job,
        # or one beyond its share, may take back other jobs).
        no_room: dict[tuple[Kind, tuple[frozenset[str] | None, str]], float] = {}
        too_few_victims: dict[tuple[frozenset[str] | None, str], float] = {}
        blocked_queues: set[str] = set()
        admission, placement = self.admission, self.placement
        checks, queues, picks, settles = self._checks, self._queues, self._picks, self._settles
        defragmenters, sharers = self.defragmenters, self.sharers
        sizes = host.waiting_sizes
        may_preempt_for = self.preemption.may_preempt_for
        make_room = self.preemption.make_room
        preempting = preempt
        reserves = self.reserves
        reservations = host.reservations if host.reservations.items else None
        late = self._late
        blocks = self.blocks
        root = cluster.root
        # What only a start (or a preemption) changes, read again after one: the waiting
        # queue's index (a start may swap it for the other kind), and the smallest GPU count a
        # waiting job asks for.
        done = -1
        keys: Sequence[Key] = []
        smallest = 0
        # Where nothing but a placement on free GPUs can start a job once no job may preempt
        # (no admission's check, no stage that shares, no reservation, no blocking), the jobs
        # that a smaller one of their kind did not fit are passed over in a loop of their own,
        # as the steps below would pass them over.
        skips = not checks and not sharers and reserves is None and reservations is None
        skips = skips and not blocks
        position = 0
        inf = math.inf
        while True:
            if done != len(actions):
                done = len(actions)
                pending = host.pending
                keys = pending.keys if isinstance(pending, FlatIndex) else pending
                smallest = min(sizes, default=0)
            if skips and not preempting and not (root.free_gpus < smallest or not root.free_gpus):
                end = len(keys)
                if kinds is not None:  # (the same loop, with each job's kind kept)
                    while position < end:
                        job = by_seq[keys[position][-1]]
                        if job.hold_until > now or job.spec.gpus < no_fit.get(kinds[job.seq], inf):
                            break
                        job.pending_why = _NO_ROOM_OF_KIND
                        position += 1
                else:
                    while position < end:
                        job = by_seq[keys[position][-1]]
                        if job.hold_until > now:
                            break
                        kind = placement_kind(placement, job, now)
                        if job.spec.gpus < no_fit.get(kind, inf):
                            break
                        job.pending_why = _NO_ROOM_OF_KIND
                        position += 1
            if position >= len(keys):
                break
            job = by_seq[keys[position][-1]]
            free = root.free_gpus
            # No waiting job can start on the free GPUs.
            short = free == 0 or free < smallest
            asked = not late or not preempting or short
            can_preempt = asked and preempting and may_preempt_for(job, now)
            if settles and asked and not can_preempt:
                preempting = False
            if (
                short
                and asked
                and not can_preempt
                and not host.waiting_shares
                and not (sharers and any(stage.keeps_walking() for stage in sharers))
            ):
                if not picks or not admission.someone_over_share():
                    lacking = not_enough(cluster, job) if free else None
                    job.pending_why = (
                        "waiting for free GPUs: all are in use by jobs of equal or higher priority"
                        if lacking is None
                        else lacking.why
                    )
                    break
                # A job further back, of a VC under its share, may still reclaim GPUs.
                job.pending_why = "waiting for free GPUs"
                position += 1
                continue
            if job.hold_until > now:
                job.pending_why = (_HELD, job.hold_until - now)
                position += 1
                continue
            if blocked_queues and admission.queue(job) in blocked_queues:
                job.pending_why = f"blocked behind the head job of {admission.queue(job)}"
                position += 1
                continue
            if checks:
                refusal = admission.check(job)
                if refusal is not None:
                    job.pending_why = refusal
                    position += 1
                    continue
            spec = job.spec
            kind = kinds[job.seq] if kinds is not None else placement_kind(placement, job, now)
            claimed = False
            # The GPUs claimed for others that this job may not take (asked once a placement
            # or a search for victims needs them).
            guarded = reservations is not None or (
                reserves is not None and reserves.head is not None
            )
            closed: list[Closed] = []
            if job.spec.gpus < no_fit.get(kind, inf):
                result = placement.place(cluster, job, now)
                if guarded and isinstance(result, Placed):
                    closed = _closed(job, now, reservations, reserves)
                    guarded = False  # (asked: not again for the search below)
                if closed and isinstance(result, Placed):
                    admitted = place_off(cluster, placement, job, result, now, closed)
                    if isinstance(admitted, str):
                        # It fits, on GPUs claimed for others: it neither shares its way onto
                        # them nor takes them from victims (it may preempt for others); a
                        # blocking policy without backfill stops here.
                        job.pending_why = admitted
                        claimed = True
                    else:
                        result = admitted
                if claimed:
                    pass
                elif isinstance(result, Placed):
                    host.start_on(job, result, now, actions)
                    continue
                elif defragmenters and any(
                    stage.try_start(host, job, now, actions) for stage in defragmenters
                ):
                    continue
                else:
                    no_fit[kind] = job.spec.gpus
                    job.pending_why = result.why
            else:
                job.pending_why = _NO_ROOM_OF_KIND
            if not asked:  # (late: see `_late`)
                can_preempt = preempting and may_preempt_for(job, now)
                if not can_preempt:
                    preempting = False
            if can_preempt:
                victims_kind = (spec.gpu_types, (admission.queue(job) or "") if queues else "")
                if spec.gpus < no_room.get((kind, victims_kind), math.inf) and spec.gpus < (
                    too_few_victims.get(victims_kind, math.inf)
                ):
                    if guarded:
                        closed = _closed(job, now, reservations, reserves)
                    if closed:  # nor may it take reserved GPUs its victims would free
                        self.preemption.held_out = closed_gpus(closed)
                        try:
                            outcome = make_room(job, now, actions)
                        finally:
                            self.preemption.held_out = frozenset()
                    else:
                        outcome = make_room(job, now, actions)
                    if outcome == "started":
                        # Its victims may have freed more GPUs than it took: what did not fit
                        # may now.
                        no_fit.clear()
                        continue
                    if closed:
                        pass  # (what bounds this job's search need not bound the next one's)
                    elif outcome == "too few victims":
                        too_few_victims[victims_kind] = spec.gpus
                    else:
                        no_room[(kind, victims_kind)] = spec.gpus
            if (
                sharers
                and not claimed
                and any(stage.try_start(host, job, now, actions) for stage in sharers)
            ):
                continue
            if reserves is not None and reserves.head is None:
                reserves.reserve(job, host.running_jobs(), now)
            if blocks:
                queue = admission.queue(job) if queues else None
                if queue is None:
                    host.blocked_by = job.id
                    break
                blocked_queues.add(queue)  # YARN-CS: a VC's queue blocks itself
            position += 1


def _closed(
    job: Job, now: float, reservations: Reservations | None, reserves: Backfill | None
) -> list[Closed]:
    """The GPUs `job` may not start on now: the reservations' and EASY's head's."""
    closed = reservations.closed(job, now) if reservations is not None else []
    if reserves is not None:
        closed += reserves.closed(job, now)
    return closed
