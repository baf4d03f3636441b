"""EASY backfill (corral.core.backfill): the head of a blocking policy gets a reservation by the
running jobs' time limits; a later job passes it only if it ends by then or stays off the GPUs
reserved. Every expected value is worked out by hand in the comments."""

from __future__ import annotations

import math

import numpy as np
import pytest

from corral.core import JobSpec
from corral.core.framework import config_from_mapping
from corral.core.options import OptionError
from corral.sim.engine import Simulation
from tests.core.helpers import scheduler, spec, started


def limited(job_id: str, gpus: int, limit: float, submit: float = 0.0) -> JobSpec:
    return spec(job_id, gpus, submit, duration=limit, time_limit_s=limit)


def blocked_head(backfill: str, placement: str = "consolidate"):
    """Two nodes of 4 GPUs, fifo. At 0, A (3 GPUs, limit 100 s) starts on node 0 (GPUs 0-2) and
    B (4 GPUs, limit 500 s) on node 1 (GPUs 4-7): GPU 3 is free. At 10, H (4 GPUs) arrives and
    cannot start (no node has 4 free): the head. Released by their limits, A ends first (at
    100): then node 0 is free and H fits there. Shadow time 100, reserved GPUs 0-3."""
    s = scheduler(2, 4, "fifo", placement, backfill=backfill)
    s.submit(limited("A", 3, 100), 0)
    s.submit(limited("B", 4, 500), 0)
    assert started(s.decide(0).actions) == {"A": (0, 1, 2), "B": (4, 5, 6, 7)}
    s.submit(limited("H", 4, 1000, 10), 10)
    return s


def test_a_short_job_backfills_a_long_one_does_not():
    # L (1 GPU, limit 200) would end by 210, after the shadow time 100, and the only free GPU
    # (3) is reserved: it waits. S (1 GPU, limit 90) ends by 100, not after the shadow: it
    # starts on GPU 3 although H reserved it.
    s = blocked_head("easy")
    s.submit(limited("L", 1, 200, 10), 10)
    s.submit(limited("S", 1, 90, 10), 10)
    assert started(s.decide(10).actions) == {"S": (3,)}
    assert "would delay job H reserved at t=100" in s.jobs["L"].pending_reason
    assert "reserved 4 GPUs to start by t=100" in s.jobs["H"].pending_reason
    # S ends at 60, A at 100: H starts at 100 on node 0, as reserved.
    s.finished("S", 60)
    assert started(s.decide(60).actions) == {}  # L would still take GPU 3 past 100
    s.finished("A", 100)
    assert started(s.decide(100).actions) == {"H": (0, 1, 2, 3)}


def test_greedy_lets_the_long_job_delay_the_head():
    # The same queue under greedy: L takes GPU 3 at 10 and holds it until 210; S does not fit.
    # At 100, A ends but node 0 has 3 free GPUs: H waits for L, until 210.
    s = blocked_head("greedy")
    s.submit(limited("L", 1, 200, 10), 10)
    s.submit(limited("S", 1, 90, 10), 10)
    assert started(s.decide(10).actions) == {"L": (3,)}
    s.finished("A", 100)
    assert started(s.decide(100).actions) == {"S": (0,)}  # H still does not fit
    s.finished("L", 210)
    s.finished("S", 190)
    assert started(s.decide(210).actions) == {"H": (0, 1, 2, 3)}


def test_none_blocks_every_later_job():
    s = blocked_head("none")
    s.submit(limited("S", 1, 90, 10), 10)
    assert started(s.decide(10).actions) == {}
    assert "blocked behind job H" in s.explain("S", 10)


def test_a_long_job_starts_off_the_reserved_gpus():
    # Placement `any` takes the lowest free GPUs. A (2 GPUs, limit 100) on 0-1, B (3 GPUs,
    # limit 500) on 2-4: free 5, 6, 7. H (4 GPUs) does not fit; A released at 100 frees 0-1:
    # with 5-7, `any` places H on 0, 1, 5, 6 (the lowest four). Reserved: 0, 1, 5, 6.
    # L (1 GPU, limit 1000) is placed first on GPU 5 (reserved): placed again with the free
    # reserved GPUs 5 and 6 held out, it gets GPU 7 and starts. M (1 GPU, limit 1000) then has
    # only reserved GPUs left: it waits.
    s = scheduler(1, 8, "fifo", "any", backfill="easy")
    s.submit(limited("A", 2, 100), 0)
    s.submit(limited("B", 3, 500), 0)
    assert started(s.decide(0).actions) == {"A": (0, 1), "B": (2, 3, 4)}
    s.submit(limited("H", 4, 1000, 10), 10)
    s.submit(limited("L", 1, 1000, 10), 10)
    s.submit(limited("M", 1, 1000, 10), 10)
    assert started(s.decide(10).actions) == {"L": (7,)}
    assert s.backfill.shadow == 100 and s.backfill.reserved == {0, 1, 5, 6}
    assert "would delay job H reserved at t=100" in s.jobs["M"].pending_reason
    s.finished("A", 100)
    assert started(s.decide(100).actions) == {"H": (0, 1, 5, 6)}


