"""Gandiva's mechanisms in the core, on hand-worked scenarios: time-slicing, packing, migration."""

from __future__ import annotations

import json

import pytest

from corral.core import Job, JobStatus, Preempt, Start
from corral.core.migration import Migration
from corral.core.packing import Packing
from corral.core.policy import make_policy
from corral.sim.colocation import load_pair_table
from tests.core.helpers import scheduler, spec, started


def preempted(actions: list) -> list[str]:
    return [a.job_id for a in actions if isinstance(a, Preempt)]


# -- time-slicing ---------------------------------------------------------------------------------


def test_three_one_gpu_jobs_take_turns_on_two_gpus():
    # Quantum 100 s, restore 10 s; a, b, c (1 GPU, long) arrive at 0 in that order.
    # t=0:   a, b start (their turn); c waits, ready since 0.
    # t=100: a's and b's turns end; both join the queue's tail at 100 with 100 s served. c joined
    #        at 0, so it takes one GPU: the victim is the last in the queue, b (same instant and
    #        service as a, later arrival). a keeps running: nobody else waits.
    # t=200: a (ready 200, 200 s served) and c's turn (ready 200, 100 s served) end; b has waited
    #        since 100 and takes the GPU of a, the one served most. b resumes: it restores its
    #        checkpoint until 210, and has done 100 s of work (0..100) + 0 at t=210.
    s = scheduler(1, 2, policy="timeslice", policy_options={"quantum_s": 100}, restore_s=10)
    for name in "abc":
        s.submit(spec(name, 1, duration=10_000), 0)
    first = s.decide(0)
    assert sorted(started(first.actions)) == ["a", "b"]
    assert first.wake_at == 100

    b_gpus = s.jobs["b"].placement
    second = s.decide(100)
    assert preempted(second.actions) == ["b"]
    assert started(second.actions) == {"c": b_gpus}
    assert s.jobs["a"].status is JobStatus.RUNNING
    assert s.jobs["c"].stall_until == 100  # first start: no restore
    assert second.wake_at == 200

    third = s.decide(200)
    assert preempted(third.actions) == ["a"]
    resumed = [a for a in third.actions if isinstance(a, Start)]
    assert [(a.job_id, a.resumed) for a in resumed] == [("b", True)]
    b = s.jobs["b"]
    assert b.stall_until == 210
    assert b.work_done_at(210) == pytest.approx(100)
    assert b.work_done_at(250) == pytest.approx(140)
    assert s.jobs["a"].work_done_s == pytest.approx(200)
    assert s.jobs["c"].work_done_at(200) == pytest.approx(100)
    assert s.preemptions == 2


def test_time_slicing_does_not_rotate_when_nobody_waits():
    # Two jobs on two GPUs: their quanta end at 100 but no job waits, so nothing is preempted; a
    # job arriving at 150 waits until the next quantum boundary (200), then takes a turn.
    s = scheduler(1, 2, policy="timeslice", policy_options={"quantum_s": 100}, restore_s=10)
    s.submit(spec("a", 1, duration=10_000), 0)
    s.submit(spec("b", 1, duration=10_000), 0)
    s.decide(0)
    assert s.decide(100).actions == []
    s.submit(spec("late", 1, submit=150, duration=10_000), 150)
    assert s.decide(150).actions == []
    assert s.explain("late", 150).startswith("PENDING")
    rotation = s.decide(200)
    assert preempted(rotation.actions) == ["b"] and list(started(rotation.actions)) == ["late"]


def test_time_slice_quantum_must_be_positive():
    with pytest.raises(ValueError, match="quantum"):
        make_policy("timeslice", quantum_s=0)


# -- packing ----------------------------------------------------------------------------------------


def write_table(path) -> str:
    """A Gavel-format table: alone A=10, B=20, C=5 steps/s on one v100. Sharing, A+B run at
    7 and 12 steps/s (relative 0.7 + 0.6 = 1.3), A+C at 5 and 2.5 (0.5 + 0.5 = 1.0), B+C did not
    fit together (zeros)."""
    table = {
        "v100": {
            "('A', 1)": {"null": 10.0, "('B', 1)": [7.0, 12.0], "('C', 1)": [5.0, 2.5]},
            "('B', 1)": {"null": 20.0, "('A', 1)": [12.0, 7.0], "('C', 1)": [0.0, 0.0]},
            "('C', 1)": {"null": 5.0, "('A', 1)": [2.5, 5.0], "('B', 1)": [0.0, 0.0]},
        }
    }
    file = path / "throughputs.json"
    file.write_text(json.dumps(table))
    return str(file)


