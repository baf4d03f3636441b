"""A cluster whose nodes come and go (as on Ray), with an executor the test drives: attempts run
until the test ends them. Checks when the manager drops a node that left, that nothing new lands
on it meanwhile, and that a job waits for nodes to join rather than fail."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from corral.core.cluster import Cluster, NodeDef
from corral.exec.local import AttemptLaunch
from corral.server.manager import Manager, SubmitError
from corral.server.spec import parse_job_spec
from corral.server.store import JobRow, Store
from tests.server.helpers import manager_settings, python_job
from tests.server.inert import HeldExecutor


class Nodes:
    def __init__(self, *names: str) -> None:
        self.live = [NodeDef(name, 4, "gpu") for name in names]

    def __call__(self) -> list[NodeDef]:
        return list(self.live)


def manager_on(
    tmp_path: Path, nodes: Nodes, clock: Callable[[], float] = time.time, **settings: Any
) -> tuple[Manager, HeldExecutor]:
    executor = HeldExecutor()
    options = dict(node_check_s=0.0, retry_backoff_s=0.0, relax_after_s=0.0) | settings
    manager = Manager(
        Store(Store.sqlite_url(tmp_path)),
        executor,
        Cluster.from_nodes(nodes()),
        tmp_path,
        settings=manager_settings(**options),
        clock=clock,
        nodes=nodes,
    )
    return manager, executor


def where(launch: AttemptLaunch) -> list[str]:
    return [worker.node for worker in launch.workers]


def test_a_node_that_left_is_dropped_once_its_attempts_ended_and_a_new_one_is_used(
    tmp_path: Path,
) -> None:
    nodes = Nodes("n1", "n2")
    manager, executor = manager_on(tmp_path, nodes)
    manager.submit(parse_job_spec(python_job("wide", "pass", gpus=8, workers=2)), "u")
    manager.step()
    (launch,) = executor.running.values()
    assert where(launch) == ["n1", "n2"]
    nodes.live = nodes.live[:1]  # n2 leaves; its attempt has not ended yet
    manager.step()
    assert [node.name for node in manager.cluster.nodes] == ["n1", "n2"]  # kept meanwhile
    manager.submit(parse_job_spec(python_job("small", "pass", gpus=4)), "u")
    manager.step()
    assert len(executor.running) == 1  # n1 is busy, n2 is held out: nothing starts on n2
    executor.end("1", 1, "lost: rank 1's Ray actor died (its node died)")
    manager.step()
    # The end is in: n2 is dropped; the 8-GPU job waits (it fits no longer), the 4-GPU one
    # starts on n1, freed by the lost attempt.
    assert [node.name for node in manager.cluster.nodes] == ["n1"]
    assert [where(a) for a in executor.running.values()] == [["n1"]]
    wide = manager.store.get_job("1")
    assert wide is not None and wide.status == "PENDING" and wide.failures == 0
    (first,) = manager.store.attempts("1")
    assert (first.outcome, first.gpus) == ("lost", [f"n{n}/{d}" for n in (1, 2) for d in range(4)])
    executor.end("2", 1, "exit code 0", code=0)
    nodes.live.append(NodeDef("n3", 4, "gpu"))  # a node joins
    manager.step()
    manager.step()
    (retry,) = executor.running.values()
    assert (retry.job_id, retry.attempt, where(retry)) == ("1", 2, ["n1", "n3"])
    assert [node.name for node in manager.cluster.nodes] == ["n1", "n3"]


def test_when_every_node_left_nothing_starts_until_one_joins(tmp_path: Path) -> None:
    nodes = Nodes("n1")
    manager, executor = manager_on(tmp_path, nodes)
    nodes.live = []
    manager.step()
    manager.submit(parse_job_spec(python_job("j", "pass", gpus=2)), "u")
    manager.step()
    assert executor.running == {}
    row = manager.store.get_job("1")
    assert row is not None and row.status == "PENDING"
    nodes.live = [NodeDef("n1", 4, "gpu")]  # the same node comes back
    manager.step()
    (launch,) = executor.running.values()
    assert where(launch) == ["n1"]


def test_a_running_attempt_survives_another_node_joining(tmp_path: Path) -> None:
    nodes = Nodes("n1")
    manager, executor = manager_on(tmp_path, nodes)
    manager.submit(parse_job_spec(python_job("j", "pass", gpus=4)), "u")
    manager.step()
    nodes.live.append(NodeDef("n0", 4, "gpu"))  # sorts first: GPU ids are renumbered
    manager.step()
    assert [node.name for node in manager.cluster.nodes] == ["n1", "n0"]
    assert manager.placement_of("1") == ["n1/0", "n1/1", "n1/2", "n1/3"]
    assert manager.gpu_owners() == {manager.gpu_ids([f"n1/{d}"])[0]: "1" for d in range(4)}
    events = [event.message for event in manager.store.events("1")]
    assert not any("found running" in message for message in events)  # no noise for users
    manager.submit(parse_job_spec(python_job("k", "pass", gpus=4)), "u")
    manager.step()
    assert [where(a) for a in executor.running.values()] == [["n1"], ["n0"]]


def test_a_start_on_a_node_that_left_waits_for_it_to_be_dropped(tmp_path: Path) -> None:
    nodes = Nodes("n1", "n2")
    nodes.live[0] = NodeDef("n1", 4, "v100")
    nodes.live[1] = NodeDef("n2", 4, "a100")
    now = [0.0]
    manager, executor = manager_on(
        tmp_path, nodes, clock=lambda: now[0], las_thresholds_gpu_s=[10.0]
    )
    for name, gpu_type in [("b", "v100"), ("a", "a100"), ("e", "a100")]:
        gpus = 4 if name == "b" else 2
        manager.submit(parse_job_spec(python_job(name, "pass", gpus=gpus, gpu_type=gpu_type)), "u")
    manager.step()
    assert sorted(where(launch)[0] for launch in executor.running.values()) == ["n1", "n2", "n2"]
    nodes.live = nodes.live[:1]  # n2 leaves; a and e still run there
    now[0] = 100.0
    manager.step()
    # c has attained nothing, a and e 200 GPU-seconds: LAS preempts one of them for c, whose
    # place is on n2, the only A100s.
    manager.submit(parse_job_spec(python_job("c", "pass", gpus=2, gpu_type="a100")), "u")
    manager.step()
    (victim,) = executor.stopped
    assert victim in [("2", 1), ("3", 1)]
    executor.end(*victim, "lost: rank 0's Ray actor died (its node died)")
    manager.step()
    # The victim's GPUs are free, but on a node that left (the other job holds it yet): c does
    # not start there.
    (other,) = {("2", 1), ("3", 1)} - {victim}
    assert sorted(executor.running) == [("1", 1), other]
    assert manager.store.attempts("4") == []
    executor.end(*other, "lost: rank 0's Ray actor died (its node died)")
    manager.step()
    # n2 is dropped; c waits for A100s, and starts on those of a node that joins.
    assert [node.name for node in manager.cluster.nodes] == ["n1"]
    row = manager.store.get_job("4")
    assert row is not None and row.status == "PENDING" and manager.store.attempts("4") == []
    nodes.live.append(NodeDef("n3", 4, "a100"))
    manager.step()
    manager.step()
    started = {launch.job_id: where(launch) for launch in executor.running.values()}
    assert started["4"] == ["n3"]


def test_a_submission_that_races_a_rebuild_is_queued_once(tmp_path: Path) -> None:
    """A rebuild (a node joins) asked while a submission is being stored waits until the job is
    stored and queued (one transaction, under the manager's lock), then queues it from the store:
    the job is in the core once."""
    nodes = Nodes("n1")
    manager, executor = manager_on(tmp_path, nodes)
    insert = manager.store.insert_jobs
    rebuilt = threading.Event()

    def rebuild() -> None:
        nodes.live.append(NodeDef("n2", 4, "gpu"))
        manager.rebuild(Cluster.from_nodes(nodes()))
        rebuilt.set()

    racing = threading.Thread(target=rebuild)

    def insert_while_a_node_joins(rows: list[JobRow]) -> None:
        insert(rows)  # stored, not yet queued (nor committed): a node joins now
        racing.start()
        assert not rebuilt.wait(0.5)  # it waits for the lock (a bounded look, not a sleep)

    manager.store.insert_jobs = insert_while_a_node_joins  # type: ignore[method-assign]
    row = manager.submit(parse_job_spec(python_job("j", "pass", gpus=2)), "u")
    racing.join(timeout=60)
    assert rebuilt.is_set()
    assert {node.name for node in manager.cluster.nodes} == {"n1", "n2"}
    stored = manager.store.get_job(row.id)
    assert stored is not None and stored.status == "PENDING"
    assert list(manager.scheduler.jobs) == [row.id]
    manager.step()
    (launch,) = executor.running.values()
    assert launch.job_id == row.id


def test_a_waiting_job_keeps_its_wait_over_a_rebuild(tmp_path: Path) -> None:
    # Placement consolidates a job on one node, and takes GPUs on several after 60 s of waiting.
    nodes = Nodes("n1", "n2")
    now = [0.0]
    manager, executor = manager_on(tmp_path, nodes, clock=lambda: now[0], relax_after_s=60.0)
    for name in ("x", "y"):  # 3 GPUs of each node
        manager.submit(parse_job_spec(python_job(name, "pass", gpus=3)), "u")
    manager.step()
    manager.submit(parse_job_spec(python_job("w", "pass", gpus=2, workers=2)), "u")
    manager.step()
    assert sorted(executor.running) == [("1", 1), ("2", 1)]  # w waits to consolidate
    now[0] = 50.0
    nodes.live.append(NodeDef("n3", 1, "gpu"))  # a node joins: the core is rebuilt
    manager.step()
    assert [node.name for node in manager.cluster.nodes] == ["n1", "n2", "n3"]
    assert ("3", 1) not in executor.running
    now[0] = 61.0  # 61 s since w was submitted, 11 s since the rebuild
    manager.step()
    assert ("3", 1) in executor.running
    assert len(set(where(executor.running[("3", 1)]))) == 2


def test_a_fixed_cluster_holds_its_missing_nodes_out_and_never_rebuilds(tmp_path: Path) -> None:
    # HiveD's cells on Ray: the cluster is the config's (n1, n2); only n1 is live at first.
    nodes = Nodes("n1")
    executor = HeldExecutor()
    manager = Manager(
        Store(Store.sqlite_url(tmp_path)),
        executor,
        Cluster.from_nodes([NodeDef("n1", 4, "gpu"), NodeDef("n2", 4, "gpu")]),
        tmp_path,
        settings=manager_settings(node_check_s=0.0, relax_after_s=0.0),
        nodes=nodes,
        fixed_cluster=True,
    )
    for name in ("first", "second"):
        manager.submit(parse_job_spec(python_job(name, "pass", gpus=4)), "u")
    manager.step()
    # n2 is held out: one 4-GPU job starts, on n1; the other waits (never fails: n2 is known).
    assert [where(a) for a in executor.running.values()] == [["n1"]]
    nodes.live.append(NodeDef("n2", 4, "gpu"))  # n2 joins as declared
    manager.step()
    manager.step()
    assert sorted(where(a)[0] for a in executor.running.values()) == ["n1", "n2"]
    nodes.live = [NodeDef("n1", 4, "gpu"), NodeDef("n3", 4, "gpu")]  # n2 goes, n3 is unknown
    manager.step()
    assert [node.name for node in manager.cluster.nodes] == ["n1", "n2"]  # not rebuilt
    executor.end("2", 1, "lost: rank 0's Ray actor died (its node died)")
    manager.step()
    manager.step()
    # The lost job waits for n2 (n1 is busy, n3 is no node of the config's).
    assert [where(a) for a in executor.running.values()] == [["n1"]]
    second = manager.store.get_job("2")
    assert second is not None and second.status == "PENDING"


def test_the_room_for_workers_is_the_live_nodes_as_they_join_and_leave(tmp_path: Path) -> None:
    """A submission's check that its workers fit on nodes is worked out once per cluster: after
    a node joins or leaves, the answer is the new nodes', not the one remembered for the old."""
    nodes = Nodes()
    nodes.live = [NodeDef("n1", 6, "gpu"), NodeDef("n2", 2, "gpu")]  # 8 GPUs, one worker of 4
    manager, executor = manager_on(tmp_path, nodes)
    wide = parse_job_spec(python_job("wide", "pass", gpus=8, workers=2))
    refused = "asks for 8 GPUs, 4 per worker on one node, but the nodes can give only 4 GPUs"
    for _ in range(2):  # the second answer is the remembered one: the same
        with pytest.raises(SubmitError, match=refused):
            manager.submit(wide, "u")
    nodes.live.append(NodeDef("n3", 4, "gpu"))  # n1 and n3 hold a worker of 4 each
    manager.step()
    assert [node.name for node in manager.cluster.nodes] == ["n1", "n2", "n3"]
    row = manager.submit(wide, "u")
    manager.step()
    (launch,) = executor.running.values()
    assert (launch.job_id, sorted(where(launch))) == (row.id, ["n1", "n3"])
    executor.end(row.id, 1, "exit code 0", code=0)
    nodes.live.pop()  # n3 leaves: one worker of 4 again
    manager.step()
    assert [node.name for node in manager.cluster.nodes] == ["n1", "n2"]
    with pytest.raises(SubmitError, match=refused):
        manager.submit(wide, "u")
