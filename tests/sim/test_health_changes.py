"""A node found unhealthy, and the manager's other node changes (offline, online, joined, left),
replayed by the simulator (corral.core.nodes): the live scenario of
tests/server/test_health_live.py, worked out by hand on two nodes of one GPU, fifo and
consolidate, a 5 s retry backoff."""

from __future__ import annotations

from corral.core import JobSpec, Scheduler, Start
from corral.core.cluster import Cluster, NodeDef
from corral.core.nodes import NodeChange
from corral.core.placement import make_placement
from corral.core.policy import make_policy
from corral.core.tracefile import node_change_record, read_node_change
from corral.sim.engine import Simulation

NODES = [NodeDef("n0", 1, "gpu"), NodeDef("n1", 1, "gpu")]


def run(
    changes: list[NodeChange], jobs: list[JobSpec]
) -> tuple[list[tuple[float, object]], dict[str, object]]:
    scheduler = Scheduler(
        Cluster.from_nodes(NODES), make_policy("fifo"), make_placement("consolidate")
    )
    result = Simulation(jobs, scheduler, node_changes=changes, record_decisions=True).run()
    return result.decisions, {job.id: job for job in result.jobs}


def sick(at: float, node: str, reason: str = "XID 79") -> NodeChange:
    return NodeChange(at, node, False, reason, state="unhealthy")


def well(at: float, node: str) -> NodeChange:
    return NodeChange(at, node, False, "check passed", state="healthy")


JOBS = [
    JobSpec("a", 0.0, 1, duration_s=100.0, max_retries=0),
    JobSpec("b", 0.0, 1, duration_s=30.0),
    JobSpec("c", 40.0, 1, duration_s=20.0),
]


def test_an_unhealthy_node_requeues_its_job_as_an_infra_failure_and_takes_none_until_healthy() -> (
    None
):
    decisions, jobs = run([sick(10.0, "n0"), well(50.0, "n0")], JOBS)
    # 0: a on n0 (GPU 0), b on n1 (GPU 1). 10: n0 unhealthy: a's attempt fails as the
    # infrastructure's (no Preempt: a failure), requeued though max_retries is 0, held 5 s.
    # 30: b ends: a restarts on n1 (n0 held out; `resumed`: its second attempt, no work kept). 40: c arrives and waits (n0 unhealthy, n1
    # busy). 50: n0 healthy: c starts on n0, ends 70. a: 100 s from 30: ends 130.
    assert decisions == [
        (0.0, Start("a", (0,))),
        (0.0, Start("b", (1,))),
        (30.0, Start("a", (1,), resumed=True)),
        (50.0, Start("c", (0,))),
    ]
    a = jobs["a"]
    assert (a.failures, a.infra_failures, a.preemptions, a.finished_at) == (0, 1, 0, 130.0)
    assert jobs["c"].finished_at == 70.0


def test_without_the_health_changes_the_replay_decides_otherwise() -> None:
    decisions, jobs = run([], JOBS)
    # a runs to 100 on n0; c starts at 40 on n1 (b ended at 30).
    assert decisions == [
        (0.0, Start("a", (0,))),
        (0.0, Start("b", (1,))),
        (40.0, Start("c", (1,))),
    ]
    assert jobs["a"].infra_failures == 0


def test_a_node_offline_or_not_yet_joined_takes_no_job_until_it_is_back() -> None:
    jobs = [JobSpec("a", 0.0, 1, duration_s=10.0), JobSpec("b", 5.0, 1, duration_s=10.0)]
    # n1 joins at 20 (its first change): absent before. a on n0 at 0; b arrives at 5: n0
    # busy, n1 not there: waits; a ends at 10: b on n0. Then n0 goes offline at 12 (its
    # attempt runs on: live, its end comes from the job's own record) and n1 joins at 20.
    changes = [
        NodeChange(0.0, "n0", False, "in the cluster", state="joined"),
        NodeChange(20.0, "n1", False, "in the cluster", state="joined"),
    ]
    decisions, _ = run(changes, jobs)
    assert decisions == [(0.0, Start("a", (0,))), (10.0, Start("b", (0,)))]
    more = jobs + [JobSpec("c", 12.0, 1, duration_s=5.0), JobSpec("d", 13.0, 1, duration_s=5.0)]
    changes += [
        NodeChange(11.0, "n0", False, "not live", state="offline"),
        NodeChange(30.0, "n0", False, "live again", state="online"),
    ]
    decisions, _ = run(changes, more)
    # 10: b on n0. 11: n0 offline (b runs on to 20). 12, 13: c, d wait. 20: b ends, n1
    # joins: c on n1; d waits for n0 (offline) until 25, when c ends: d on n1.
    assert decisions == [
        (0.0, Start("a", (0,))),
        (10.0, Start("b", (0,))),
        (20.0, Start("c", (1,))),
        (25.0, Start("d", (1,))),
    ]


def test_every_node_change_goes_through_a_trace_record_and_back() -> None:
    for change in (
        sick(3.0, "n0", "ECC"),
        well(4.0, "n0"),
        NodeChange(5.0, "n1", False, "x", state="offline"),
        NodeChange(6.0, "n1", True, "fan", preempt=True),
        NodeChange(7.0, "n1", False),
    ):
        assert read_node_change(node_change_record(change)) == change
