"""Reservations (corral.core.reservations): GPUs claimed over a time window serve only their
users or VCs in it; before it, another job starts on them only if its time limit ends by the
time the window opens. Every expected value is worked out by hand in the comments."""

from __future__ import annotations

import math

import pytest

from corral.core import Cluster, JobSpec
from corral.core.reservations import Reservation, ReservationError, choose_gpus
from tests.core.helpers import scheduler, started


def job(job_id: str, gpus: int, submit: float, user: str, limit: float | None) -> JobSpec:
    return JobSpec(
        id=job_id, submit_time=submit, gpus=gpus, user=user, duration_s=1000, time_limit_s=limit
    )


def test_reserved_gpus_serve_their_users_in_the_window_and_short_jobs_before_it():
    # One node of 4 GPUs, fifo with greedy backfill, placement any (the lowest free GPUs).
    # Reservation demo: GPUs 0 and 1, from 100 to 200, for alice.
    s = scheduler(1, 4, "fifo", "any", backfill="greedy")
    s.reserve(Reservation("demo", 100.0, 100.0, (0, 1), users=frozenset({"alice"})))
    # At 0: Y (bob, 2 GPUs, limit 500) is placed on 0-1 first, but would run into the window:
    # placed again off 0-1, on 2-3. X (bob, 1 GPU, limit 50) ends by 50, before the window:
    # it starts on GPU 0. Z (bob, 1 GPU, no limit) is unbounded: only GPU 1 is free, reserved,
    # so it waits. M (alice, 1 GPU, no limit) is a member: it would start on GPU 1 whenever;
    # submitted at 10, after X, Y and Z took or were refused theirs.
    for spec in (
        job("Y", 2, 0, "bob", 500),
        job("X", 1, 0, "bob", 50),
        job("Z", 1, 0, "bob", None),
    ):
        s.submit(spec, 0)
    assert started(s.decide(0).actions) == {"Y": (2, 3), "X": (0,)}
    assert s.jobs["Z"].pending_reason == (
        "reservation demo keeps 2 GPUs for user alice from t=100 to t=200"
    )
    # At 50 X ends; Z still may not take a reserved GPU. At 100 the window opens: alice's A
    # (1 GPU) starts on GPU 0; bob's W (1 GPU, limit 10) may not start inside the window.
    s.finished("X", 50)
    assert started(s.decide(50).actions) == {}
    s.submit(job("A", 1, 100, "alice", None), 100)
    s.submit(job("W", 1, 100, "bob", 10), 100)
    decision = s.decide(100)
    assert started(decision.actions) == {"A": (0,)}
    assert decision.wake_at == 200  # the window closes: look again then
    assert "reservation demo" in s.jobs["W"].pending_reason
    # A quiet round at 150 changes nothing; at 200 the window is over: Z (first in the queue)
    # takes GPU 1.
    assert started(s.decide(150).actions) == {}
    assert started(s.decide(200).actions) == {"Z": (1,)}


def test_a_member_starts_on_reserved_gpus_before_the_window_and_a_vc_is_served():
    s = scheduler(1, 4, "fifo", "any", backfill="greedy")
    s.reserve(Reservation("team", 100.0, 50.0, (0, 1, 2, 3), vcs=frozenset({"vision"})))
    member = JobSpec(id="v", submit_time=0, gpus=2, vc="vision", duration_s=1000)
    other = job("o", 1, 0, "bob", 200)  # ends by 200, after the window opens at 100
    s.submit(member, 0)
    s.submit(other, 0)
    assert started(s.decide(0).actions) == {"v": (0, 1)}
    assert "for VC vision from t=100 to t=150" in s.jobs["o"].pending_reason


def test_a_maintenance_window_and_its_deletion():
    # A reservation for no one: a maintenance window. Before it, only a job that ends by its
    # start may use the GPUs; deleting it lets the waiting job start at the next round.
    s = scheduler(1, 2, "fifo", "any", backfill="greedy")
    s.reserve(Reservation("maint", 60.0, 3600.0, (0, 1)))
    s.submit(job("short", 1, 0, "bob", 60), 0)
    s.submit(job("long", 1, 0, "bob", 61), 0)
    assert started(s.decide(0).actions) == {"short": (0,)}
    assert "for no one" in s.jobs["long"].pending_reason
    s.unreserve("maint")
    assert started(s.decide(1).actions) == {"long": (1,)}


def test_choosing_gpus_and_refusing_overlaps():
    # Three nodes of 4 GPUs (GPUs 0-3, 4-7, 8-11). Six GPUs: whole nodes from the last back,
    # node 2 (8-11), then 2 of node 1 (4, 5).
    cluster = Cluster.shorthand(3, 4)
    assert choose_gpus(cluster, gpus=6) == (4, 5, 8, 9, 10, 11)
    assert choose_gpus(cluster, nodes=["node-0000"]) == (0, 1, 2, 3)
    # With 8-11 taken in the window, 6 GPUs come from node 1 (4-7) then node 0 (0, 1).
    assert choose_gpus(cluster, gpus=6, taken=range(8, 12)) == (0, 1, 4, 5, 6, 7)
    with pytest.raises(ReservationError, match="nodes: no node 'x'"):
        choose_gpus(cluster, nodes=["x"])
    with pytest.raises(ReservationError, match="gpus: 13 asked, 12 not reserved"):
        choose_gpus(cluster, gpus=13)
    s = scheduler(3, 4, "fifo", "any")
    s.reserve(Reservation("a", 0.0, 100.0, (0, 1)))
    with pytest.raises(ReservationError, match="reservation a claims some of them"):
        s.reserve(Reservation("b", 50.0, 100.0, (1, 2)))
    s.reserve(Reservation("c", 100.0, 100.0, (1, 2)))  # after a's window: fine
    with pytest.raises(ReservationError, match="exists already"):
        s.reserve(Reservation("c", 500.0, 1.0, (5,)))