def test_a_job_without_a_time_limit_is_unbounded():
    # A later job without a limit never ends before the shadow time: on a reserved GPU it
    # waits, as L did above. A running job without a limit is never released: with A
    # unbounded, nothing frees node 0 or node 1 (B unbounded too), so H gets no reservation and
    # later jobs start as under greedy.
    s = blocked_head("easy")
    s.submit(spec("U", 1, 10, duration=50), 10)  # no limit
    assert started(s.decide(10).actions) == {}
    assert "would delay job H reserved at t=100" in s.jobs["U"].pending_reason

    s = scheduler(2, 4, "fifo", "consolidate", backfill="easy")
    s.submit(spec("A", 3, 0), 0)
    s.submit(spec("B", 4, 0), 0)
    s.decide(0)
    s.submit(limited("H", 4, 1000, 10), 10)
    s.submit(limited("L", 1, 200, 10), 10)
    assert started(s.decide(10).actions) == {"L": (3,)}
    assert "no reservation" in s.jobs["H"].pending_reason


def test_earlier_attempts_count_against_the_limit():
    # A job that ran before uses up its limit as the live manager counts it: L (limit 200) ran
    # 150 s, was preempted and waits: started at 10 it ends by 10 + 50 = 60, before the shadow.
    s = blocked_head("easy")
    s.submit(limited("L", 1, 200, 10), 10)
    s.jobs["L"].executed_s = 150.0
    assert started(s.decide(10).actions) == {"L": (3,)}


def test_backfill_option_keeps_the_old_booleans():
    assert config_from_mapping({"backfill": True}).core.backfill == "greedy"
    assert config_from_mapping({"backfill": False}).core.backfill == "none"
    assert config_from_mapping({"backfill": "true"}).core.backfill == "greedy"
    assert config_from_mapping({"backfill": "easy"}).core.backfill == "easy"
    assert config_from_mapping({}).core.backfill == "none"
    with pytest.raises(OptionError, match="scheduler: backfill: unknown backfill 'eager'"):
        config_from_mapping({"backfill": "eager"})
    with pytest.raises(OptionError, match="backfill easy: not with stages"):
        config_from_mapping({"backfill": "easy", "stages": ["migration"]})


