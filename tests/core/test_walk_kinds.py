"""The walk tells waiting jobs apart by their kind (GPU types, the placement's mode, GPUs per
worker): a job of a kind that a smaller job of it did not fit is passed over. Under a pure
placement the scheduler keeps each waiting job's kind as it indexes the job, so a mode that
changes with time (relax) must be taken up at the timer that announces it."""

from __future__ import annotations

from tests.core.helpers import scheduler, spec, started


def _two_nodes_with_two_free_each():  # type: ignore[no-untyped-def]
    """FIFO with greedy backfill, relax after 100 s; x and y share node 0 (best fit), z takes
    half of node 1; y ends at 1, leaving 2 free GPUs on each node. Node 1 came to 2 free GPUs
    first (at z's start, node 0 at y's end), so it comes first among nodes of 2 free GPUs."""
    s = scheduler(2, 4, "fifo", "relax", placement_options={"relax_after_s": 100}, backfill=True)
    s.submit(spec("x", 2), 0)
    s.submit(spec("y", 2), 0)
    s.submit(spec("z", 2), 0)
    assert set(started(s.decide(0).actions)) == {"x", "y", "z"}
    s.finished("y", 1)
    assert [s.cluster.node_free(n) for n in (0, 1)] == [2, 2]
    return s


def test_a_job_that_relaxed_is_placed_behind_one_of_its_size_that_did_not():
    """r (4 GPUs) waits from 1: consolidated it needs one node, and neither has 4 free. q (4
    GPUs, level 1: ahead of r) comes at 60. At 101 r's wait passes relax_after_s and its mode
    is "relaxed", while q's (queued at 60) is still "consolidate": q does not fit, and r, of
    another kind now, is still placed, on the 2 + 2 free GPUs (node 1's first). Had r kept the kind it was
    queued with, q's failure would have passed it over."""
    s = _two_nodes_with_two_free_each()
    s.submit(spec("r", 4, submit=1), 1)
    assert s.decide(1).actions == []
    s.submit(spec("q", 4, submit=60, level=1), 60)
    decision = s.decide(60)
    assert decision.actions == []
    assert decision.wake_at == 101  # r relaxes: queued at 1 + 100
    assert s.jobs["r"].pending_reason == (
        "no room: a job of the same kind needing fewer GPUs did not fit"
    )
    decision = s.decide(101)
    assert started(decision.actions) == {"r": (6, 7, 2, 3)}
    assert s.jobs["q"].pending_reason.startswith("locality: needs 4 GPUs on one node")


def test_jobs_passed_over_once_none_may_preempt_still_say_why():
    """No job may preempt under FIFO: behind q (4 GPUs, not fitting one node), s4 (4 GPUs, the
    same kind) is passed over, and the 2-GPU job behind them still starts, on node 1."""
    s = _two_nodes_with_two_free_each()
    s.submit(spec("q", 4, submit=5), 5)
    s.submit(spec("s4", 4, submit=6), 6)
    s.submit(spec("two", 2, submit=7), 7)
    decision = s.decide(7)
    assert started(decision.actions) == {"two": (6, 7)}
    assert s.jobs["s4"].pending_reason == (
        "no room: a job of the same kind needing fewer GPUs did not fit"
    )
    assert s.jobs["q"].pending_reason.startswith("locality: needs 4 GPUs on one node")
