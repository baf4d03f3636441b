"""`Gittins.held_rekey` (its jump to the end of a held chain of key changes, then its own loop)
answers exactly as `Policy.held_rekey_at`, which follows the chain one round at a time through
`key_changes_at` (corral.core.timers, `_replay`), with the key and next change `key` and
`key_changes_at` give at that round: on random chains whose instants are
whole seconds, where a level's crossing falls on a round (the Tiresias preset's integer
traces), and on chains of fractional instants."""

from __future__ import annotations

import bisect
import math
import random

import pytest

from corral.core.job import Job, JobSpec, JobStatus
from corral.core.policy.base import Policy
from corral.core.policy.gittins import Gittins


def running(gpus: int, started: float, attained: float) -> Job:
    job = Job(spec=JobSpec(id="j", submit_time=0.0, gpus=gpus), seq=0, queued_since=0.0)
    job.status = JobStatus.RUNNING
    job.run_started_at = started
    job.attained_gpu_s = attained
    return job


def preset_gittins(rng: random.Random, whole: bool) -> Gittins:
    """The preset's form: an index level at every sample (whole numbers, or not), queues."""
    samples = [float(rng.randint(1, 4000)) for _ in range(300)]
    if not whole:
        samples = [s + rng.random() for s in samples]
    return Gittins(
        samples, (300.0, 2000.0), 1000, queues=True, delta_gpu_s=300.0, formula="tiresias"
    )


def one_chain(rng: random.Random, policy: Gittins, whole: bool) -> tuple[Job, list[float], int]:
    gpus = rng.choice((1, 1, 2, 3, 4, 7, 8, 16, 64))
    started = float(rng.randint(0, 500))
    attained = float(rng.choice((0, rng.randint(0, 3000))))
    if not whole:
        started += rng.random()
        attained += rng.random() * 100
    job = running(gpus, started, attained)
    # Rounds after the start, dense or sparse (fractional ones too)...
    count = rng.randint(1, 60)
    span = rng.choice((20, 200, 3000))
    instants = {started + rng.randint(0, span) for _ in range(count)}
    if not whole:
        instants = {at + rng.random() * 0.5 for at in instants}
    # ... and some at the instants levels are reached, as the chain's floats put them (from an
    # earlier instant), as a sum puts them, and one float either side, or 1e-6 of service
    # before (where a round's 1e-6 takes the level early).
    for level in rng.sample(policy.grid, 8):
        if level <= attained:
            continue
        before = started + rng.random() * (level - attained) / gpus
        then = before + (level - (attained + gpus * (before - started))) / gpus
        at = rng.choice((then, started + (level - attained) / gpus))
        at = rng.choice((at, math.nextafter(at, math.inf), math.nextafter(at, -math.inf)))
        at = rng.choice((at, at - 1e-6 / gpus, float(round(at))))
        instants.add(at)
        if rng.random() < 0.5:  # and a later round before the next level's
            above = policy.grid.index(level) + 1
            if above < len(policy.grid):
                instants.add(at + rng.random() * (policy.grid[above] - level) / gpus)
    rounds = sorted(at for at in instants if at >= started)
    if not rounds:
        rounds = [started]
    # The next change as a round of the chain sets it, at one float either side.
    for _ in range(rng.randint(0, 3)):
        at = rng.choice(rounds)
        service = attained + gpus * (at - started)
        above = bisect.bisect_right(policy.grid, service + 1e-6)
        if above < len(policy.grid):
            then = at + (policy.grid[above] - service) / gpus
            instants.add(rng.choice((then, math.nextafter(then, -math.inf))))
    rounds = sorted(at for at in instants if at >= started)
    return job, rounds, rng.randrange(len(rounds))


@pytest.mark.parametrize("whole", [True, False])
def test_the_jump_lands_where_the_rounds_would(whole: bool) -> None:
    rng = random.Random(11 if whole else 12)
    policy = preset_gittins(rng, whole)
    jumped = 0
    for _ in range(5000):
        job, rounds, position = one_chain(rng, policy, whole)
        when = Policy.held_rekey_at(policy, job, rounds, position)
        # and the key and next change there, as `key` and `key_changes_at` give them
        expected = (when, policy.stored_key(job, when), policy.key_changes_at(job, when))
        assert policy.held_rekey(job, rounds, position) == expected, (rounds, position)
        started, attained, gpus = job.run_started_at or 0.0, job.attained_gpu_s, job.spec.gpus
        if policy._held_jump(rounds, position, started, attained, gpus) > position:
            jumped += 1
    assert jumped > 100  # the jump was taken, not only the loop


def test_a_level_reached_at_a_round_by_hand() -> None:
    """Levels 0, 100, 200, 300 (the samples, 2 quantiles) and 2000 (a threshold); one GPU from
    t = 0, nothing attained: it reaches 100 at t = 100, 200 at 200, 300 at 300. Rounds 50, 100,
    150, 250, 299.5 from the first (50): at 50 its next change is at 100, taken by the round at
    100; there the next is at 200, taken at 250; there the next is at 300, after the last round
    (299.5): the chain ends at 250. With a round at 300 too it goes on to 300, the last round
    reaching 300 exactly (where the jump must not guess)."""
    policy = Gittins([100.0, 200.0, 300.0], (2000.0,), 2)
    assert policy.grid == [0.0, 100.0, 200.0, 300.0, 2000.0]
    job = running(1, 0.0, 0.0)
    rounds = [50.0, 100.0, 150.0, 250.0, 299.5]
    assert policy.held_rekey_at(job, rounds, 0) == 250.0
    assert policy.held_rekey_at(job, [*rounds, 300.0], 0) == 300.0
    assert policy.held_rekey_at(job, [*rounds, 300.0, 1000.0], 0) == 300.0
    assert policy.held_rekey_at(job, [*rounds, 300.0 + 1e-9], 0) == 300.0 + 1e-9
    assert policy.held_rekey_at(job, [*rounds, 300.0 - 1e-9], 0) == 250.0
