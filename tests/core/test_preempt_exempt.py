"""A running job is no preemption victim until it has run `preempt_exempt_s` since its last start
(Slurm's PreemptExemptTime): hand-worked LAS scenarios on one node of 2 GPUs."""

from __future__ import annotations

import pytest

from corral.core import Preempt, Scheduler, Start
from corral.core.framework import CoreOptions, config_from_mapping
from corral.core.options import OptionError
from tests.core.helpers import scheduler, spec


def two_in_queue_one(exempt_s: float, victims: str = "lowest") -> Scheduler:
    """LAS split at 100 GPU-s, one node of 2 GPUs, placement any. A and B (1 GPU each) start at
    t=0 on GPUs 0 and 1 and cross 100 GPU-s at t=100 (queue 1). C (queue 0) arrives at t=150
    and preempts the lowest of queue 1, B (same submit time, later seq). C ends at t=200 and B
    resumes then on GPU 1: at t=210 B has run 10 s since its last start, A 210 s."""
    s = scheduler(
        1,
        2,
        "las",
        placement="any",
        policy_options={"thresholds_gpu_s": [100]},
        preempt_exempt_s=exempt_s,
        victims=victims,
    )
    s.submit(spec("A", 1, submit=0), 0)
    s.submit(spec("B", 1, submit=0), 0)
    assert s.decide(0).actions == [Start("A", (0,)), Start("B", (1,))]
    s.submit(spec("C", 1, submit=150), 150)
    assert s.decide(150).actions == [Preempt("B", (1,), "C"), Start("C", (1,))]
    s.finished("C", 200)
    assert s.decide(200).actions == [Start("B", (1,), resumed=True)]
    assert s.jobs["B"].run_started_at == 200
    return s


@pytest.mark.parametrize("victims", ["lowest", "in-order"])
def test_without_exemption_the_lowest_job_gives_way_however_recently_it_started(
    victims: str,
) -> None:
    s = two_in_queue_one(0.0, victims)
    s.submit(spec("D", 1, submit=210), 210)
    # B is the lowest of queue 1: D (queue 0) preempts it, 10 s after it resumed.
    assert s.decide(210).actions == [Preempt("B", (1,), "D"), Start("D", (1,))]


# In-order (Tiresias's pass) reads its victims as a slice of the running index: from the highest
# down, A keeps its GPU while it fits in what D leaves (2 - 1 = 1), B gives way; with B exempt,
# only A is a candidate, and 0 GPUs are left over: A gives way.
@pytest.mark.parametrize("victims", ["lowest", "in-order"])
def test_a_job_started_10_s_ago_is_exempt_for_30_s_and_the_older_one_gives_way(
    victims: str,
) -> None:
    s = two_in_queue_one(30.0, victims)
    s.submit(spec("D", 1, submit=210), 210)
    # B resumed at t=200: 10 s < 30 s, exempt; A (running since t=0) is the next victim.
    assert s.decide(210).actions == [Preempt("A", (0,), "D"), Start("D", (0,))]


@pytest.mark.parametrize("victims", ["lowest", "in-order"])
def test_after_its_exemption_the_recent_job_is_the_victim_again(victims: str) -> None:
    s = two_in_queue_one(30.0, victims)
    s.submit(spec("D", 1, submit=231), 231)
    # At t=231 B has run 31 s >= 30 s since its resume: the lowest job, it gives way.
    assert s.decide(231).actions == [Preempt("B", (1,), "D"), Start("D", (1,))]


def test_a_job_needing_the_exempt_one_waits_and_the_scheduler_wakes_when_it_ends() -> None:
    s = two_in_queue_one(30.0)
    s.submit(spec("D", 2, submit=210), 210)
    # D needs both GPUs: A may give way, B is exempt until t=230: too few victims, nothing
    # preempted (A keeps running), and the scheduler asks to be woken at t=230.
    decision = s.decide(210)
    assert decision.actions == []
    assert decision.wake_at == pytest.approx(230)
    # A round in between changes nothing (it may repeat the quiet round: B is still exempt).
    assert s.decide(220).actions == []
    assert s.jobs["A"].status.value == "RUNNING"
    # At t=230 B's exemption ends: both give way (the lowest first), D starts on both GPUs.
    actions = s.decide(230).actions
    assert Preempt("B", (1,), "D") in actions and Preempt("A", (0,), "D") in actions
    assert actions[-1] == Start("D", (0, 1))


def test_the_option_is_checked_and_named_like_the_other_core_options() -> None:
    assert CoreOptions().preempt_exempt_s == 0.0
    assert config_from_mapping({"preempt_exempt_s": 45}).core.preempt_exempt_s == 45.0
    with pytest.raises(OptionError, match=r"scheduler\.preempt_exempt_s: must be >= 0"):
        config_from_mapping({"preempt_exempt_s": -1})
