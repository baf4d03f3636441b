"""Running jobs' lazy key changes held back while no running key is read (corral.core.timers,
`Policy.pure_rekeys`: gittins under `demote_at_rounds`, the Tiresias preset's) and taken at the
first read, each job re-keyed once at the round its last timer came due, decide exactly as when
every key change is taken at its round: random traces, each way."""

from __future__ import annotations

import pytest

from corral.core import Preempt
from corral.sim.engine import Simulation
from tests.core.helpers import preset_gittins_options, scheduler, stretches


def held_and_taken_at_once(seed: int, placement: str, victims: str):
    """The decisions and job ends of one random trace on 4 nodes x 4 GPUs under the preset's
    gittins (an index level at every one of 300 samples), with key changes held back and taken
    at each round, and how many held timers were taken."""
    options = preset_gittins_options(seed, [300, 2000])
    trace = stretches(seed, (60.0, 10.0, 60.0, 10.0))
    runs, taken = [], []
    for holds in (True, False):
        s = scheduler(4, 4, "gittins", placement=placement, victims=victims, policy_options=options)
        assert s.timers.holds  # gittins declares pure re-keys
        if not holds:  # every key change at its round, the walk asking each job first
            s.timers.holds = False
            s._walk._late = False
        count = [0]
        take = s.timers.policy.held_rekey

        def counted(job, rounds, position, take=take, count=count):  # type: ignore[no-untyped-def]
            count[0] += 1
            return take(job, rounds, position)

        s.timers.policy.held_rekey = counted  # type: ignore[method-assign]
        result = Simulation(trace, s, record_decisions=True).run()
        ends = sorted((job.id, job.finished_at, job.preemptions) for job in result.jobs)
        runs.append((result.decisions, ends))
        taken.append(count[0])
    return runs, taken


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(
    ("placement", "victims"), [("any", "in-order"), ("yarn", "lowest"), ("relax", "lowest")]
)
def test_held_key_changes_decide_exactly_as_taken_at_each_round(seed, placement, victims):
    ((held, held_ends), (each, each_ends)), (taken_held, taken_each) = held_and_taken_at_once(
        seed, placement, victims
    )
    # The trace preempts, and key changes were held back (and taken later) in the first run only.
    assert sum(isinstance(action, Preempt) for _, action in each) > 5
    assert taken_held > 50 and taken_each == 0
    assert held == each
    assert held_ends == each_ends
