"""When the scheduler must look at a job again without being told: its timers.

A job's key (`Policy.key_changes_at`: a LAS queue's demotion), its placement's mode (relaxed
after a wait), its retry backoff and a lifecycle plugin's own timer (a pre-run's limit) change at
instants the policy and plugins announce. `Timers` keeps one timer per job (a later one replaces
it: each carries the job's timer version) in three heaps:

* due timers wake the scheduler (`next_wake`) and are taken at the first round at or after
  their instant (`fire`);
* lazy ones, of a policy whose key changes do not wake it (`Policy.rekey_wakes` false: Tiresias's
  simulator), are taken at the first round at or after their instant, which something else wakes;
* idle ones, a running job's key changes where a round with no job waiting does nothing (the
  scheduler's quiet rounds, `Scheduler._may_repeat`): they wake the scheduler only while a job
  waits, and are otherwise taken, each at its own instant, at the next round or before the job
  stops or changes (`catch_up`), as the rounds they did not wake would have.

Lazy timers of running jobs that come due while no job waits are held back (`_held`), where the
policy allows it (`Policy.pure_rekeys`): nothing reads a running job's key then (the walk has no
job to place, and `running_jobs` takes them first). The rounds they came due at are noted, and
once a job waits again (or something asks for the running jobs) each job's key is taken at the
last round its chain of timers came due at (`_replay`): its timers are followed through the
noted rounds by `key_changes_at` alone (`Policy.held_rekey`, which Gittins answers by jumping
to the chain's end where no float's rounding can change it), and the job is re-keyed once, as
the rounds would have left it. Under the Tiresias preset's Gittins index, whose key changes at
each of 1,000 levels, those re-keys were most of a run.

Most reads only ask whether a waiting job may preempt the lowest running one, and most answers
are no. The held changes are taken only where a bound cannot answer (`held_bound`): each held
job's key, once taken, sorts at or before the policy's `held_bound` of it, which holds until an
instant the policy names (Gittins: its index levels' highest key head up to the level the job
has reached, which only grows; a bound below the highest so far may last longer), and the
preemption answers no where the job may not preempt the highest of those bounds and of the keys
held now (`Preemption.may_preempt_for`).

A policy's own wake-ups, where key changes do not wake (`Policy.wakes_at`), are bounded per
running attempt (`Policy.wake_bound`) and searched lazily (`earliest_wake`), so that a round asks
only the jobs whose bound lies before the earliest wake-up found so far.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from corral.core.job import JobStatus

if TYPE_CHECKING:
    from corral.core.actions import Action
    from corral.core.job import Job, JobSpec
    from corral.core.lifecycle import Lifecycle
    from corral.core.placement.base import Placement
    from corral.core.policy.base import Key, Policy

#: Job states read as module globals: a member looked up on its enum class costs several times as
#: much (as in corral.core.job), and these are asked at every start, stop, timer and key.
_RUNNING = JobStatus.RUNNING
_PENDING = JobStatus.PENDING
_INF = math.inf

#: A timer: (instant, job seq, the job's timer version when it was set).
Timer = tuple[float, int, int]


class TimerHost(Protocol):
    def rekey(self, job: Job, now: float) -> None:
        """Re-key the job in its queue at its timer (which sets its next one)."""
        ...

    def rekey_to(self, job: Job, now: float, key: Key, changes_at: float) -> None:
        """`rekey`, given the policy's `stored_key` and `key_changes_at` of the job at `now`."""
        ...

    def rekey_each(self, taken: list[tuple[Job, float, Key, float]]) -> None:
        """`rekey_to` of each running job (job, now, key, changes_at), as one after the other."""
        ...