def packing_scheduler(tmp_path, policy="fifo", threshold=1.1, **kw):
    table = load_pair_table(write_table(tmp_path))
    return scheduler(1, 1, policy=policy, stages=[Packing(table, threshold=threshold)], **kw)


def test_pair_speeds_come_from_the_table(tmp_path):
    table = load_pair_table(write_table(tmp_path))
    assert len(table) == 4  # A+B, B+A, A+C, C+A; B+C did not fit
    host = Job(spec("h", 1, model="A"))
    assert table(Job(spec("g", 1, model="B")), host, "v100") == pytest.approx((0.6, 0.7))
    assert table(Job(spec("g", 1, model="C")), host, "v100") == pytest.approx((0.5, 0.5))
    # The table is complete: a pair it lacks (no 2-GPU pairs were measured) cannot share.
    assert table(Job(spec("g", 2, model="B")), Job(spec("h", 2, model="A")), "v100") == (0, 0)


def test_a_waiting_job_shares_the_gpu_when_the_pair_beats_the_threshold(tmp_path):
    # One GPU. h (model A) runs from 0; g (B) arrives at 100 and cannot be placed: A+B make 1.3
    # > 1.1, so g starts on h's GPU. h then runs at 0.7, g at 0.6. The GPU stays allocated once.
    s = packing_scheduler(tmp_path)
    s.submit(spec("h", 1, model="A"), 0)
    s.decide(0)
    s.submit(spec("g", 1, submit=100, model="B"), 100)
    decision = s.decide(100)
    assert started(decision.actions) == {"g": s.jobs["h"].placement}
    assert {r.job_id: r.speed for r in decision.respeeds} == pytest.approx({"h": 0.7, "g": 0.6})
    assert s.cluster.free_gpus == 0
    # A third job finds no host: a GPU holds two jobs at most.
    s.submit(spec("k", 1, submit=150, model="B"), 150)
    assert s.decide(150).actions == [] and s.jobs["k"].status is JobStatus.PENDING
    # Work: h did 100 alone, then 0.7/s: 170 at t=200; g 0.6/s: 60 at t=200.
    h, g = s.jobs["h"], s.jobs["g"]
    assert h.work_done_at(200) == pytest.approx(170)
    assert g.work_done_at(200) == pytest.approx(60)
    # g ends at 200: h keeps the GPU and gets its speed alone back from then on; k (B) now packs
    # with h again.
    s.finished("g", 200)
    assert s.cluster.free_gpus == 0 and h.speed == 1.0
    assert h.work_done_at(250) == pytest.approx(220)
    after = s.decide(200)
    assert list(started(after.actions)) == ["k"]
    assert {r.job_id: r.speed for r in after.respeeds} == pytest.approx({"h": 0.7, "k": 0.6})
    s.finished("h", 300)
    s.finished("k", 300)
    assert s.cluster.free_gpus == 1


def test_the_best_pair_wins_and_ties_go_to_the_earliest_host(tmp_path):
    # Two GPUs: h1 and h2 (both A) and c (C) run. g (B) pairs with A at 1.3 and cannot share
    # with C (not measured): of the two equal A hosts, h1, which arrived first, gets it.
    table = load_pair_table(write_table(tmp_path))
    s = scheduler(1, 3, policy="fifo", stages=[Packing(table)])
    for name, model in (("h1", "A"), ("h2", "A"), ("c", "C")):
        s.submit(spec(name, 1, model=model), 0)
    s.decide(0)
    s.submit(spec("g", 1, submit=10, model="B"), 10)
    assert started(s.decide(10).actions) == {"g": s.jobs["h1"].placement}
    assert s.stage("packing").partner["g"] is s.jobs["h1"]


def test_a_pair_at_or_below_the_threshold_is_refused(tmp_path):
    # A+C make exactly 1.0: not above 1.1, and not above 1.0 either (no better than turns).
    for threshold in (1.1, 1.0):
        s = packing_scheduler(tmp_path, threshold=threshold)
        s.submit(spec("h", 1, model="A"), 0)
        s.decide(0)
        s.submit(spec("g", 1, model="C"), 0)
        assert s.decide(10).actions == []
        assert s.jobs["g"].status is JobStatus.PENDING
    # With a threshold of 0.9 the same pair is accepted.
    s = packing_scheduler(tmp_path, threshold=0.9)
    s.submit(spec("h", 1, model="A"), 0)
    s.decide(0)
    s.submit(spec("g", 1, model="C"), 0)
    assert list(started(s.decide(10).actions)) == ["g"]


