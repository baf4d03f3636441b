"""The core's retry rule (backoff, user errors) and how the Scheduler applies its verdicts."""

from __future__ import annotations

import pytest

from corral.core import JobStatus, Start
from corral.core.options import OptionError, build, describe
from corral.core.retry import Failure, FailureReport, RetryOptions, RetryRule
from tests.core.helpers import scheduler, spec

RULE = RetryRule()  # backoff 5 s doubling up to 300 s; 3 alike failures within 60 s end a job


def fast(signature: str = "exit 1", ran_s: float = 10.0, infrastructure: bool = False) -> Failure:
    return Failure(signature, ran_s, infrastructure)


def slow(signature: str = "exit 1") -> Failure:
    return Failure(signature, 61.0)


# -- the rule ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("failures", "backoff"),
    # 5 x 2^(n-1): 5, 10, 20, 40, 80, 160, then 320 and more are capped at 300.
    [(1, 5.0), (2, 10.0), (3, 20.0), (4, 40.0), (5, 80.0), (6, 160.0), (7, 300.0), (8, 300.0)],
)
def test_the_backoff_doubles_from_5_s_up_to_the_300_s_cap(failures: int, backoff: float) -> None:
    history = [slow(f"failure {i}") for i in range(failures)]
    verdict = RULE.judge(history, "boom")
    assert verdict == RULE.judge(history, "boom")
    assert (verdict.give_up, verdict.retry_after_s, verdict.reason) == (False, backoff, "boom")
    assert RULE.backoff(failures) == backoff


def test_a_huge_failure_count_still_gets_the_cap() -> None:
    assert RULE.backoff(5000) == 300.0 and RULE.backoff(0) == 0.0


def test_the_same_fast_failure_ends_the_job_on_exactly_its_third_time() -> None:
    assert not RULE.judge([fast()], "exit 1").give_up
    assert not RULE.judge([fast(), fast()], "exit 1").give_up
    verdict = RULE.judge([fast(), fast(), fast()], "exit 1: No module named 'torchh'")
    assert verdict.give_up
    assert verdict.reason == (
        "user error: the same failure 3 times in a row, each within 60 s "
        "(exit 1: No module named 'torchh')"
    )


@pytest.mark.parametrize("repeats", [0, 1, 4])
def test_give_up_comes_after_fast_fail_repeats_plus_one_alike_failures(repeats: int) -> None:
    rule = RetryRule(RetryOptions(fast_fail_repeats=repeats))
    history: list[Failure] = []
    for _ in range(repeats):
        history.append(fast())
        assert not rule.judge(history, "x").give_up
    history.append(fast())
    assert rule.judge(history, "x").give_up


def test_a_slow_failure_breaks_the_run_and_60_s_exactly_still_counts_as_fast() -> None:
    # fast, slow, fast, fast: only the last two are a run.
    history = [fast(), slow(), fast(), fast(ran_s=60.0)]
    assert not RULE.judge(history, "x").give_up
    assert RULE.judge([*history, fast()], "x").give_up
    assert not RULE.judge([fast(), fast(), slow()], "x").give_up  # the latest is slow


def test_a_different_signature_breaks_the_run() -> None:
    assert not RULE.judge([fast("a"), fast("a"), fast("b")], "x").give_up
    assert not RULE.judge([fast("a"), fast("b"), fast("a")], "x").give_up
    assert RULE.judge([fast("b"), fast("a"), fast("a"), fast("a")], "x").give_up


def test_repeated_fast_infrastructure_failures_end_the_job_as_lost() -> None:
    # A supervisor that dies at once, again and again, is not retried forever.
    lost = [fast("supervisor died", infrastructure=True)] * 3
    verdict = RULE.judge(lost, "lost: supervisor died")
    assert verdict.give_up
    assert verdict.reason.startswith("lost: the same failure 3 times in a row, each within 60 s")