class Timers:
    def __init__(
        self,
        host: TimerHost,
        policy: Policy,
        placement: Placement,
        lifecycle: Lifecycle,
        by_seq: Mapping[int, Job],
        idle_when_running: bool,
    ) -> None:
        """`by_seq`: the scheduler's jobs by seq (read only). `idle_when_running`: a running
        job's key changes matter only while a job waits (they go to the idle heap)."""
        self.host = host
        self.policy = policy
        self.placement = placement
        self.lifecycle = lifecycle
        self._followed = lifecycle.jobs
        self._by_seq = by_seq
        self.idle_when_running = idle_when_running
        self._due: list[Timer] = []
        self._lazy: list[Timer] = []  # not waking (Policy.rekey_wakes)
        self._idle: list[Timer] = []
        #: Each running job's latest idle timer (instant, version), by seq.
        self.idle_at: dict[int, tuple[float, int]] = {}
        self._version: dict[int, int] = {}
        #: Per running job (seq, attempt), its `Policy.wake_bound` from when it was last asked.
        #: Entries of jobs that stopped wait to be popped.
        self.asks_wakes = not policy.rekey_wakes
        self._wake_bounds: list[Timer] = []
        #: Lazy timers may be held back while no job waits (`_replay`).
        self.holds = not policy.rekey_wakes and policy.pure_rekeys
        #: Lazy timers of running jobs held back (in the order they came due, not sorted), and
        #: the instants of the rounds since the first.
        self._held: list[Timer] = []
        self._held_rounds: list[float] = []
        #: Each running job's timer held back, by seq (stale ones are dropped as they are met).
        self.held_at: dict[int, Timer] = {}
        #: A key at or after which every held job's key sorts, up to the instant its bound ends
        #: (`held_bound`): the highest of the policy's bounds asked so far (None: none yet), those
        #: of the first `_bounded` held timers; (until, seq) of each bound that ends.
        self._bound: Key | None = None
        self._bounded = 0
        self._unbounded = False
        self._bound_ends: list[tuple[float, int]] = []
        #: Each running job's last bound, kept from one hold to the next while it lasts: (the
        #: scheduler's key, until, and the spec, start and service before it it was asked for).
        self._kept: dict[int, tuple[Key, float, JobSpec, float | None, float]] = {}

    def set(self, job: Job, now: float, changes_at: float | None = None) -> None:
        """The job's one timer (a later one replaces it): the earliest instant its key, placement
        mode, backoff or lifecycle timer changes (`changes_at`: the policy's `key_changes_at`,
        when the caller has it)."""
        # (`min` and `max` written as comparisons: the same values, without their calls)
        at = self.policy.key_changes_at(job, now) if changes_at is None else changes_at
        lazy = idle = _INF
        if self.asks_wakes:  # (`not policy.rekey_wakes`)
            lazy, at = at, _INF
        if job.status is _PENDING:
            moves_at = self.placement.changes_at(job, now)
            if moves_at < at:
                at = moves_at
            hold = job.hold_until
            if hold > now and hold < at:  # wake when its retry backoff ends
                at = hold
        elif self._followed and job.id in self._followed:
            due = self.lifecycle.due_at(job)
            if due < at:
                at = due
        elif self.idle_when_running:
            idle, at = at, _INF
        seq = job.seq
        versions = self._version
        version = versions.get(seq, 0) + 1
        versions[seq] = version
        if at < _INF:
            heapq.heappush(self._due, (now if now > at else at, seq, version))
        if lazy < at:
            heapq.heappush(self._lazy, (now if now > lazy else lazy, seq, version))
        if idle < _INF:
            if now > idle:
                idle = now
            heapq.heappush(self._idle, (idle, seq, version))
            self.idle_at[seq] = (idle, version)

    def set_each(self, taken: list[tuple[Job, float, Key, float]]) -> None:
        """`set(job, now, changes_at)` of each running job (job, now, its key, changes_at)."""
        if not self.holds or self._followed:
            for job, now, _, changes_at in taken:
                self.set(job, now, changes_at)
            return
        # `set` where key changes do not wake and no lifecycle timer is followed: a lazy timer
        versions = self._version
        lazy = self._lazy
        for job, now, _, changes_at in taken:
            seq = job.seq
            version = versions.get(seq, 0) + 1
            versions[seq] = version
            if changes_at < math.inf:
                heapq.heappush(lazy, (now if now > changes_at else changes_at, seq, version))  # max

    def started(self, job: Job) -> None:
        """An attempt started: its policy wake-up is asked at the end of this round."""
        heapq.heappush(self._wake_bounds, (-math.inf, job.seq, job.attempts))

    def forget(self, job: Job) -> None:
        """The job ended or left: its timers, wherever they are, fire no more."""
        self._version.pop(job.seq, None)
        if self._kept:
            self._kept.pop(job.seq, None)

    def fire(self, now: float, actions: list[Action]) -> None:
        """Take every timer due by `now`, the earliest first (lazy timers of running jobs may be
        held back, `_replay`)."""
        timers, lazy, idle = self._due, self._lazy, self._idle
        if self.holds and not self._followed:
            held = self._held
            by_seq = self._by_seq
            held_at = self.held_at
            versions = self._version
            waiting: list[Timer] = []
            while lazy and lazy[0][0] <= now:
                timer = heapq.heappop(lazy)
                seq = timer[1]
                if versions.get(seq) != timer[2]:
                    continue  # stale
                if by_seq[seq].status is not _RUNNING:
                    waiting.append(timer)  # a waiting job's: taken below, as always
                    continue
                held.append(timer)  # (sorted when taken, `_replay`)
                held_at[seq] = timer
            for timer in waiting:
                heapq.heappush(lazy, timer)
            rounds = self._held_rounds
            if held and (not rounds or rounds[-1] != now):
                rounds.append(now)
        elif self._held:
            self._replay()
        while True:  # the earliest due timer of the three heaps
            heap = timers if timers and timers[0][0] <= now else None
            for other in (lazy, idle):
                if other and other[0][0] <= now and (heap is None or other[0] < heap[0]):
                    heap = other
            if heap is None:
                break
            at, seq, version = heapq.heappop(heap)
            if self._version.get(seq) != version:
                continue
            job = self._by_seq[seq]
            if heap is idle:  # as if each had woken a round of its own at its instant
                self._take_idle(job, at, now)
                continue
            self.policy.on_key_change(job, now)
            if (
                job.status is _RUNNING
                and self._followed
                and job.id in self._followed
                and self.lifecycle.due(job, now, actions)
            ):
                continue
            self.host.rekey(job, now)

    def settle(self) -> None:
        """Take the key changes held back (`_replay`): before anything reads running jobs."""
        if self._held:
            self._replay()

    def held_bound(self, now: float) -> Key | None:
        """A key that the key of each running job whose changes are held back sorts at or
        before, once they are taken (`_replay`; the keys the scheduler holds for them are not
        bounded by it); None where nothing is held or the policy gives no bound. Each held job's
        `Policy.held_bound` is asked once, and again only after it ends."""
        held_at = self.held_at
        if self._unbounded or not held_at:
            return None
        held = self._held
        by_seq = self._by_seq
        if self._bounded < len(held):
            for timer in held[self._bounded :]:
                seq = timer[1]
                if held_at.get(seq) == timer:  # (not `is`: compiled, a timer is unboxed)
                    self._bound_held(by_seq[seq], now)
            self._bounded = len(held)
        ends = self._bound_ends
        if ends and ends[0][0] <= now:
            again: dict[int, None] = {}
            while ends and ends[0][0] <= now:
                seq = heapq.heappop(ends)[1]
                if seq in held_at:
                    again[seq] = None
            for seq in again:
                self._bound_held(by_seq[seq], now)
        return None if self._unbounded else self._bound

    def _bound_held(self, job: Job, now: float) -> None:
        """Take a held job's bound: its last one while that lasts (a bound holds for the job's
        attempt, whether its changes are held or not) where that is under the highest so far,
        else the policy's, under the highest so far where it may."""
        high = self._bound
        seq = job.seq
        kept = self._kept.get(seq)
        if (
            kept is not None
            and high is not None
            and kept[0] <= high  # (else the policy's may be lower)
            and kept[1] > now
            and kept[2] is job.spec
            and kept[3] == job.run_started_at
            and kept[4] == job.attained_gpu_s
        ):
            key, until = kept[0], kept[1]
        else:
            level = -job.spec.level
            ceiling = None
            if high is not None:
                if level < high[0]:
                    return  # a lower level: below the bound whatever its key
                if level == high[0]:
                    ceiling = high[1:-1]  # (the policy's key)
            bound, until = self.policy.held_bound(job, now, ceiling)
            if bound is None:
                self._unbounded = True
                return
            key = (level, *bound, seq)  # as the scheduler's keys
            self._kept[seq] = (key, until, job.spec, job.run_started_at, job.attained_gpu_s)
        if high is None or key > high:
            self._bound = key
        if until < _INF:
            heapq.heappush(self._bound_ends, (until, seq))

    def _replay(self) -> None:
        """Take the lazy timers held back, as the rounds noted would have: a job whose timer came
        due is re-keyed at the first of them at or after its instant, which sets its next timer,
        and so on. Only the last of those re-keys shows (the policy's re-keys read the job and
        the instant only, `Policy.pure_rekeys`, and no job waited to read the keys between), so
        the chain is followed by `key_changes_at` alone (`Policy.held_rekey`) and the job
        re-keyed once, at its end."""
        held = self._held
        self._held = []
        self._bound = None
        self._bounded = 0
        self._unbounded = False
        self._bound_ends = []
        held.sort()  # the earliest first, as a heap would give them
        rounds = self._held_rounds
        versions = self._version
        by_seq = self._by_seq
        held_rekey = self.policy.held_rekey
        taken: list[tuple[Job, float, Key, float]] = []
        running = True
        for at, seq, number in held:
            if versions.get(seq) != number:
                continue  # the job stopped or changed since: its key was taken then
            job = by_seq[seq]
            if job.status is not _RUNNING:
                running = False
            when, key, changes_at = held_rekey(job, rounds, bisect.bisect_left(rounds, at))
            taken.append((job, when, key, changes_at))
        self.held_at.clear()
        rounds.clear()
        # one job's re-key changes neither another's chain nor its timer's version
        if running:
            self.host.rekey_each(taken)
        else:  # (a job that stops or changes bumps its version: not seen)
            for job, when, key, changes_at in taken:
                self.host.rekey_to(job, when, key, changes_at)

    def catch_up_held(self, job: Job) -> None:
        """Before a running job stops or changes outside a round: take its key changes held
        back (`_replay`), so that its key is the one the rounds left it."""
        timer = self.held_at.pop(job.seq, None)
        if timer is not None:
            self._take_held(timer)

    def _take_held(self, timer: Timer) -> None:
        at, seq, number = timer
        if self._version.get(seq) != number:
            return  # the job stopped or changed since: its key was taken then
        self.held_at.pop(seq, None)
        job = self._by_seq[seq]
        rounds = self._held_rounds
        # the chain of timers `set` would time at each round, followed by the policy; the re-key
        # sets the job's next timer, after the last round
        when, key, changes_at = self.policy.held_rekey(job, rounds, bisect.bisect_left(rounds, at))
        self.host.rekey_to(job, when, key, changes_at)

    def _take_idle(self, job: Job, at: float, until: float) -> None:
        """Take a running job's key changes from `at` up to `until`, each at its own instant."""
        while True:
            self.policy.on_key_change(job, at)
            self.host.rekey(job, at)  # which sets the job's next one
            due = self.idle_at.get(job.seq)
            if due is None or due[0] > until or self._version[job.seq] != due[1]:
                return
            at = due[0]

    def catch_up(self, job: Job, now: float) -> None:
        """Before a running job stops or changes outside a round: take its key changes that
        came due before `now` while no job waited, as the rounds they did not wake would have."""
        due = self.idle_at.pop(job.seq, None)
        if due is not None and due[0] < now and self._version.get(job.seq) == due[1]:
            self._take_idle(job, due[0], math.nextafter(now, -math.inf))

    def next_wake(self, now: float, waiting: bool, running: int) -> float | None:
        """When the scheduler must run a round by itself, or None. `waiting`: a job waits (a
        running job's key change matters only then); `running`: how many jobs run."""
        version = self._version
        timers = self._due
        while timers and version.get(timers[0][1]) != timers[0][2]:
            heapq.heappop(timers)
        wake = timers[0][0] if timers else math.inf
        idle = self._idle
        if waiting:
            while idle and version.get(idle[0][1]) != idle[0][2]:
                heapq.heappop(idle)
            if idle and idle[0][0] < wake:  # (min, without its call)
                wake = idle[0][0]
        if self.asks_wakes:
            wake = self._earliest_wake(wake, now, running)
        return wake if wake < math.inf else None

    def _earliest_wake(self, wake: float, now: float, running: int) -> float:
        """The earliest of `wake` and every running job's `Policy.wakes_at`, as the policy's
        owner asks them at each of its events. Only the jobs whose bound lies before the earliest
        found so far are asked (each bound holds for the rest of the job's attempt): the same
        instant as asking every running job, for a handful of them."""
        bounds = self._wake_bounds
        policy = self.policy
        asked: list[Timer] = []
        while bounds and bounds[0][0] < wake:
            _, seq, attempt = heapq.heappop(bounds)
            job = self._running_attempt(seq, attempt)
            if job is None:
                continue  # that attempt is over
            at = policy.wakes_at(job, now)
            wake = min(wake, at)
            asked.append((policy.wake_bound(job, now, at), seq, attempt))
        for entry in asked:
            heapq.heappush(bounds, entry)
        if len(bounds) > 2 * running + 64:  # drop the attempts that are over
            live: dict[int, float] = {}
            for bound, seq, attempt in bounds:
                if self._running_attempt(seq, attempt) is not None:
                    live[seq] = min(bound, live.get(seq, math.inf))
            self._wake_bounds = [
                (bound, seq, self._by_seq[seq].attempts) for seq, bound in live.items()
            ]
            heapq.heapify(self._wake_bounds)
        return wake

    def _running_attempt(self, seq: int, attempt: int) -> Job | None:
        """The job numbered `seq` if it is still running its attempt `attempt`, else None."""
        job = self._by_seq.get(seq)
        if job is None or job.status is not _RUNNING or job.attempts != attempt:
            return None
        return job
