"""A bound on the keys of running jobs whose key changes are held back (corral.core.timers,
`Policy.held_bound`): the preemption answers "may not preempt" from it, and a round decides
whether it repeats from it, without taking the held changes. The gittins tables and one bound
worked by hand; random traces under the Tiresias preset's gittins, where every bound asked is
checked against the keys the held changes would give, decide exactly as without the bound."""

from __future__ import annotations

import bisect
import math
from dataclasses import replace

import pytest

from corral.core import Preempt
from corral.core.job import Job, JobStatus
from corral.core.policy import make_policy
from corral.core.policy.gittins import _bounds
from corral.sim.engine import Simulation
from tests.core.helpers import preset_gittins_options, random_trace, scheduler, stretches

#: Heads (queue, -index) of nine levels in three queues.
HEADS = [(0, -5), (0, -7), (0, -6), (1, -9), (1, -3), (2, -8), (2, -4), (2, -6), (2, -1)]


def test_bound_tables_by_hand():
    """The highest head up to each level: (0, -5) three times, (1, -9), (1, -3), (2, -8), (2, -4)
    twice, (2, -1). A level of queue 0 or 1 is bounded by the highest head of its whole queue,
    until its queue ends (queue 0's levels up to 2: bounded by (0, -5) until level 3; queue 1's:
    by (1, -3) until level 5); a level of the last queue by the highest head up to it, until the
    next higher one (level 5 until 6; levels 6 and 7, at (2, -4), until 8; level 8 for ever)."""
    tops, bound_at, bound_to = _bounds(HEADS, queues=True)
    assert tops == [(0, -5)] * 3 + [(1, -9), (1, -3), (2, -8), (2, -4), (2, -4), (2, -1)]
    assert bound_at == [(0, -5)] * 3 + [(1, -3)] * 2 + [(2, -8), (2, -4), (2, -4), (2, -1)]
    assert bound_to == [3, 3, 3, 5, 5, 6, 8, 8, 9]
    # Without queues every level is bounded up to itself only.
    tops, bound_at, bound_to = _bounds(HEADS, queues=False)
    assert bound_at == tops
    assert bound_to == [3, 3, 3, 4, 5, 6, 8, 8, 9]


def test_a_running_jobs_bound_by_hand():
    """Levels 0, 100, ..., 800 GPU-s with the heads above; a 2-GPU job that started at 1,000 s
    with no service before. At 1,060 s it has 120 GPU-s: level 1, in queue 0, bounded by
    (0, -5) until it reaches level 3 (300 GPU-s) at 1,150 s, less 0.5 us of service and the
    1 ms margin. Under a ceiling of (2, -4): the heads stay below it up to level 5, so the bound
    is (2, -8) until level 6 (600 GPU-s), at 1,300 s less the same."""
    policy = make_policy("gittins", service_samples_gpu_s=[100.0, 800.0], queues=True)
    policy.grid = [100.0 * level for level in range(9)]
    policy._tops, policy._bound_at, policy._bound_to = _bounds(HEADS, queues=True)
    job = Job(replace(random_trace(0, 1)[0], gpus=2, submit_time=5.0), seq=7)
    job.status = JobStatus.RUNNING
    job.run_started_at = 1000.0
    bound, until = policy.held_bound(job, 1060.0)
    assert bound == (0, -5, 5.0, 7)
    assert until == pytest.approx(1150.0 - 0.5e-6 - 1e-3, abs=1e-9)
    bound, until = policy.held_bound(job, 1060.0, (2, -4, 1.0, 3))
    assert bound == (2, -8, 5.0, 7)
    assert until == pytest.approx(1300.0 - 0.5e-6 - 1e-3, abs=1e-9)
    # A ceiling the job's own bound passes already changes nothing.
    assert policy.held_bound(job, 1060.0, (0, -9, 1.0, 3)) == policy.held_bound(job, 1060.0)
    job.status = JobStatus.PENDING
    assert policy.held_bound(job, 1060.0) == (None, math.inf)