def test_preempting_a_packed_job_frees_its_gpu_only_with_its_partner(tmp_path):
    # LAS, one queue threshold at 100 GPU-s. h (A) runs from 0; g (B) arrives at 50, same queue
    # as h (50 GPU-s < 100), later arrival: it cannot preempt h, so it packs. h drops a queue at
    # t=100, g at t=150 (attained time, not work). At 160 a new job n (queue 0) needs the GPU:
    # preempting h alone would free nothing, so both members of the pair are preempted.
    s = packing_scheduler(tmp_path, policy="las", policy_options={"thresholds_gpu_s": [100]})
    s.submit(spec("h", 1, model="A"), 0)
    s.decide(0)
    s.submit(spec("g", 1, submit=50, model="B"), 50)
    assert list(started(s.decide(50).actions)) == ["g"]
    s.decide(100)
    s.decide(150)
    s.submit(spec("n", 1, submit=160, model="C"), 160)
    decision = s.decide(160)
    assert sorted(preempted(decision.actions)) == ["g", "h"]
    assert list(started(decision.actions)) == ["n"]
    assert decision.respeeds == []  # the pair's members stopped: nothing to re-time
    assert s.stage("packing").packed_gpu_s == pytest.approx(110)  # one GPU shared from 50 to 160


def test_pairs_that_did_not_fit_are_known_not_to_share(tmp_path):
    # B+C are zeros in the table: (0, 0), as every pair it lacks, so no prior for pairs never
    # measured applies in the simulator.
    table = load_pair_table(write_table(tmp_path))
    host = Job(spec("h", 1, model="B"))
    assert table(Job(spec("g", 1, model="C")), host, "v100") == (0.0, 0.0)
    s = scheduler(1, 1, stages=[Packing(table, unmeasured=1.0)])
    s.submit(spec("h", 1, model="B"), 0)
    s.decide(0)
    s.submit(spec("g", 1, model="C"), 0)
    assert s.decide(10).actions == []


class Measured:
    """A pair table the test changes, as the live manager's measurements do."""

    def __init__(self) -> None:
        self.pairs: dict[tuple[str, str], tuple[float, float]] = {}

    def __call__(self, guest: Job, host: Job, gpu_type: str) -> tuple[float, float] | None:
        return self.pairs.get((guest.spec.model, host.spec.model))


def test_an_unmeasured_pair_is_tried_once_on_the_prior():
    # One GPU, nothing measured, prior 0.6 each (1.2 > 1.1). h (A) runs from 0; g (B) arrives
    # at 10 and packs on the prior: both run at 0.6. g ends at 20; k (B) arrives: A+B was tried
    # and is still unmeasured, so k waits. A pair of other models (A+C) is tried in its turn
    # (once k, at the head of fifo's queue, is gone).
    s = scheduler(1, 1, stages=[Packing(Measured(), unmeasured=0.6)])
    s.submit(spec("h", 1, model="A"), 0)
    s.decide(0)
    s.submit(spec("g", 1, submit=10, model="B"), 10)
    decision = s.decide(10)
    assert list(started(decision.actions)) == ["g"]
    assert {r.job_id: r.speed for r in decision.respeeds} == pytest.approx({"h": 0.6, "g": 0.6})
    s.finished("g", 20)
    s.submit(spec("k", 1, submit=20, model="B"), 20)
    assert s.decide(20).actions == [] and s.jobs["k"].status is JobStatus.PENDING
    s.cancel("k", 30)
    s.submit(spec("c", 1, submit=30, model="C"), 30)
    assert list(started(s.decide(30).actions)) == ["c"]
    # Without a prior an unmeasured pair is never packed (the simulator's tables' rule).
    s = scheduler(1, 1, stages=[Packing(Measured())])
    s.submit(spec("h", 1, model="A"), 0)
    s.decide(0)
    s.submit(spec("g", 1, model="B"), 0)
    assert s.decide(10).actions == []


