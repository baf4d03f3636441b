"""Tiresias's 2D-Gittins: serve the job most likely to finish soon per unit of service spent.

With S the service (GPU-seconds) a job needs, drawn from a known distribution, and a its attained
service, the Gittins index is

    G(a) = max over quanta d > 0 of  P(S - a <= d | S > a) / E[min(S - a, d) | S > a]

and the job with the highest index runs first. The maximum over d is reached at a support point of
the distribution, so with samples it is a max over the samples above a. The index is evaluated on
a grid of service levels (the distribution's quantiles and the LAS thresholds), so a job's key only
changes when its service crosses a grid point; that is where its timer fires.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from corral.core.job import Job, JobStatus
from corral.core.plugin import Services, needs
from corral.core.policy.base import Key, Policy, tie_break
from corral.core.policy.gittins_options import GittinsOptions as GittinsOptions
from corral.core.policy.las import DEFAULT_THRESHOLDS_GPU_S, tiresias_wake, tiresias_wake_bound

if TYPE_CHECKING:
    import numpy as np


def gittins_index(samples_sorted: np.ndarray, attained: float) -> float:
    """Gittins index of a job with `attained` service under the empirical distribution."""
    import numpy as np

    start = int(np.searchsorted(samples_sorted, attained, side="right"))
    remaining = samples_sorted[start:] - attained
    count = remaining.size
    if count == 0:
        return 0.0  # outlived every sample: nothing is known, serve it last
    # For d = remaining[j]: P = (j+1)/count; E[min] = (sum_{i<=j} r_i + (count-j-1) r_j)/count.
    j = np.arange(count)
    expected = np.cumsum(remaining) + (count - j - 1) * remaining
    ratios = np.divide(j + 1, expected, out=np.full(count, np.inf), where=expected > 0)
    return float(ratios.max())


def gittins_index_fixed(samples_sorted: np.ndarray, attained: float, delta: float) -> float:
    """The index for one fixed quantum `delta` instead of the best one (Tiresias's simulator
    uses a static quantum): P(S - a <= delta | S > a) / E[min(S - a, delta) | S > a]."""
    import numpy as np

    start = int(np.searchsorted(samples_sorted, attained, side="right"))
    remaining = samples_sorted[start:] - attained
    if remaining.size == 0:
        return 0.0
    expected = float(np.minimum(remaining, delta).mean())
    return float((remaining <= delta).mean()) / expected if expected > 0 else math.inf


def tiresias_rank(samples_sorted: np.ndarray, attained: float, delta: float) -> float:
    """The Tiresias simulator's own index (run_sim.py's `cal_r_gittins_index`, recomputed here,
    not copied), which differs from the textbook one: the expected service counts the sizes of
    the samples that end within the quantum, not what remains of them, and the quantum's
    samples start after the first one above `attained`. With I the samples above `attained`
    and J those above `attained + delta`: P = (|I| - |J|) / |I| rounded to 5 digits,
    E = (sum of the samples in I but not J + delta |J|) // |I| (integer division, as its Python
    2 divides integers), index = P 10^6 / E rounded to 4 digits; 0 beyond the largest sample
    less one. `samples_sorted`: whole numbers."""
    import numpy as np

    count = samples_sorted.size
    largest = float(samples_sorted[-1])
    if attained > largest - 1:
        return 0.0
    first = int(np.searchsorted(samples_sorted, attained, side="right"))
    if attained + delta > largest - 1:
        after = count - 1  # its own bound: the largest sample always counts as inside
    else:
        after = int(np.searchsorted(samples_sorted, attained + delta, side="right"))
    above = count - first
    probability = round((after - first) / above, 5)
    spent = int(samples_sorted[first:after].sum()) + int(delta) * (count - after)
    expected = float(spent // above)
    return round(probability * 1_000_000 / expected, 4) if expected > 0 else math.inf


#: How far apart (seconds) the instants `Gittins._held_jump` compares must lie for it to answer.
_HELD_EPS = 1e-6

#: Steps `Gittins.held_rekey` takes one by one before it asks where the chain ends.
_PLAIN_STEPS = 2


#: How much earlier (seconds) than the instant a job reaches a level `Gittins.held_bound` has its
#: bound end: far above the rounding of the sums that compare a job's service with the levels.
_BOUND_MARGIN_S = 1e-3


def _bounds(heads: Sequence[Key], queues: bool) -> tuple[list[Key], list[Key], list[int]]:
    """The highest head of the levels up to each level (`tops`, in order: a bisect finds where it
    passes a head), and for each level p the highest head of the levels 0..c (c: p itself, or
    with `queues` the last level of p's queue where that queue is not the last) and the first
    level above c with a higher head (len(heads): none)."""
    count = len(heads)
    tops: list[Key] = []
    for head in heads:
        tops.append(head if not tops or head > tops[-1] else tops[-1])
    rises: list[int] = [count] * count  # the first level above each with a higher top
    for position in range(count - 2, -1, -1):
        above = position + 1
        rises[position] = above if tops[above] > tops[position] else rises[above]
    caps = list(range(count))
    if queues:
        last_queue = heads[-1][0]
        for position in range(count - 2, -1, -1):
            if heads[position][0] == heads[position + 1][0] and heads[position][0] != last_queue:
                caps[position] = caps[position + 1]
    return tops, [tops[cap] for cap in caps], [rises[cap] for cap in caps]


class Gittins(Policy):
    name = "gittins"
    summary = "Tiresias's 2D-Gittins: the job likeliest to finish per GPU-second spent first"
    Options = GittinsOptions
    preemptive = True
    pure_rekeys = True

    @classmethod
    def from_options(cls, options: Any, services: Services) -> Policy:
        history = services.service_history
        needs(history, f"policy {cls.name}", "a history of job sizes")
        assert history is not None
        return cls(
            history(),
            options.thresholds_gpu_s,
            options.quantiles,
            queues=options.queues,
            delta_gpu_s=options.delta_gpu_s,
            demote_at_rounds=options.demote_at_rounds,
            formula=options.formula,
        )

    def __init__(
        self,
        service_samples_gpu_s: Sequence[float],
        thresholds_gpu_s: Sequence[float] = DEFAULT_THRESHOLDS_GPU_S,
        quantiles: int = 20,
        *,
        queues: bool = False,
        delta_gpu_s: float | None = None,
        demote_at_rounds: bool = False,
        formula: str = "gittins",
    ) -> None:
        import numpy as np

        samples = np.sort(np.asarray([s for s in service_samples_gpu_s if s > 0], dtype=float))
        if samples.size == 0:
            raise ValueError("Gittins needs at least one positive service sample")
        self.samples = samples
        self.thresholds = sorted(thresholds_gpu_s)
        self.queues = queues
        self.rekey_wakes = not demote_at_rounds
        levels = {0.0, *thresholds_gpu_s}
        levels.update(float(q) for q in np.quantile(samples, np.linspace(0, 1, quantiles + 1)))
        if quantiles >= samples.size:
            levels.update(float(s) for s in samples)
        self.grid = sorted(levels)
        if formula == "tiresias":
            if delta_gpu_s is None:
                raise ValueError("the Tiresias formula needs a quantum (delta_gpu_s)")
            # Its index is constant between samples: the one of the first sample above, less one
            # (run_sim.py's get_gittins_index); every sample is a level.
            whole = np.floor(samples)
            self.grid = sorted(levels | {float(x) for x in whole})
            at_sample = {x: tiresias_rank(whole, x - 1, delta_gpu_s) for x in set(whole.tolist())}
            self.index_at = [
                0.0
                if level >= whole[-1]
                else at_sample[float(whole[np.searchsorted(whole, level, side="right")])]
                for level in self.grid
            ]
        elif delta_gpu_s is None:
            self.index_at = [gittins_index(samples, level) for level in self.grid]
        else:
            self.index_at = [gittins_index_fixed(samples, lv, delta_gpu_s) for lv in self.grid]

        # Each level's key head, `key`'s leading parts for a service from that level up to the
        # next: its queue (the thresholds are levels: those at or below the service are those at
        # or below its level) and its index.
        self._heads: list[Key] = [
            (bisect.bisect_right(self.thresholds, level), -index) if queues else (-index,)
            for level, index in zip(self.grid, self.index_at, strict=True)
        ]
        # `held_bound`'s tables (`_bounds`): the highest head up to each level (`_tops`), and for
        # each level the head that bounds a job's there (`_bound_at`) and the first level above
        # where that bound no longer holds (`_bound_to`).
        self._tops, self._bound_at, self._bound_to = _bounds(self._heads, self.queues)

    def _grid_position(self, job: Job, now: float) -> int:
        return bisect.bisect_right(self.grid, job.attained_at(now) + 1e-6) - 1

    def index(self, job: Job, now: float) -> float:
        return self.index_at[self._grid_position(job, now)]

    def _queue(self, job: Job, now: float) -> int:
        return bisect.bisect_right(self.thresholds, job.attained_at(now) + 1e-6)

    def key(self, job: Job, now: float) -> Key:
        attained = job.attained_at(now) + 1e-6
        index = self.index_at[bisect.bisect_right(self.grid, attained) - 1]
        if self.queues:
            return (bisect.bisect_right(self.thresholds, attained), -index, *tie_break(job))
        return (-index, *tie_break(job))

    def wakes_at(self, job: Job, now: float) -> float:
        if not self.queues:
            return math.inf
        return tiresias_wake(job, now, self.thresholds, self._queue(job, now))

    def wake_bound(self, job: Job, now: float, wake: float) -> float:
        return tiresias_wake_bound(wake)

    def key_changes_at(self, job: Job, now: float) -> float:
        if job.status is not JobStatus.RUNNING:
            return math.inf
        attained = job.attained_at(now)
        grid = self.grid
        position = bisect.bisect_right(grid, attained + 1e-6)  # the next level's
        if position >= len(grid):
            return math.inf
        return now + (grid[position] - attained) / job.spec.gpus

    def held_rekey_at(self, job: Job, rounds: Sequence[float], position: int) -> float:
        return self.held_rekey(job, rounds, position)[0]

    def held_rekey(
        self, job: Job, rounds: Sequence[float], position: int
    ) -> tuple[float, Key, float]:
        """`Policy.held_rekey`: `key_changes_at` written out in a loop, the same arithmetic in
        the same order, which after `_PLAIN_STEPS` steps goes on from a round the chain passes
        through late in it (`_held_jump`: under the Tiresias preset a running job may cross many
        of its 1,000 levels between two reads of the running keys, one round each; most chains
        end within a step or two, where the jump would cost more than it saves); the key and the
        next change at its last round are `key`'s and `key_changes_at`'s, from the loop's last
        sums."""
        started = job.run_started_at
        if job.status is not JobStatus.RUNNING or started is None:
            return Policy.held_rekey(self, job, rounds, position)
        base = job.attained_gpu_s
        gpus = job.spec.gpus
        grid = self.grid
        levels = len(grid)
        last = rounds[-1]
        when = rounds[position]
        steps = 0
        below = 0  # every level before it lies at or below the service (which only grows)
        while True:
            elapsed = when - started
            attained = base + gpus * (elapsed if elapsed > 0.0 else 0.0)  # `Job.attained_at`
            above = bisect.bisect_right(grid, attained + 1e-6, below)  # the next level's
            then = when + (grid[above] - attained) / gpus if above < levels else math.inf
            if then > last or then <= when:  # (`max(then, when) == when`)
                break
            position = bisect.bisect_left(rounds, then, position)
            steps += 1
            if steps == _PLAIN_STEPS:
                position = self._held_jump(rounds, position, started, base, gpus)
            when = rounds[position]
            below = above
        return when, (*self._heads[above - 1], job.spec.submit_time, job.seq), then

    def _held_jump(
        self, rounds: Sequence[float], position: int, started: float, base: float, gpus: int
    ) -> int:
        """Where in `rounds` the chain of `held_rekey_at` from `position` ends, where no
        float's rounding can change that; else where it ends in the rounds up to one before
        those the rounding may concern (a round it passes through: it takes the same steps
        there); else `position`.

        The job's attained service grows as a(t) = base + gpus (t - started), so it reaches
        level L at c(L) = started + (L - base) / gpus. A round w re-keys the job and sets its
        next change at c(L) for the first level L above a(w) + 1e-6, taken by the first round
        at or after it. With M the highest level the last round reached (c(M) <= last <
        c(M + 1)), the chain ends at the first round at or after c(M), or at its first round
        if that is later: no round re-keys it for M + 1, and one before c(M) leaves M as its
        next change, which a later round takes. That holds for the floats the chain computes
        where no instant it compares lies within `_HELD_EPS` of another it is compared with: a
        round near c(M) (or within 1e-6 of service before it, where a round's 1e-6 takes M
        early), or the last round near c(M) or c(M + 1)."""
        eps = _HELD_EPS
        grid = self.grid
        first = rounds[position]
        end = len(rounds) - 1
        for _ in range(2):
            last = rounds[end]
            # The chain's own steps move on (w + (L - a) / gpus > w), and the errors of its
            # sums and of those below stay far under eps.
            if math.ulp(last) * gpus >= 2.5e-7 or last < started:
                return position
            attained_last = base + gpus * (last - started)
            if math.ulp(attained_last) >= 1e-8:
                return position
            top = bisect.bisect_right(grid, attained_last) - 1  # M: the highest level reached
            if top < 0:
                return position
            reached = started + (grid[top] - base) / gpus
            low = reached - 1e-6 / gpus - eps
            if top + 1 < len(grid):
                after = started + (grid[top + 1] - base) / gpus
            else:
                after = math.inf
            if reached <= last - eps and after > last + eps:
                if reached + eps < first:
                    return position  # M was reached before its first round
                if low >= first:
                    found = bisect.bisect_left(rounds, low, position, end)
                    if rounds[found] > reached + eps:
                        return found
            # A round lies near c(M), or the last one near c(M) or c(M + 1): the chain up to
            # the round before them.
            end = bisect.bisect_left(rounds, min(low, after - 1e-6 / gpus - eps), position, end)
            end -= 1
            if end < position:
                return position
        return position

    def held_bound(
        self, job: Job, now: float, ceiling: Key | None = None
    ) -> tuple[Key | None, float]:
        """`Policy.held_bound`: the highest key head of the levels up to the job's level at
        `now` (its service only grows), or, in a queue before the last, of every level of its
        queue; or, where the levels' heads stay below the ceiling's for longer, the highest of
        those; until the job reaches the next level with a higher head (less a margin far above
        the floats' rounding: it is asked again a moment early)."""
        started = job.run_started_at
        if job.status is not JobStatus.RUNNING or started is None:
            return None, math.inf
        base = job.attained_gpu_s
        gpus = job.spec.gpus
        elapsed = now - started
        attained = base + gpus * (elapsed if elapsed > 0.0 else 0.0)  # as `held_rekey`
        grid = self.grid
        level = bisect.bisect_right(grid, attained + 1e-6) - 1
        rise = self._bound_to[level]
        head = self._bound_at[level]
        if ceiling is not None:
            # the first level whose head is not below the ceiling's (every head has one length)
            passes = bisect.bisect_left(self._tops, ceiling[: len(head)])
            if passes > rise:
                rise = passes
                head = self._tops[passes - 1]
        until = math.inf
        if rise < len(grid):
            until = started + (grid[rise] - base - 1e-6) / gpus - _BOUND_MARGIN_S
        return (*head, job.spec.submit_time, job.seq), until

    def describe_key(self, job: Job, now: float) -> str:
        return f"Gittins index {self.index(job, now):.3g}"
