"""A streamed run: jobs read from an iterator as they arrive, results handed out as jobs end
and then dropped, and a timeline kept as sums; worked out by hand on a 2-GPU node."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from corral.core import Cluster, JobSpec, Scheduler
from corral.core.placement import make_placement
from corral.core.policy import make_policy
from corral.sim.engine import Simulation
from corral.sim.metrics import fragmentation, utilization, utilization_while_waiting
from corral.sim.result import TimelineTotals


def spec(job_id: str, gpus: int, submit: float, duration: float) -> JobSpec:
    return JobSpec(id=job_id, submit_time=submit, gpus=gpus, duration_s=duration)


def trace() -> Iterator[JobSpec]:
    # a holds both GPUs over 0..100; b (1 GPU) arrives at 50, waits, and runs 100..160.
    yield spec("a", 2, 0, 100)
    yield spec("b", 1, 50, 60)


def scheduler() -> Scheduler:
    return Scheduler(Cluster.shorthand(1, 2), make_policy("fifo"), make_placement("consolidate"))


def test_a_streamed_run_hands_out_each_job_as_it_ends_and_keeps_none():
    ended: list[tuple[str, float | None, float]] = []
    core = scheduler()
    result = Simulation(
        trace(),
        core,
        keep_ended=False,
        on_end=lambda job: ended.append((job.id, job.finished_at, job.pending_s)),
    ).run()
    assert ended == [("a", 100.0, 0.0), ("b", 160.0, 50.0)]
    assert result.jobs == [] and core.jobs == {}


def test_timeline_totals_give_the_metrics_of_the_whole_timeline():
    totals = TimelineTotals(total_gpus=2)
    streamed = Simulation(trace(), scheduler(), timeline=totals).run()
    whole = Simulation(list(trace()), scheduler()).run()
    assert totals.time_s == [0.0, 160.0]  # the first and the last instant only
    # 2 GPUs over 0..100 and 1 over 100..160: 260 GPU-s of 2 x 160.
    assert utilization(streamed.timeline, 2) == pytest.approx(260 / 320)
    assert utilization(whole.timeline, 2) == pytest.approx(260 / 320)
    # b waits over 50..100, when both GPUs are in use.
    assert utilization_while_waiting(streamed.timeline, 2) == pytest.approx(1.0)
    assert utilization_while_waiting(whole.timeline, 2) == pytest.approx(1.0)
    # The only free GPU (100..160) sits on a node that is not wholly free: all stranded.
    assert fragmentation(streamed.timeline, 2) == pytest.approx(1.0)
    assert fragmentation(whole.timeline, 2) == pytest.approx(1.0)


def test_a_stream_out_of_submission_order_is_refused():
    late_first = iter([spec("a", 1, 10, 5), spec("b", 1, 5, 5)])
    with pytest.raises(ValueError, match="job b: a streamed trace must be in submission order"):
        Simulation(late_first, scheduler()).run()