def test_a_running_pair_follows_its_measurement_and_is_split_when_it_loses():
    # h (A) and g (B) pack on the prior at 10 (0.6 + 0.6). At 20 the pair is measured at 0.9 and
    # 0.8 (1.7 > 1.1): both run on at those speeds (not at 0.92 and 0.78 measured at 25: within
    # 5 % of them). At 30 it is measured at 0.5 + 0.4 = 0.9: the round splits it, stopping the
    # guest g ("unpacked", counted as a preemption); h gets its speed alone back and g waits:
    # the pair it would form is measured to lose.
    table = Measured()
    s = scheduler(1, 1, stages=[Packing(table, unmeasured=0.6)])
    s.submit(spec("h", 1, model="A"), 0)
    s.decide(0)
    s.submit(spec("g", 1, submit=10, model="B"), 10)
    s.decide(10)
    assert s.decide(15).respeeds == []  # nothing measured: the pair keeps its prior speeds
    table.pairs = {("B", "A"): (0.9, 0.8), ("A", "B"): (0.8, 0.9)}
    gain = s.decide(20)
    assert gain.actions == []
    assert {r.job_id: r.speed for r in gain.respeeds} == pytest.approx({"g": 0.9, "h": 0.8})
    assert s.jobs["g"].work_done_at(30) == pytest.approx(0.6 * 10 + 0.9 * 10)
    # A measurement refined by a few percent (within 5 %) leaves the speeds as they are.
    table.pairs = {("B", "A"): (0.92, 0.78), ("A", "B"): (0.78, 0.92)}
    assert s.decide(25).respeeds == [] and s.jobs["g"].speed == 0.9
    table.pairs = {("B", "A"): (0.5, 0.4), ("A", "B"): (0.4, 0.5)}
    split = s.decide(30)
    (stop,) = split.actions
    assert isinstance(stop, Preempt)
    assert (stop.job_id, stop.by_job_id, stop.kind) == ("g", "h", "unpacked")
    assert {r.job_id: r.speed for r in split.respeeds} == {"h": 1.0}
    g = s.jobs["g"]
    assert g.status is JobStatus.PENDING and g.preemptions == 1
    assert g.last_event.startswith("unpacked from job h: sharing, they ran at 0.50 and 0.40")
    assert s.counters()["unpacked_pairs"] == 1 and s.cluster.free_gpus == 0
    assert s.decide(40).actions == []  # not packed again


def test_a_packed_pair_found_running_after_a_restart_shares_again():
    # The shell restores h (started at 0) and g (started at 5) on the same GPU: g, the later,
    # is the guest; unmeasured, both run at the prior. Without a sharing stage it is refused.
    s = scheduler(1, 2, stages=[Packing(Measured(), unmeasured=0.6)])
    for name, model in (("h", "A"), ("g", "B")):
        s.submit(spec(name, 1, model=model), 0)
    s.restore_running("h", (0,), 0.0, 10.0)
    s.restore_running("g", (0,), 5.0, 10.0)
    assert s.stage("packing").partner["g"] is s.jobs["h"] and s.stage("packing").shares(s.jobs["h"])
    assert (s.jobs["h"].speed, s.jobs["g"].speed) == (0.6, 0.6)
    assert s.cluster.free_gpus == 1
    s.finished("h", 20)
    assert s.jobs["g"].speed == 1.0 and s.cluster.free_gpus == 1
    # A pair restored with a measurement that loses (0.5 + 0.4) is split by the next round; g
    # then starts at once on the free GPU (the shell starts it once its stop is done).
    table = Measured()
    table.pairs = {("B", "A"): (0.5, 0.4)}
    s = scheduler(1, 2, stages=[Packing(table, unmeasured=0.6)])
    for name, model in (("h", "A"), ("g", "B")):
        s.submit(spec(name, 1, model=model), 0)
    s.restore_running("g", (0,), 5.0, 10.0)  # the order the shell finds them in is no matter
    s.restore_running("h", (0,), 0.0, 10.0)
    assert (s.jobs["h"].speed, s.jobs["g"].speed) == (0.4, 0.5)
    split = s.decide(11)
    (stop, start) = split.actions
    assert isinstance(stop, Preempt) and (stop.job_id, stop.kind) == ("g", "unpacked")
    assert isinstance(start, Start) and (start.job_id, start.gpus) == ("g", (1,))
    plain = scheduler(1, 2)
    for name in "hg":
        plain.submit(spec(name, 1), 0)
    plain.restore_running("h", (0,), 0.0, 10.0)
    with pytest.raises(ValueError, match="held by another running job"):
        plain.restore_running("g", (0,), 5.0, 10.0)