def preset_gittins(seed: int, placement: str, victims: str, bounded: bool):
    """One random trace on 4 nodes x 4 GPUs under the preset's gittins (an index level at every
    one of 300 samples; a few jobs of a higher level), quiet stretches between busy ones. Every
    bound the timers give is checked against the keys the held changes give (taken as `_replay`
    would, without taking them). `bounded` False: no bound is asked. Returns the decisions, the
    jobs' ends, how many held changes were taken, how many preemption questions the bound
    answered, how many bounds were checked, and at how many rounds the bound kept a quiet round
    without taking the held changes."""
    options = preset_gittins_options(seed, [60, 300])
    # a few jobs of a higher level
    trace = stretches(seed, (60.0, 10.0, 60.0, 10.0, 8.0), lambda index: int(index % 17 == 5))
    s = scheduler(4, 4, "gittins", placement=placement, victims=victims, policy_options=options)
    timers, preemption = s.timers, s.preemption
    assert timers.holds and preemption.held_bound == timers.held_bound
    counts = {"taken": 0, "answered": 0, "checked": 0, "quiet": 0}
    take = timers.policy.held_rekey

    def counted(job, rounds, position):  # type: ignore[no-untyped-def]
        counts["taken"] += 1
        return take(job, rounds, position)

    ask = timers.held_bound

    def checked(now):  # type: ignore[no-untyped-def]
        bound = ask(now)
        if bound is not None:
            counts["checked"] += 1
            rounds = timers._held_rounds
            for at, seq, version in timers.held_at.values():
                if timers._version.get(seq) != version:
                    continue
                job = s._by_seq[seq]
                _, key, _ = take(job, rounds, bisect.bisect_left(rounds, at))
                assert (-job.spec.level, *key, seq) <= bound, (now, job.id)
        return bound

    may = preemption.may_preempt_for

    def asked(job, now):  # type: ignore[no-untyped-def]
        held = bool(timers.held_at)
        answer = may(job, now)
        if held and timers.held_at:  # not taken: the bound said no
            assert not answer
            counts["answered"] += 1
        return answer

    below = s._held_below_waiting

    def quiet(now):  # type: ignore[no-untyped-def]
        kept = below(now)
        counts["quiet"] += kept
        return kept

    timers.policy.held_rekey = counted  # type: ignore[method-assign]
    s._held_below_waiting = quiet  # type: ignore[method-assign]
    if bounded:
        timers.held_bound = checked  # type: ignore[method-assign]
        preemption.held_bound = checked
    else:
        timers.held_bound = lambda now: None  # type: ignore[method-assign]
        preemption.held_bound = timers.held_bound
    preemption.may_preempt_for = asked  # type: ignore[method-assign]
    result = Simulation(trace, s, record_decisions=True).run()
    ends = sorted((job.id, job.finished_at, job.preemptions) for job in result.jobs)
    return result.decisions, ends, counts


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    ("placement", "victims"), [("any", "in-order"), ("yarn", "lowest"), ("relax", "lowest")]
)
def test_the_bound_never_passes_a_held_key_and_decides_as_taking_them(seed, placement, victims):
    bounded, bounded_ends, with_bound = preset_gittins(seed, placement, victims, True)
    each, each_ends, without = preset_gittins(seed, placement, victims, False)
    assert sum(isinstance(action, Preempt) for _, action in each) > 5
    # The bound answered questions (and was checked) in the first run only, which took fewer
    # held changes.
    assert with_bound["answered"] > 5 and with_bound["checked"] > with_bound["answered"]
    if placement != "yarn":  # (its placement is not pure: no round repeats another)
        assert with_bound["quiet"] > 0
    assert without["answered"] == without["checked"] == without["quiet"] == 0
    assert with_bound["taken"] < without["taken"]
    assert bounded == each
    assert bounded_ends == each_ends