def test_a_count_prefers_gpus_free_when_the_window_opens():
    # Three nodes of 2 GPUs (0-1, 2-3, 4-5); the window opens at 100. GPUs 0-1 are idle; GPU 2's
    # job ends by its limit at 50 (free by 100), GPU 3's at 150 (into the window), and 4-5 hold
    # a job without a limit (never ends). By node order alone 2 GPUs would be node 2's (4, 5).
    cluster = Cluster.shorthand(3, 2)
    busy = {2: 50.0, 3: 150.0, 4: math.inf, 5: math.inf}

    def chosen(count: int, taken: tuple[int, ...] = ()) -> tuple[int, ...]:
        return choose_gpus(cluster, gpus=count, taken=taken, busy_until=busy, start=100.0)

    assert chosen(2) == (0, 1)  # idle now
    assert chosen(3) == (0, 1, 2)  # then free by 100
    assert chosen(4) == (0, 1, 2, 3)  # then the earliest to end in the window
    assert chosen(5) == (0, 1, 2, 3, 4)
    assert chosen(2, taken=(0,)) == (1, 2)
    # Among idle GPUs, whole nodes first, from the last node back: with GPU 0 busy past the
    # window, nodes 1 and 2 have 2 idle GPUs each: node 2's (4, 5). With 0 and 4 busy, node 1
    # has 2 (2, 3), nodes 0 and 2 one each: node 2's 5 before node 0's 1.
    assert choose_gpus(cluster, gpus=2, busy_until={0: 500.0}, start=100.0) == (4, 5)
    three = choose_gpus(cluster, gpus=3, busy_until={0: 500.0, 4: 500.0}, start=100.0)
    assert three == (2, 3, 5)


def test_a_reservation_record_round_trips_and_a_bad_one_names_its_field():
    from corral.core.tracefile import (
        RecordedReservation,
        RecordError,
        read_reservation,
        reservation_record,
    )

    kept = RecordedReservation("demo", 60.0, 3600.0, ("n0/0", "n0/1"), ("alice",), ("vision",))
    assert read_reservation(reservation_record(kept)) == kept
    with pytest.raises(RecordError, match="^gpus: must name at least one GPU$"):
        read_reservation(reservation_record(kept) | {"gpus": []})
    with pytest.raises(RecordError, match="^duration: must be positive"):
        read_reservation(reservation_record(kept) | {"duration": 0})


def test_a_preempting_job_takes_no_reserved_gpu_its_victims_free():
    # Two nodes of 4 GPUs (node 0: GPUs 0-3, node 1: 4-7), las with one queue boundary at 100
    # GPU-seconds, placement consolidate. Reservation demo: node 1, from 1000 to 2000, for
    # alice. At 0, W (bob, 4 GPUs, no limit: unbounded, so never on node 1) starts on node 0.
    s = scheduler(2, 4, "las", "consolidate", policy_options={"thresholds_gpu_s": (100.0,)})
    s.reserve(Reservation("demo", 1000.0, 1000.0, (4, 5, 6, 7), users=frozenset({"alice"})))
    s.submit(job("W", 4, 0, "bob", None), 0)
    assert started(s.decide(0).actions) == {"W": (0, 1, 2, 3)}
    # At 5 V (limit 500, ends by 505 < 1000) may use node 1 before the window.
    s.submit(job("V", 4, 5, "bob", 500), 5)
    assert started(s.decide(5).actions) == {"V": (4, 5, 6, 7)}
    # At 60: W has 4 x 60 = 240 GPU-s, V 4 x 55 = 220: both past 100, in the lower queue. N
    # (carol, 4 GPUs, no limit) is in the top queue: it preempts. The lowest-priority first is
    # the one that entered the lower queue last: V (at 5 + 25 = 30, W at 25). Freeing V gives
    # node 1, but N, unbounded, would hold it into alice's window: it may not take it. So V
    # keeps running and W, the next victim, gives way: N starts on node 0.
    s.submit(job("N", 4, 60, "carol", None), 60)
    decision = s.decide(60)
    assert started(decision.actions) == {"N": (0, 1, 2, 3)}
    assert s.jobs["V"].status.name == "RUNNING"
    assert s.jobs["W"].status.name == "PENDING"


def test_a_job_kept_off_reserved_gpus_preempts_for_others():
    # As above, without V: node 1 (GPUs 4-7) is free but reserved for alice from 1000. At 60 W
    # (node 0, 240 GPU-s) is in the lower queue; N (carol, 4 GPUs, no limit, top queue) fits
    # only on node 1, which it may not hold into the window: it preempts W and starts on node 0
    # (las lets a job of a higher queue preempt; the reservation only keeps it off node 1).
    s = scheduler(2, 4, "las", "consolidate", policy_options={"thresholds_gpu_s": (100.0,)})
    s.reserve(Reservation("demo", 1000.0, 1000.0, (4, 5, 6, 7), users=frozenset({"alice"})))
    s.submit(job("W", 4, 0, "bob", None), 0)
    assert started(s.decide(0).actions) == {"W": (0, 1, 2, 3)}
    s.submit(job("N", 4, 60, "carol", None), 60)
    assert started(s.decide(60).actions) == {"N": (0, 1, 2, 3)}
    assert s.jobs["W"].status.name == "PENDING"