def test_the_options_are_declared_with_help_and_ranges() -> None:
    infos = {info.name: info for info in describe(RetryOptions)}
    assert list(infos) == ["backoff_s", "backoff_max_s", "fast_fail_s", "fast_fail_repeats"]
    assert [infos[n].default for n in infos] == [5.0, 300.0, 60.0, 2]
    assert all(info.help and info.low == 0 for info in infos.values())
    assert build(RetryOptions, {"backoff_s": "1.5"}, "retry").backoff_s == 1.5
    with pytest.raises(OptionError, match="retry.fast_fail_repeats: must be >= 0"):
        build(RetryOptions, {"fast_fail_repeats": -1}, "retry")


# -- the Scheduler applies the verdicts -----------------------------------------------------------


def test_a_failed_job_is_held_for_its_backoff_then_starts_again() -> None:
    s = scheduler(1, 1)
    s.submit(spec("a", 1, max_retries=5), 0)
    assert s.decide(0).actions == [Start("a", (0,))]
    a = s.failed("a", 100, "exit 1")  # ran 100 s: slow, retried after 5 s
    assert (a.status, a.failures, a.hold_until) == (JobStatus.PENDING, 1, 105)
    assert a.verdict is not None and a.verdict.retry_after_s == 5 and not a.verdict.give_up
    assert a.failure_history == (Failure("exit 1", 100.0, False),)
    held = s.decide(104)
    assert held.actions == [] and held.wake_at == 105
    assert a.pending_reason == "retry backoff: held for 1 s more"
    assert s.decide(105).actions == [Start("a", (0,), resumed=True)]
    s.failed("a", 205, "exit 1")  # the second failure: 10 s
    assert a.hold_until == 215 and s.decide(214).actions == []
    assert s.decide(215).actions == [Start("a", (0,), resumed=True)]


def test_the_explanation_counts_the_backoff_down_from_now() -> None:
    """`explain` (what describe and ls show) says how long the hold lasts from the time asked,
    not what the last scheduling round wrote: no round runs while a job is held."""
    s = scheduler(1, 1)
    s.submit(spec("a", 1, max_retries=5), 0)
    s.decide(0)
    s.failed("a", 100, "exit 1")  # held until 105
    s.decide(100)
    assert s.explain("a", 100).endswith("retry backoff: held for 5 s more")
    assert s.explain("a", 102).endswith("retry backoff: held for 3 s more")
    assert s.explain("a", 104.6).endswith("retry backoff: held for 0 s more")
    assert s.explain("a", 105).endswith("retry backoff over: waiting for the next scheduling round")


def test_the_third_alike_fast_failure_ends_the_job_failed_with_the_reason() -> None:
    s = scheduler(1, 1)
    s.submit(spec("a", 1, max_retries=10), 0)
    s.decide(0)
    s.failed("a", 10, FailureReport("exit 1 at 00:00:10", signature="exit 1"))  # held until 15
    assert s.decide(15).actions == [Start("a", (0,), resumed=True)]
    s.failed("a", 20, FailureReport("exit 1 at 00:00:20", signature="exit 1"))  # held until 30
    assert s.decide(30).actions == [Start("a", (0,), resumed=True)]
    a = s.failed("a", 40, FailureReport("exit 1 at 00:00:40", signature="exit 1"))
    reason = "user error: the same failure 3 times in a row, each within 60 s (exit 1 at 00:00:40)"
    assert (a.status, a.attempts, a.failures, a.finished_at) == (JobStatus.FAILED, 3, 3, 40)
    assert a.verdict is not None and a.verdict.give_up and a.verdict.reason == reason
    assert a.last_event == f"failed: {reason}"
    assert s.explain("a", 41) == f"FAILED: failed: {reason}"
    assert s.cluster.free_gpus == 1


def test_without_a_signature_the_reason_is_compared() -> None:
    s = scheduler(1, 1)
    s.submit(spec("a", 1, max_retries=10), 0)
    s.decide(0)
    for at, start in ((10, 15), (20, 30)):
        s.failed("a", at, f"exit 1 at {at}")  # different reasons: never alike
        s.decide(start)
    assert s.failed("a", 40, "exit 1 at 40").status is JobStatus.PENDING