def test_packing_refuses_an_admission():
    from corral.core.admission.quota import QuotaAdmission

    with pytest.raises(ValueError, match="admission"):
        scheduler(
            1, 1, stages=[Packing(lambda g, h, t: None)], admission=QuotaAdmission({"default": 1})
        )
    with pytest.raises(ValueError, match="threshold"):
        Packing(lambda g, h, t: None, threshold=0)


# -- migration --------------------------------------------------------------------------------------


def fragmented(restore_s=30.0):
    """Two 8-GPU nodes, fifo, migration on. At t=0: p(4) and f(4) fill node 0 (best fit), q(2)
    and r(2) go to node 1. At t=50 f ends: 4 GPUs free on each node, 8 in all, none of them a
    whole node."""
    s = scheduler(2, 8, policy="fifo", stages=[Migration()], restore_s=restore_s)
    for name, gpus in (("p", 4), ("f", 4), ("q", 2), ("r", 2)):
        s.submit(spec(name, gpus), 0)
    s.decide(0)
    assert s.cluster.nodes_of(s.jobs["p"].placement) == {0}
    assert s.cluster.nodes_of(s.jobs["q"].placement) == {1}
    s.finished("f", 50)
    s.decide(50)
    return s


def test_migration_frees_a_whole_node_for_an_eight_gpu_job():
    # W needs 8 GPUs on one node. Node 0 lacks 4: moving p (4 GPUs) to node 1's 4 free GPUs is
    # one move; node 1 lacks 4 too but needs q and r moved (two moves). So p moves (a stop and a
    # resumed start, paying the 30 s restore) and W takes node 0; nothing is preempted.
    s = fragmented()
    s.submit(spec("W", 8, submit=100), 100)
    decision = s.decide(100)
    p = s.jobs["p"]
    assert preempted(decision.actions) == ["p"]
    assert [a.kind for a in decision.actions if isinstance(a, Preempt)] == ["migrated"]
    assert [(a.job_id, a.resumed) for a in decision.actions if isinstance(a, Start)] == [
        ("p", True),
        ("W", False),
    ]
    assert s.cluster.nodes_of(p.placement) == {1}
    assert s.cluster.nodes_of(s.jobs["W"].placement) == {0}
    assert p.stall_until == 130 and p.work_done_s == pytest.approx(100)
    assert s.stage("migration").migrations == 1 and p.migrations == 1
    assert s.preemptions == 0 and p.preemptions == 0
    assert s.cluster.free_gpus == 0


def test_no_migration_when_it_would_not_help():
    # A node came wholly free: the 8-GPU job is placed without moving anyone.
    s = fragmented()
    s.submit(spec("big", 8, submit=100), 100)
    s.finished("p", 90)  # node 0 wholly free: big fits without any move
    assert [a.job_id for a in s.decide(100).actions] == ["big"]
    assert s.stage("migration").migrations == 0

    # Two 4-GPU nodes each running a 3-GPU job: 1 + 1 GPUs free, a 2-GPU job does not fit, and
    # moving a 3-GPU job needs 3 free GPUs elsewhere.
    s = scheduler(2, 4, policy="fifo", stages=[Migration()])
    s.submit(spec("a", 3), 0)
    s.submit(spec("b", 3), 0)
    s.decide(0)
    s.submit(spec("w", 2, submit=10), 10)
    assert s.decide(10).actions == []
    assert s.stage("migration").migrations == 0 and s.jobs["w"].status is JobStatus.PENDING


def test_no_migration_for_too_few_free_gpus_or_a_job_started_now():
    # 6 GPUs asked, 4 + 4 free. Node 0 lacks 2 and would move p (4 GPUs); node 1 lacks 2 and moves
    # q (2 GPUs): one move either way, fewer GPUs moved wins. With every job started at this
    # instant (the scheduler's rule: never moved), or 16 GPUs asked (8 free), there is no plan.
    s = fragmented()
    w = Job(spec("w", 6))
    plan = Migration().plan(s.cluster, w, s.running_jobs(), lambda job: True)
    assert plan is not None and [m.job.id for m in plan.moves] == ["q"]  # node 1 lacks 2: q(2)
    started_now = lambda job: job.run_started_at != 0  # noqa: E731 (every job started at 0)
    assert Migration().plan(s.cluster, w, s.running_jobs(), started_now) is None
    s.submit(spec("huge", 16, submit=100), 100)
    assert Migration().plan(s.cluster, s.jobs["huge"], s.running_jobs(), lambda job: True) is None
