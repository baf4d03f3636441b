"""Reasons formatted only when read: a failed placement keeps a template and its values, and the
words a reader gets are those the eager text had, with the values of the failed attempt."""

from __future__ import annotations

from corral.core import Cluster, Job
from corral.core.job import reason_text
from corral.core.placement import NotPlaced, make_placement
from tests.core.helpers import scheduler, spec


def test_a_reason_is_its_text_or_its_template_filled():
    assert reason_text("waiting") == "waiting"
    assert reason_text(("needs {} GPUs ({} free)", 4, 2)) == "needs 4 GPUs (2 free)"
    assert reason_text(("held for {:.0f} s more", 99.6)) == "held for 100 s more"


def test_a_job_formats_its_reason_once_when_read():
    job = Job(spec=spec("j", 1))
    assert job.pending_reason == "not yet considered"
    job.pending_why = ("needs {} GPUs{}", 4, " of type a100")
    assert job.pending_reason == "needs 4 GPUs of type a100"
    assert job.pending_why == "needs 4 GPUs of type a100"  # kept as text once read
    job.pending_reason = "started"
    assert job.pending_why == "started"


def test_relax_tells_when_a_job_relaxes_in_both_locality_reasons():
    relax = make_placement("relax", relax_after_s=100)
    cluster = Cluster.shorthand(4, 4, racks=2)  # racks {0, 1} and {2, 3}
    cluster.allocate([0, 1, 4, 5, 8, 9, 12, 13])  # 2 free on each node, 8 in all
    one_node = Job(spec=spec("n", 4), queued_since=30.0)
    result = relax.place(cluster, one_node, 50.0)
    assert isinstance(result, NotPlaced)
    assert result.reason == (
        "locality: needs 4 GPUs on one node; no node has them free (relaxes at t=130s)"
    )
    # Workers of 4 GPUs: no node offers one, no rack holds the gang.
    one_rack = Job(spec=spec("r", 8, gpus_per_worker=4), queued_since=0.4)
    result = relax.place(cluster, one_rack, 50.0)
    assert isinstance(result, NotPlaced)
    assert result.reason == (
        "locality: needs 8 GPUs (4 per worker, each worker on one node) within one rack;"
        " no rack has them free (relaxes at t=100s)"
    )
    # Too few GPUs free in all: not a locality reason, no time to relax.
    result = relax.place(cluster, Job(spec=spec("b", 9), queued_since=0.0), 50.0)
    assert isinstance(result, NotPlaced)
    assert result.reason == "waiting for 9 free GPUs (8 free)"
    # Relaxed, the locality reason of a job that still does not fit has no time in it.
    result = relax.place(cluster, Job(spec=spec("w", 8, gpus_per_worker=4)), 150.0)
    assert isinstance(result, NotPlaced)
    assert result.reason == (
        "locality: needs 8 GPUs (4 per worker, each worker on one node) within one rack;"
        " no rack has them free"
    )


def test_a_waiting_jobs_reason_keeps_the_free_gpus_of_its_round():
    s = scheduler(2, 4, "fifo", "consolidate")
    s.submit(spec("a", 3), 0)
    s.submit(spec("b", 3), 0)
    s.decide(0)  # a and b start, one on each node: 2 GPUs free
    s.submit(spec("c", 4), 1)
    s.decide(1)
    c = s.jobs["c"]
    assert not isinstance(c.pending_why, str)  # kept unformatted
    s.cluster.release(s.jobs["a"].placement)  # (5 free now, outside any round)
    assert c.pending_reason == "waiting for 4 free GPUs (2 free)"
    assert "waiting for 4 free GPUs (2 free)" in s.explain("c", 1)
