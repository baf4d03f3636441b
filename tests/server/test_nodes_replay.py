"""A live manager's drains and resumes, exported by `corral export-trace` and replayed by `corral
simulate`, give the same decisions at the same instants.

The live side is a `Manager` on a fake clock over two nodes of two a100s (n0, n1), fifo and
consolidate, with `PacedExecutor` (tests/server/inert.py): each job makes 8 steps/s per GPU,
restores for `restore_s` on a resume (tests/server/test_replay.py explains why this makes
the live run and its replay comparable instant by instant). Worked out by hand (seconds after the
first arrival):

    0   j1 (2 GPUs, 800 steps: 50 s) starts on n0; j2 (2 GPUs, 1600 steps: 100 s) on n1
    10  n0 drained, no preemption: j1 runs on
    20  j3 (2 GPUs, 320 steps: 20 s) arrives and waits: n0 drained, n1 busy
    50  j1 ends on n0; j3 still waits (without the drain it would start on n0 here)
    60  n1 drained with preemption: j2 is preempted (960 of its steps done)
    70  n0 resumed: j2 (first in fifo) resumes there: 4 s restore, 640 steps, ends at 114
    80  n1 resumed: j3 starts there, ends at 100
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from corral.core.cluster import Cluster, NodeDef
from corral.core.framework import config_from_mapping
from corral.exec.local import AttemptLaunch
from corral.server.manager import Manager, ManagerSettings
from corral.server.spec import parse_job_spec
from corral.server.store import ProfileRow, Store
from tests.server.inert import Clock, PacedExecutor
from tests.server.test_replay import drive, export_trace, replay

NODES = [NodeDef("n0", 2, "a100", "r0"), NodeDef("n1", 2, "a100", "r0")]
RATE = 8.0  # steps/s per GPU
RESTORE_S = 4.0
SCHEDULER = {"policy": "fifo", "placement": "consolidate", "restore_s": RESTORE_S}
#: (seconds after the first, name, GPUs, steps)
JOBS = [(0.0, "j1", 2, 800), (0.0, "j2", 2, 1600), (20.0, "j3", 2, 320)]
#: (seconds after the first, node, drain (else resume), preempt)
CHANGES = [(10.0, "n0", True, False), (60.0, "n1", True, True), (70.0, "n0", False, False)]
CHANGES += [(80.0, "n1", False, False)]
ORIGIN = 1000.0
RUN = "fifo-consolidate"  # the replay's policy and placement (SCHEDULER's)


@dataclass
class LiveRun:
    data_dir: Path
    store: Store
    ids: dict[str, str]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveRun]:
    data_dir = tmp_path_factory.mktemp("live")
    store = Store(Store.sqlite_url(data_dir))
    manager = None
    try:
        store.save_profile(ProfileRow("resnet", "a100", 1, 1, "", RATE, None, 60.0, 1, 0.0))
        clock = Clock(ORIGIN)
        steps: dict[str, float] = {}
        gpus: dict[str, int] = {}

        def rate(launch: AttemptLaunch) -> float:
            return RATE * gpus[launch.job_id]

        executor = PacedExecutor(clock, steps, rate, RESTORE_S)
        settings = ManagerSettings(scheduler=config_from_mapping(SCHEDULER))
        manager = Manager(
            store, executor, Cluster.from_nodes(NODES), data_dir, settings=settings, clock=clock
        )
        ids: dict[str, str] = {}
        events: list[tuple[float, Callable[[], None]]] = []
        for at, name, count, total in JOBS:

            def arrive(name: str = name, count: int = count, total: float = total) -> None:
                spec = {"name": name, "command": "true", "gpus": count, "model": "resnet"}
                job_id = manager.submit(parse_job_spec(spec), "alice").id
                ids[name], steps[job_id], gpus[job_id] = job_id, total, count

            events.append((ORIGIN + at, arrive))
        for at, node, drain, preempt in CHANGES:

            def change(node: str = node, drain: bool = drain, preempt: bool = preempt) -> None:
                if drain:
                    manager.drain_node(node, "maintenance", "admin", preempt=preempt)
                else:
                    manager.resume_node(node, "admin")

            events.append((ORIGIN + at, change))
        drive(manager, clock, executor, events)
        yield LiveRun(data_dir, store, ids)
    finally:
        if manager is not None:
            manager.stop()
        store.close()


@pytest.fixture(scope="module")
def exported(live: LiveRun, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out, printed = export_trace(live.data_dir, tmp_path_factory)
    return out, printed.split("replay with: ", 1)[1]


def test_the_live_drains_decide_as_worked_out(live: LiveRun, exported: tuple[Path, str]) -> None:
    trace, _ = exported
    lines = trace.with_name("history.decisions.jsonl").read_text().splitlines()
    j1, j2, j3 = (live.ids[name] for name in ("j1", "j2", "j3"))
    got = [
        (r["at"], r["action"], r["job"], r["gpus"][0].split("/")[0], r.get("by"))
        for r in map(json.loads, lines)
    ]
    assert got == [
        (0.0, "start", j1, "n0", None),
        (0.0, "start", j2, "n1", None),
        (60.0, "preempt", j2, "n1", "drain of node n1"),
        (70.0, "start", j2, "n0", None),
        (80.0, "start", j3, "n1", None),
    ]
    ended = {row.name: row.finished_at - ORIGIN for row in live.store.finished_jobs()}
    assert ended == {"j1": 50.0, "j2": 114.0, "j3": 100.0}
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [
        (r["at"], r["node"], r["state"], r["preempt"])
        for r in records
        if r["kind"] == "node_change"
    ] == [
        (0.0, "n0", "joined", False),  # the manager's first look, before the first job: at 0
        (0.0, "n1", "joined", False),
        (10.0, "n0", "draining", False),
        (60.0, "n1", "draining", True),
        (70.0, "n0", "resumed", False),
        (80.0, "n1", "resumed", False),
    ]


def test_the_replay_applies_the_drains_at_their_instants(
    exported: tuple[Path, str], tmp_path: Path
) -> None:
    trace, command = exported
    lines = trace.with_name("history.decisions.jsonl").read_text().splitlines()
    assert replay(command, tmp_path / "sim", run=RUN) == lines
    # Without the node changes the replay decides otherwise (j3 at 50 on n0, no preemption).
    kept = [line for line in trace.read_text().splitlines() if '"kind": "node_change"' not in line]
    bare = trace.with_name("bare.corral.jsonl")
    bare.write_text("\n".join(kept) + "\n")
    assert replay(command.replace(trace.name, bare.name), tmp_path / "bare", run=RUN) != lines