def trace_with_limits(seed: int, count: int) -> list[JobSpec]:
    """Jobs of 1 to 8 GPUs every 40 s on average (an overload for 16 GPUs), each with a time
    limit of 1 to 2 times its run time, so that no job runs past its limit."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(40.0, count))
    jobs = []
    for i in range(count):
        duration = float(rng.lognormal(5.0, 1.2))
        jobs.append(
            JobSpec(
                id=f"j{i}",
                submit_time=float(arrivals[i]),
                gpus=int(rng.choice([1, 1, 2, 4, 8])),
                duration_s=duration,
                time_limit_s=duration * float(rng.uniform(1.0, 2.0)),
            )
        )
    return jobs


def first_shadows(backfill: str, seed: int) -> tuple[dict[str, float], dict[str, float]]:
    """Each head's shadow time when it first became the head, and when each job started, over
    a random overloaded trace on 2 nodes of 8 GPUs (fifo, consolidate)."""
    core = scheduler(2, 8, "fifo", "consolidate", backfill=backfill)
    rule = core.backfill
    shadows: dict[str, float] = {}
    decide = core.decide

    def watched(now: float, **kw: bool):
        decision = decide(now, **kw)
        head = getattr(rule, "head", None)
        if head is not None and head not in shadows and rule.shadow < math.inf:
            shadows[head] = rule.shadow
        return decision

    core.decide = watched  # type: ignore[method-assign]
    result = Simulation(trace_with_limits(seed, 300), core).run()
    starts = {job.id: job.first_started_at for job in result.jobs}
    return shadows, starts  # type: ignore[return-value]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_easy_backfill_never_delays_the_head(seed: int):
    # Every job runs for at most its limit, so a head starts at the latest at the shadow time
    # it was given when it became the head, whatever started after it.
    shadows, starts = first_shadows("easy", seed)
    assert len(shadows) > 20  # the trace blocks the queue often
    late = {job: (shadow, starts[job]) for job, shadow in shadows.items() if starts[job] > shadow}
    assert late == {}


def test_the_shadow_honours_an_admin_reservation():
    # One node of 4 GPUs, fifo, placement any (the lowest free GPUs), easy. At 0 A (2 GPUs,
    # limit 100) starts on 0-1; then a maintenance window (for no one) keeps GPUs 2-3 from 50
    # to 250. At 10 H (4 GPUs, limit 1000) cannot start: the head. Released by its limit, A
    # frees 0-1 at 100, but from 50 to 250 H may not take 2-3 (it would run into the window, and
    # then it is open): at 100 it does not fit. At 250 the window closes: shadow time 250,
    # reserved 0-3 (a shadow blind to the window says 100). W (2 GPUs, limit 30) ends by 40,
    # before the window and the shadow: it starts on 2-3.
    from corral.core.reservations import Reservation

    s = scheduler(1, 4, "fifo", "any", backfill="easy")
    s.submit(limited("A", 2, 100), 0)
    assert started(s.decide(0).actions) == {"A": (0, 1)}
    s.reserve(Reservation("maint", 50.0, 200.0, (2, 3)))
    s.submit(limited("H", 4, 1000, 10), 10)
    s.submit(limited("W", 2, 30, 10), 10)
    assert started(s.decide(10).actions) == {"W": (2, 3)}
    assert s.backfill.shadow == 250 and s.backfill.reserved == {0, 1, 2, 3}
    assert "reserved 4 GPUs to start by t=250" in s.jobs["H"].pending_reason
    # At 100 W and A have ended: 0-1 are free, 2-3 in the window. Nothing runs, yet the window
    # bounds H's start: shadow 250 still (blind to it, H would get no reservation and L would
    # start). L (2 GPUs, limit 200) would end by 300, past 250, on 0-1 (reserved for H; 2-3 are
    # the window's): it waits. S (2 GPUs, limit 150) ends by 250: it starts on 0-1.
    s.finished("W", 40)
    s.finished("A", 100)
    s.submit(limited("L", 2, 200, 100), 100)
    s.submit(limited("S", 2, 150, 100), 100)
    assert started(s.decide(100).actions) == {"S": (0, 1)}
    assert s.backfill.shadow == 250
    assert "would delay job H reserved at t=250" in s.jobs["L"].pending_reason
    # S ends at 240; at 250 the window closes and H starts, as reserved, before L.
    s.finished("S", 240)
    assert started(s.decide(240).actions) == {}
    assert started(s.decide(250).actions) == {"H": (0, 1, 2, 3)}


def test_the_head_is_reserved_the_gpus_the_walk_gives_it_beside_a_reservation():
    """EASY reserves for the head the GPUs the walk will give it at the shadow time: placed as
    usual, and held off an admin reservation's GPUs only where that placement takes some.

    Two nodes of 4 GPUs (0-3, 4-7), fifo, consolidate (one node, the one with the fewest free
    GPUs that fits: best fit), easy. At 0: C (1 GPU, no limit) takes GPU 0, X (1 GPU, limit 5)
    GPU 1 (node 0, 3 free, is the best fit), A (6 GPUs, limit 100; more than a node holds, so
    the fewest nodes) the other six. A demo reservation for alice then keeps GPUs 6-7 from 1000
    to 2000. X ends at 5: GPU 1 is free. At 10 H (2 GPUs, limit 1000) cannot start: the head.
    Released by its limit, A frees 2-7 at 100: node 0 has 1-3 free (3), node 1 has 4-7 (4). H
    would end by 1100, into the window: 6-7 are closed to it. Placed as usual, best fit takes
    node 0, GPUs 1-2, none of them closed: the walk would start H there at 100, so shadow 100,
    reserved {1, 2}. L (1 GPU, limit 1000) would end by 1010, past the shadow: placed on GPU 1,
    the only free one, reserved for H, it waits. At 100 H starts on 1-2, as reserved, then L on
    GPU 3 (node 0, 1 free, the best fit; 6-7 stay closed to it).

    Placed with 6-7 held out from the first, node 1 would show 2 free and be the best fit: H
    would be reserved 4-5, GPUs the walk does not give it, and L let onto GPU 1, which it does
    (H then starts at 100 on 2-3, reserved for no one).
    """
    from corral.core.reservations import Reservation

    s = scheduler(2, 4, "fifo", "consolidate", backfill="easy")
    s.submit(spec("C", 1, 0), 0)
    s.submit(limited("X", 1, 5), 0)
    s.submit(limited("A", 6, 100), 0)
    assert started(s.decide(0).actions) == {"C": (0,), "X": (1,), "A": (4, 5, 6, 7, 2, 3)}
    s.reserve(Reservation("demo", 1000.0, 1000.0, (6, 7), users=frozenset({"alice"})))
    s.finished("X", 5)
    assert started(s.decide(5).actions) == {}
    s.submit(limited("H", 2, 1000, 10), 10)
    s.submit(limited("L", 1, 1000, 10), 10)
    assert started(s.decide(10).actions) == {}
    assert s.backfill.shadow == 100 and s.backfill.reserved == {1, 2}
    assert "reserved 2 GPUs to start by t=100" in s.jobs["H"].pending_reason
    assert "would delay job H reserved at t=100" in s.jobs["L"].pending_reason
    s.finished("A", 100)
    assert started(s.decide(100).actions) == {"H": (1, 2), "L": (3,)}
