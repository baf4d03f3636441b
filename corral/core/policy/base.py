"""What an ordering policy is: a priority key per job, piecewise constant in time.

A key sorts ascending (smaller = served first), and no key may be the prefix of another: the
scheduler appends the job's seq to it, which would then be compared with a part of the longer
key. The scheduler keeps pending and running jobs in sorted indexes by `stored_key`, so a key must
not change while a job stays in the same state, except at the instants a policy announces
through `key_changes_at` (a LAS queue crossing, a starvation promotion); the scheduler re-keys
the job then. `key` is the same order evaluated at `now`, used to compare a pending job with a
running one.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import Any, ClassVar

from corral.core.compiled import mypyc_attr
from corral.core.estimate import Remaining
from corral.core.job import Job
from corral.core.plugin import OptionsMixin

Key = tuple[Any, ...]


# Other modules (and plugins) subclass it, which the compiled build (setup.py) must allow. Compiled
# code reads an instance attribute from the instance, never from a subclass's class body: what a
# subclass sets in its class body is a ClassVar here; `rekey_wakes` and `preempt_prefix` are set
# per instance (in `__init__`, as las does), never in a class body.
@mypyc_attr(allow_interpreted_subclasses=True)
class Policy(OptionsMixin):
    """A registry entry (`corral.core.policy.POLICIES`): declares `Options` and builds itself with
    `from_options` (corral.core.plugin)."""

    name: ClassVar[str] = "base"
    #: The admission scheme this policy runs inside, when it is not an ordinary queue order
    #: (elasticflow sizes gangs itself); `admission: auto` picks it.
    admission: ClassVar[str | None] = None
    preemptive: ClassVar[bool] = False
    #: A head job that cannot be placed blocks the jobs behind it (YARN-CS in Philly).
    blocking: ClassVar[bool] = False
    #: Orders jobs by `JobSpec.duration_s`: a live shell queues only jobs that declare one.
    needs_lengths: ClassVar[bool] = False
    #: `stored_key` equals `key` at every instant (true when keys only change at announced
    #: instants); lets the scheduler compare indexed keys without recomputing them.
    stored_is_key: ClassVar[bool] = True
    #: The instants `key_changes_at` announces wake the scheduler for a round of their own; when
    #: False a key change is taken at the first round at or after its instant (rounds that
    #: arrivals, ends and other timers cause: how the Tiresias simulator checks its queues).
    rekey_wakes = True
    #: `stored_key` and `key_changes_at` read only the job and `now`, and `on_key_change` does
    #: nothing: where key changes do not wake the scheduler, those of running jobs may be taken
    #: later, each at the round it came due at (corral.core.timers: while no job waits).
    pure_rekeys: ClassVar[bool] = False
    #: The victim rule compares only this many leading parts of the scheduler's keys (its job
    #: level first, then this policy's key); None: whole keys. A waiting job may preempt a running
    #: one whose leading parts are greater (`preempts`).
    preempt_prefix: int | None = None

    def key(self, job: Job, now: float) -> Key:
        raise NotImplementedError

    def stored_key(self, job: Job, now: float) -> Key:
        """A time-invariant form of `key` for the sorted indexes (default: the key itself)."""
        return self.key(job, now)

    def key_changes_at(self, job: Job, now: float) -> float:
        """The next instant at which this job's key may change; inf when it never does."""
        return math.inf

    def held_rekey_at(self, job: Job, rounds: Sequence[float], position: int) -> float:
        """Of `rounds` (sorted instants), the last at which rounds one after the other would
        re-key a running job whose key change came due at `rounds[position]` (a
        `pure_rekeys` policy's changes held back, corral.core.timers): at each such round its
        next change is `key_changes_at`, taken at the first round at or after it. A policy
        may answer at less cost, never otherwise."""
        last = rounds[-1]
        when = rounds[position]
        while True:
            then = max(self.key_changes_at(job, when), when)
            if then > last or then == when:
                return when
            position = bisect.bisect_left(rounds, then, position)
            when = rounds[position]

    def held_rekey(
        self, job: Job, rounds: Sequence[float], position: int
    ) -> tuple[float, Key, float]:
        """`held_rekey_at`, with the job's `stored_key` and `key_changes_at` at that round."""
        when = self.held_rekey_at(job, rounds, position)
        return when, self.stored_key(job, when), self.key_changes_at(job, when)

    def held_bound(
        self, job: Job, now: float, ceiling: Key | None = None
    ) -> tuple[Key | None, float]:
        """For a running job whose key changes are held back: a key that its `stored_key` at
        every instant from its last re-key up to `now`, and on until the instant returned
        (exclusive), sorts at or before; the preemption answers "may not preempt" from it
        without taking the held changes (corral.core.timers). None: no bound (the changes are
        taken first). `ceiling`: a key the caller's bound is at already (its leading parts), so
        that a bound below it costs nothing: one that lasts longer is better then."""
        return None, math.inf

    def wakes_at(self, job: Job, now: float) -> float:
        """Where key changes do not wake the scheduler (`rekey_wakes` False): an instant at which
        it should still wake for this running job, its key change then taken if due; inf: none.
        Asked at the end of every round of each running job whose `wake_bound` lies before the
        earliest wake-up found so far, so of every running job that could wake it first."""
        return math.inf

    def wake_bound(self, job: Job, now: float, wake: float) -> float:
        """A bound the running job's `wakes_at` stays at or after, at every later instant of this
        attempt, given `wake`, its value at `now`; the scheduler asks it again only once the
        bound is earlier than every other wake-up. Default -inf: asked at every round."""
        return -math.inf

    def on_key_change(self, job: Job, now: float) -> None:
        """Called at `key_changes_at` before the job is re-keyed (e.g. LAS promotion)."""

    def describe_key(self, job: Job, now: float) -> str:
        return ""

    def remaining(self, job: Job, now: float) -> Remaining | None:
        """The job's remaining work as this policy last estimated it (None: it estimates none).
        Read only: the shells show it (`corral describe`); it changes no state and no decision."""
        return None

    def preempts(self, job_key: Key, victim_key: Key) -> bool:
        """Whether a waiting job may preempt a running one, given the keys the scheduler holds
        for them: its job level first, then this policy's key, then the job's seq (where two
        jobs' keys are equal, the later job has the lower priority): the victim's leading
        `preempt_prefix` parts are greater (by default its whole key: any lower priority)."""
        cut = self.preempt_prefix
        if cut is None:
            return bool(victim_key > job_key)
        return bool(victim_key[:cut] > job_key[:cut])


def tie_break(job: Job) -> tuple[float, int]:
    """Arrival order: submit time, then the order the scheduler saw the job."""
    return (job.spec.submit_time, job.seq)