def test_infrastructure_failures_do_not_use_up_max_retries() -> None:
    s = scheduler(1, 1)
    s.submit(spec("a", 1, max_retries=0), 0)
    s.decide(0)
    now = 0.0
    for n in range(1, 5):  # four slow node failures: each retried, none counted as a retry
        now += 100
        a = s.failed("a", now, FailureReport(f"node n0 failed ({n})", infrastructure=True))
        assert (a.status, a.failures, a.infra_failures) == (JobStatus.PENDING, 0, n)
        now = a.hold_until
        assert s.decide(now).actions == [Start("a", (0,), resumed=True)]
    a = s.failed("a", now + 100, "exit 1")  # one failure of its own exceeds max_retries 0
    assert (a.status, a.failures, a.infra_failures) == (JobStatus.FAILED, 1, 4)
    assert a.last_event == "failed: exit 1" and a.verdict is not None and a.verdict.give_up
    assert len(a.failure_history) == 5


def test_a_node_failure_holds_the_job_for_the_backoff() -> None:
    s = scheduler(2, 1)
    s.submit(spec("a", 1), 0)
    (start,) = s.decide(0).actions
    assert isinstance(start, Start)
    node = s.cluster.gpu_node[start.gpus[0]]
    (a,) = s.node_failed(node, 30)
    assert (a.status, a.infra_failures, a.hold_until) == (JobStatus.PENDING, 1, 35)
    assert s.decide(30).actions == []
    (again,) = s.decide(35).actions
    assert isinstance(again, Start) and s.cluster.gpu_node[again.gpus[0]] != node


def test_an_explicit_backoff_and_give_up_override_the_rule() -> None:
    s = scheduler(1, 1)
    s.submit(spec("a", 1, max_retries=5), 0)
    s.decide(0)
    a = s.failed("a", 100, FailureReport("exit 1", retry_after_s=0.0))
    assert a.hold_until == 100 and a.verdict is not None and a.verdict.retry_after_s == 0
    assert s.decide(100).actions == [Start("a", (0,), resumed=True)]
    a = s.failed("a", 110, FailureReport("judged by the shell", give_up=True))
    assert a.status is JobStatus.FAILED and a.last_event == "failed: judged by the shell"


def test_a_scheduler_takes_its_own_rule() -> None:
    s = scheduler(1, 1, retry=RetryRule(RetryOptions(backoff_s=1.0, fast_fail_repeats=0)))
    s.submit(spec("a", 1, max_retries=5), 0)
    s.submit(spec("b", 1, max_retries=5), 0)
    s.decide(0)
    a = s.failed("a", 100, "exit 1")  # slow: held 1 s, not 5
    assert a.hold_until == 101
    (start,) = s.decide(100).actions  # b takes the GPU meanwhile
    assert isinstance(start, Start) and start.job_id == "b"
    b = s.failed("b", 110, "exit 2")  # fast: with no repeats tolerated, the first one ends it
    assert b.status is JobStatus.FAILED and b.attempts == 1
    assert b.last_event.startswith("failed: user error: the same failure 1 times in a row")


@pytest.mark.parametrize(("every", "kept", "lost"), [(None, 0.0, 250.0), (100.0, 200.0, 50.0)])
def test_a_failed_attempt_keeps_the_work_up_to_its_last_checkpoint(every, kept, lost):
    # 2 GPUs, 1,000 s of work; it fails 250 s into its first attempt. Checkpointing every 100 s
    # of work it keeps 200 s and wastes 2 GPUs x 50 s; without periodic checkpoints it keeps
    # nothing and wastes 2 x 250 GPU-seconds.
    s = scheduler(1, 2)
    s.submit(spec("j", 2, duration=1000.0, checkpoint_every_s=every, max_retries=1), 0)
    s.decide(0)
    job = s.failed("j", 250.0, "crash")
    assert job.work_done_s == pytest.approx(kept)
    assert job.lost_gpu_s == pytest.approx(2 * lost)
