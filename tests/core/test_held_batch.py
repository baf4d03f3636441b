"""The held key changes of running jobs taken as one batch (corral.core.timers, `_replay`):
`SchedulerState.rekey_each` (the running index moved in place for a few jobs, sorted again for
many), `Timers.set_each` (the lazy timers `set` would push) and Gittins' table of key heads
(`_heads`), with expectations worked out by hand."""

from __future__ import annotations

import math

import pytest

from corral.core.job import JobSpec
from corral.core.policy.gittins import Gittins
from corral.core.state import _FEW_MOVES
from tests.core.helpers import scheduler

#: The preset's form of gittins (queues, its own formula, key changes held back), small.
OPTIONS = {
    "service_samples_gpu_s": [100.0, 200.0, 400.0, 800.0],
    "queues": True,
    "formula": "tiresias",
    "delta_gpu_s": 300.0,
    "quantiles": 1,
    "thresholds_gpu_s": [300.0],
    "demote_at_rounds": True,
}


def ten_running():  # type: ignore[no-untyped-def]
    """Ten one-GPU jobs j0..j9 (submitted at 0..9 s) running on one node of 16 GPUs since 10 s;
    none has attained service yet, so their keys differ only by submission: j0 first."""
    s = scheduler(1, 16, "gittins", placement="any", policy_options=OPTIONS)
    assert s.timers.holds
    for i in range(10):
        s.submit(JobSpec(id=f"j{i}", submit_time=float(i), gpus=1, duration_s=1e5), float(i))
    s.decide(10.0)
    jobs = {job.spec.id: job for job in s.running_jobs()}
    assert list(jobs) == [f"j{i}" for i in range(10)]
    return s, jobs


def order(s) -> list[str]:  # type: ignore[no-untyped-def]
    return [job.spec.id for job in s.running_jobs()]


@pytest.mark.parametrize("many", [False, True])
def test_rekey_each_orders_the_running_jobs_by_their_new_keys(many: bool) -> None:
    s, jobs = ten_running()
    head = s.policy.stored_key(jobs["j9"], 10.0)[:2]  # every job's now
    if many:  # nine jobs move (more than _FEW_MOVES): the index is sorted again at once
        # j0..j8 take the submission times 18.5, 16.5, ..., 2.5 (keys: head, submit, seq); j9 (9 s)
        # stays, between j5 (8.5 s) and j4 (10.5 s)
        moves = {f"j{i}": (*head, 18.5 - 2 * i) for i in range(9)}
        expected = ["j8", "j7", "j6", "j5", "j9", "j4", "j3", "j2", "j1", "j0"]
        assert len(moves) > _FEW_MOVES
    else:  # two jobs swap ends, each moved in place (or taken out and put back)
        moves = {"j0": (*head, 20.0), "j5": (*head, -1.0)}
        expected = ["j5", "j1", "j2", "j3", "j4", "j6", "j7", "j8", "j9", "j0"]
    taken = []
    for name, moved in moves.items():
        job = jobs[name]
        taken.append((job, 10.0, (*moved, job.seq), 50.0))
    s.rekey_each(taken)
    assert order(s) == expected
    # the stored keys are the index's: level 0 first, the seq last
    j0 = jobs["j0"]
    assert s._stored[j0.seq] == (0, *moves["j0"], j0.seq, j0.seq)
    assert sorted(s._stored.values()) == s._running.keys


def test_rekey_each_sets_each_jobs_lazy_timer_as_set_would() -> None:
    s, jobs = ten_running()
    timers = s.timers
    versions = {name: timers._version[job.seq] for name, job in jobs.items()}
    taken = []
    for name, at in (("j1", 40.0), ("j2", 5.0), ("j3", math.inf)):
        job = jobs[name]
        key = s.policy.stored_key(job, 10.0)
        taken.append((job, 10.0, key, at))
    before = len(timers._lazy)
    s.rekey_each(taken)
    for name in ("j1", "j2", "j3"):
        assert timers._version[jobs[name].seq] == versions[name] + 1
    # j1 at its change, j2's past change at the instant of its re-key (10 s), j3 none
    pushed = sorted(timer for timer in timers._lazy if timer[2] == versions["j1"] + 1)
    assert (40.0, jobs["j1"].seq, versions["j1"] + 1) in timers._lazy
    assert (10.0, jobs["j2"].seq, versions["j2"] + 1) in timers._lazy
    assert not any(timer[1] == jobs["j3"].seq and timer[2] > versions["j3"] for timer in pushed)
    assert len(timers._lazy) == before + 2


def test_rekey_each_keeps_the_quiet_round_unless_a_waiting_job_lies_between() -> None:
    s, jobs = ten_running()
    # a job of 16 GPUs waits: its key, of no service yet, sorts after j0..j9's (submitted later)
    s.submit(JobSpec(id="big", submit_time=10.0, gpus=16, duration_s=1e5), 10.0)
    head = s.policy.stored_key(jobs["j0"], 10.0)[:2]
    quiet = (1, False, False)

    def move(name: str, submit: float) -> None:
        job = jobs[name]
        s._quiet = quiet
        s.rekey_each([(job, 10.0, (*head, submit, job.seq), math.inf)])

    move("j1", 1.5)  # still before the waiting job: nothing it reads changed
    assert s._quiet == quiet
    move("j1", 11.0)  # past it: the waiting job's victims change
    assert s._quiet is None
    s._quiet = (1, False, True)  # a round that tried a placement while preempting
    s.rekey_each([])  # nothing taken: nothing changes
    assert s._quiet == (1, False, True)


def test_gittins_key_heads_by_hand() -> None:
    # One quantile: the levels are 0, the samples 100, 200, 400, 800 and the threshold 300.
    policy = Gittins([100.0, 200.0, 400.0, 800.0], (300.0,), 1, **_preset_kw())
    assert policy.grid == [0.0, 100.0, 200.0, 300.0, 400.0, 800.0]
    # the queue changes at the threshold 300; the index is the one of the first sample above
    # the level, so 200 and 300 share 400's, and beyond the largest sample it is 0
    index = policy.index_at
    assert index[2] == index[3] and index[5] == 0.0
    assert policy._heads == [
        (0, -index[0]),
        (0, -index[1]),
        (0, -index[2]),
        (1, -index[2]),
        (1, -index[4]),
        (1, -0.0),
    ]
    plain = Gittins([100.0, 200.0, 400.0, 800.0], (300.0,), 1, **_preset_kw(queues=False))
    assert plain._heads == [(-i,) for i in plain.index_at]


def _preset_kw(queues: bool = True) -> dict:
    return {"queues": queues, "delta_gpu_s": 300.0, "formula": "tiresias"}
