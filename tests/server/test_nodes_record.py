"""What the manager sees of its nodes is recorded with its time in the store's node_changes table
(beside the operators' drains): nodes that join, leave, are held out as not live and come back.
A cluster whose nodes come and go (as on Ray), with an executor the test drives
(tests/server/test_node_changes.py) and a fake clock."""

from __future__ import annotations

from pathlib import Path

from corral.server.spec import parse_job_spec
from tests.server.helpers import python_job
from tests.server.inert import Clock
from tests.server.test_node_changes import Nodes, manager_on


def changes(manager: object) -> list[tuple[float, str, str, str]]:
    store = manager.store  # type: ignore[attr-defined]
    return [(row.at, row.node, row.state, row.actor) for row in store.node_changes()]


def test_joins_leaves_and_nodes_held_out_are_recorded_with_their_time(tmp_path: Path) -> None:
    nodes, clock = Nodes("n1", "n2"), Clock(100.0)
    manager, executor = manager_on(tmp_path, nodes, clock=clock)
    manager.submit(parse_job_spec(python_job("wide", "pass", gpus=8, workers=2)), "u")
    manager.step()
    assert changes(manager) == [
        (100.0, "n1", "joined", "manager"),
        (100.0, "n2", "joined", "manager"),
    ]
    clock.now = 110.0
    nodes.live = nodes.live[:1]  # n2 leaves while an attempt ran there: held out (offline)
    manager.step()
    assert changes(manager)[2:] == [(110.0, "n2", "offline", "manager")]
    views = {view["name"]: view["state"] for view in manager.node_views()}
    assert views == {"n1": "up", "n2": "down"}
    clock.now = 120.0
    executor.end("1", 1, "lost: rank 1's Ray actor died (its node died)")
    manager.step()  # the end is in: n2 is dropped
    assert changes(manager)[3:] == [(120.0, "n2", "left", "manager")]
    clock.now = 130.0
    nodes.live.append(nodes.live[0].__class__("n2", 4, "gpu"))  # it comes back
    manager.step()
    assert changes(manager)[4:] == [(130.0, "n2", "joined", "manager")]
    # An operator's drain is recorded beside them, and a restart records nothing new.
    manager.drain_node("n1", "fan", "root", preempt=False)
    manager.stop()
    again, _ = manager_on(tmp_path, nodes, clock=clock)
    try:
        again.step()
        assert changes(again)[5:] == [(130.0, "n1", "draining", "root")]
        assert {view["name"]: view["state"] for view in again.node_views()}["n1"] in (
            "draining",
            "drained",
        )
    finally:
        again.stop()
