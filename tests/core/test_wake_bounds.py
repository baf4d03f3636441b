"""A policy's own wake-ups (`Policy.wakes_at`, where key changes do not wake: the Tiresias preset's
`demote_at_rounds`) are searched lazily, asking only the running jobs whose bound
(`Policy.wake_bound`) lies before the earliest wake-up found: the bound holds, worked by hand and
on random job states, and random traces are decided exactly as when every running job is asked
at every round."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.core import Job, JobStatus, Preempt
from corral.core.policy import make_policy
from corral.core.policy.las import tiresias_wake, tiresias_wake_bound
from corral.sim.engine import Simulation
from tests.core.helpers import random_trace, scheduler, spec


def running(gpus: int, started: float, executed_s: float = 0.0, attained: float = 0.0) -> Job:
    job = Job(spec("j", gpus))
    job.status = JobStatus.RUNNING
    job.run_started_at = started
    job.executed_s = executed_s
    job.attained_gpu_s = attained
    return job


def test_tiresias_s_wake_up_falls_by_less_than_a_second_as_the_job_runs():
    # 3 GPUs from 0, queue limit 100: at 0.9 s executed, 0.9 + floor((100 - 0) / 3) = 33.9; at
    # 1.0 s, 1 + floor(99 / 3) = 34; at 2.0 s, 2 + floor(98 / 3) = 34; at 1.99 s, 1.99 + 33 =
    # 34.99. The wake moves back by 0.99 s from 1.99 to 2.0 and never more.
    job = running(3, 0.0)
    assert tiresias_wake(job, 0.9, [100.0], 0) == pytest.approx(33.9)
    assert tiresias_wake(job, 1.0, [100.0], 0) == 34
    assert tiresias_wake(job, 1.99, [100.0], 0) == pytest.approx(34.99)
    assert tiresias_wake(job, 2.0, [100.0], 0) == 34
    assert tiresias_wake_bound(34.99) < 34
    # The last queue has no limit: no wake-up, and no bound to ask it again.
    assert tiresias_wake(job, 50.0, [100.0], 1) == math.inf
    assert tiresias_wake_bound(math.inf) == math.inf


@settings(max_examples=300, deadline=None)
@given(
    gpus=st.integers(1, 64),
    executed=st.floats(0, 1e6),
    started=st.floats(0, 1e7),
    since=st.floats(0, 1e5),
    later=st.lists(st.one_of(st.floats(0, 1e6), st.integers(0, 10**6)), min_size=1, max_size=20),
    limits=st.lists(st.integers(1, 10**6), min_size=1, max_size=4, unique=True),
    policy=st.sampled_from(["las", "gittins"]),
)
def test_the_bound_holds_at_every_later_instant_of_the_attempt(
    gpus, executed, started, since, later, limits, policy
):
    thresholds = sorted(float(limit) for limit in limits)
    options: dict = {"thresholds_gpu_s": thresholds, "demote_at_rounds": True}
    if policy == "gittins":
        options.update(queues=True, service_samples_gpu_s=[10.0, 1000.0, 1e5])
    chosen = make_policy(policy, **options)
    job = running(gpus, started, executed, attained=executed * gpus)
    now = started + since
    wake = chosen.wakes_at(job, now)
    bound = chosen.wake_bound(job, now, wake)
    assert bound <= wake
    for step in later:
        assert chosen.wakes_at(job, now + step) >= bound


def lazy_and_asking_all(seed: int, policy: str, placement: str, victims: str):
    """The decisions of a random overloaded trace on 4 nodes x 4 GPUs, with the lazy search and
    with every running job asked at every round (no bound), and how often each asked."""
    if policy == "las":
        options: dict = {"queue_order": "started", "preempt_within_queue": False}
    else:
        history = random_trace(seed + 100, 300)
        options = {
            "service_samples_gpu_s": [job.gpus * (job.duration_s or 0) for job in history],
            "queues": True,
            "formula": "tiresias",
            "delta_gpu_s": 300.0,
        }
    options.update(thresholds_gpu_s=[300, 2000], demote_at_rounds=True)
    runs, asked = [], []
    for lazy in (True, False):
        s = scheduler(4, 4, policy, placement=placement, victims=victims, policy_options=options)
        policy_object = s.policy
        wakes_at = policy_object.wakes_at
        count = [0]

        def counted(job, now, wakes_at=wakes_at, count=count):  # type: ignore[no-untyped-def]
            count[0] += 1
            return wakes_at(job, now)

        policy_object.wakes_at = counted  # type: ignore[method-assign]
        if not lazy:
            policy_object.wake_bound = lambda job, now, wake: -math.inf  # type: ignore[method-assign]
        result = Simulation(random_trace(seed, 200, 15.0), s, record_decisions=True).run()
        runs.append(result.decisions)
        asked.append(count[0])
    return runs, asked


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("policy", ["las", "gittins"])
@pytest.mark.parametrize(("placement", "victims"), [("any", "in-order"), ("yarn", "lowest")])
def test_the_lazy_search_decides_exactly_as_asking_every_running_job(
    seed, policy, placement, victims
):
    (lazy, every), (asked_lazily, asked_all) = lazy_and_asking_all(seed, policy, placement, victims)
    assert sum(isinstance(action, Preempt) for _, action in every) > 5
    assert lazy == every
    assert asked_lazily < asked_all / 2
