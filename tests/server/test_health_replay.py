"""A live manager's health verdicts (a node found unhealthy, then healthy), exported by `corral
export-trace` and replayed by `corral simulate`, give the same decisions at the same instants.

The live side is a `Manager` on a fake clock over two nodes of one a100 each (n0, n1), fifo and
consolidate, a 5 s retry backoff, with `PacedExecutor` (tests/server/inert.py, as in
tests/server/test_nodes_replay.py) whose jobs take no checkpoint: a lost attempt's steps are
lost. The verdicts go through `health_verdict`, the path the health checks take
(corral.server.health). Worked out by hand (seconds after the first arrival):

    0   j1 (800 steps: 100 s) starts on n0; j2 (240 steps: 30 s) on n1
    10  n0 found unhealthy: j1's attempt is lost (the infrastructure's failure, no retry used),
        requeued, held 5 s
    30  j2 ends: j1 restarts on n1 (n0 held out): 4 s restore, 100 s: ends at 134
    40  j3 (160 steps: 20 s) arrives and waits: n0 unhealthy, n1 busy
    50  n0 healthy again: j3 starts there, ends at 70
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

NODES = [NodeDef("n0", 1, "a100", "r0"), NodeDef("n1", 1, "a100", "r0")]
RATE = 8.0  # steps/s per GPU
RESTORE_S = 4.0
SCHEDULER = {"policy": "fifo", "placement": "consolidate", "restore_s": RESTORE_S}
#: (seconds after the first, name, steps)
JOBS = [(0.0, "j1", 800), (0.0, "j2", 240), (40.0, "j3", 160)]
#: (seconds after the first, node, healthy, reason)
VERDICTS = [(10.0, "n0", False, "XID 79 (GPU has fallen off the bus)"), (50.0, "n0", True, "")]
ORIGIN = 1000.0
RUN = "fifo-consolidate"


class NoCheckpoints(PacedExecutor):
    """A stopped attempt keeps none of its steps (its job takes no checkpoint)."""

    def stop(self, job_id: str, attempt: int) -> None:
        kept = self.done.get(job_id)
        super().stop(job_id, attempt)
        if kept is None:
            self.done.pop(job_id, None)
        else:
            self.done[job_id] = kept


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

        def rate(launch: AttemptLaunch) -> float:
            return RATE

        executor = NoCheckpoints(clock, steps, rate, RESTORE_S)
        settings = ManagerSettings(scheduler=config_from_mapping(SCHEDULER))
        manager = Manager(
            store, executor, Cluster.from_nodes(NODES), data_dir, settings=settings, clock=clock
        )
        ids: dict[str, str] = {}
        events: list[tuple[float, Callable[[], None]]] = []
        for at, name, total in JOBS:

            def arrive(name: str = name, total: float = total) -> None:
                spec = {"name": name, "command": "true", "gpus": 1, "model": "resnet"}
                spec["max_retries"] = 0  # a failure of its own would end it
                job_id = manager.submit(parse_job_spec(spec), "alice").id
                ids[name], steps[job_id] = job_id, total

            events.append((ORIGIN + at, arrive))
        for at, node, healthy, reason in VERDICTS:

            def verdict(node: str = node, healthy: bool = healthy, reason: str = reason) -> None:
                assert manager.health_verdict(node, healthy, reason)

            events.append((ORIGIN + at, verdict))
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


def test_the_live_health_verdicts_decide_as_worked_out(
    live: LiveRun, exported: tuple[Path, str]
) -> None:
    trace, _ = exported
    lines = trace.with_name("history.decisions.jsonl").read_text().splitlines()
    j1, j2, j3 = (live.ids[name] for name in ("j1", "j2", "j3"))
    got = [
        (r["at"], r["action"], r["job"], r["gpus"][0].split("/")[0], r.get("resumed"))
        for r in map(json.loads, lines)
    ]
    assert got == [
        (0.0, "start", j1, "n0", False),
        (0.0, "start", j2, "n1", False),
        (30.0, "start", j1, "n1", True),
        (50.0, "start", j3, "n0", False),
    ]
    ended = {row.name: row.finished_at - ORIGIN for row in live.store.finished_jobs()}
    assert ended == {"j1": 134.0, "j2": 30.0, "j3": 70.0}
    first = live.store.attempts(j1)[0]
    assert (first.outcome, first.reason) == (
        "lost",
        "node n0 unhealthy: XID 79 (GPU has fallen off the bus)",
    )
    done = next(row for row in live.store.finished_jobs() if row.name == "j1")
    assert (done.status, done.failures, done.attempts) == ("SUCCEEDED", 0, 2)
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [(r["at"], r["node"], r["state"]) for r in records if r["kind"] == "node_change"] == [
        (0.0, "n0", "joined"),
        (0.0, "n1", "joined"),
        (10.0, "n0", "unhealthy"),
        (50.0, "n0", "healthy"),
    ]


def test_the_replay_applies_the_health_verdicts_at_their_instants(
    exported: tuple[Path, str], tmp_path: Path
) -> None:
    trace, command = exported
    lines = trace.with_name("history.decisions.jsonl").read_text().splitlines()
    assert replay(command, tmp_path / "sim", run=RUN) == lines
    # Without the node changes the replay decides otherwise: j1's failure is replayed from its
    # job's record (after the 10 s its attempt ran), and with n0 not held out j1 restarts there
    # once its 5 s backoff is over, at 15.
    kept = [line for line in trace.read_text().splitlines() if '"kind": "node_change"' not in line]
    bare = trace.with_name("bare.corral.jsonl")
    bare.write_text("\n".join(kept) + "\n")
    otherwise = replay(command.replace(trace.name, bare.name), tmp_path / "bare", run=RUN)
    assert otherwise != lines
    third = json.loads(otherwise[2])
    assert (third["at"], third["gpus"][0].split("/")[0]) == (15.0, "n0"), otherwise


def test_every_recorded_node_change_is_exported_with_its_time(tmp_path: Path) -> None:
    from corral.server.export import node_changes

    store = Store(Store.sqlite_url(tmp_path))
    try:
        for at, node, state in [
            (990.0, "n0", "joined"),  # before the first job: at 0
            (1005.0, "n1", "joined"),
            (1010.0, "n1", "offline"),
            (1020.0, "n1", "online"),
            (1030.0, "n0", "draining"),
            (1040.0, "n9", "left"),  # a node the trace does not list: left out
            (1050.0, "n0", "resumed"),
        ]:
            store.add_node_change(at, node, state, f"{state} reason", "manager")
        got = [
            (c.at, c.node, c.kind, c.drain) for c in node_changes(store, ORIGIN, names={"n0", "n1"})
        ]
    finally:
        store.close()
    assert got == [
        (0.0, "n0", "joined", False),
        (5.0, "n1", "joined", False),
        (10.0, "n1", "offline", False),
        (20.0, "n1", "online", False),
        (30.0, "n0", "draining", True),
        (50.0, "n0", "resumed", False),
    ]


# -- a node that went away: held out as not live, and back ---------------------------------------

#: (seconds after the first, name, steps): j1 100 s, j2 30 s, j3 20 s
AWAY_JOBS = [(0.0, "j1", 800), (0.0, "j2", 240), (40.0, "j3", 160)]
AWAY_FROM, AWAY_TO = 35.0, 60.0  # n1 not live (a fixed cluster's node: held out, `offline`)


@pytest.fixture(scope="module")
def away(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveRun]:
    """A fixed cluster whose n1 is not live from 35 s to 60 s (as a Ray node that went away):
    0 j1 on n0, j2 on n1; 30 j2 ends; 35 n1 held out (offline); 40 j3 arrives and waits (n0
    busy, n1 out: without the change it would start on n1 here); 60 n1 back (online): j3
    starts there, ends at 80; j1 ends at 100."""
    data_dir = tmp_path_factory.mktemp("away")
    store = Store(Store.sqlite_url(data_dir))
    manager = None
    try:
        store.save_profile(ProfileRow("resnet", "a100", 1, 1, "", RATE, None, 60.0, 1, 0.0))
        clock = Clock(ORIGIN)
        steps: dict[str, float] = {}
        executor = NoCheckpoints(clock, steps, lambda launch: RATE, RESTORE_S)
        settings = ManagerSettings(scheduler=config_from_mapping(SCHEDULER))

        def live_nodes() -> list[NodeDef]:
            gone = ORIGIN + AWAY_FROM <= clock.now < ORIGIN + AWAY_TO
            return [node for node in NODES if not (gone and node.name == "n1")]

        manager = Manager(
            store,
            executor,
            Cluster.from_nodes(NODES),
            data_dir,
            settings=settings,
            clock=clock,
            nodes=live_nodes,
            fixed_cluster=True,
        )
        ids: dict[str, str] = {}
        events: list[tuple[float, Callable[[], None]]] = []
        for at, name, total in AWAY_JOBS:

            def arrive(name: str = name, total: float = total) -> None:
                spec = {"name": name, "command": "true", "gpus": 1, "model": "resnet"}
                job_id = manager.submit(parse_job_spec(spec), "alice").id
                ids[name], steps[job_id] = job_id, total

            events.append((ORIGIN + at, arrive))
        # n1 goes and comes back by the clock alone (`live_nodes`): a round at each instant
        events += [(ORIGIN + AWAY_FROM, lambda: None), (ORIGIN + AWAY_TO, lambda: None)]
        drive(manager, clock, executor, events)
        yield LiveRun(data_dir, store, ids)
    finally:
        if manager is not None:
            manager.stop()
        store.close()


def test_a_replay_of_a_run_where_a_node_went_away_makes_the_same_decisions(
    away: LiveRun, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    trace, printed = export_trace(away.data_dir, tmp_path_factory)
    command = printed.split("replay with: ", 1)[1]
    lines = trace.with_name("history.decisions.jsonl").read_text().splitlines()
    j1, j2, j3 = (away.ids[name] for name in ("j1", "j2", "j3"))
    got = [(r["at"], r["job"], r["gpus"][0]) for r in map(json.loads, lines)]
    assert got == [(0.0, j1, "n0/0"), (0.0, j2, "n1/0"), (60.0, j3, "n1/0")]
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [(r["at"], r["node"], r["state"]) for r in records if r["kind"] == "node_change"] == [
        (0.0, "n0", "joined"),
        (0.0, "n1", "joined"),
        (AWAY_FROM, "n1", "offline"),
        (AWAY_TO, "n1", "online"),
    ]
    assert replay(command, tmp_path / "sim", run=RUN) == lines
    # Without the node changes j3 starts on n1 as it arrives, at 40.
    kept = [line for line in trace.read_text().splitlines() if '"kind": "node_change"' not in line]
    bare = trace.with_name("bare.corral.jsonl")
    bare.write_text("\n".join(kept) + "\n")
    otherwise = replay(command.replace(trace.name, bare.name), tmp_path / "bare", run=RUN)
    assert json.loads(otherwise[2])["at"] == 40.0, otherwise


def test_an_unhealthy_node_stays_unhealthy_after_a_restart(tmp_path: Path) -> None:
    store = Store(Store.sqlite_url(tmp_path))
    clock = Clock(ORIGIN)
    first = second = None
    try:
        executor = NoCheckpoints(clock, {}, lambda launch: RATE, RESTORE_S)
        settings = ManagerSettings(scheduler=config_from_mapping(SCHEDULER))
        first = Manager(
            store, executor, Cluster.from_nodes(NODES), tmp_path, settings=settings, clock=clock
        )
        assert first.health_verdict("n0", False, "ECC: 3 uncorrectable")
        assert not first.health_verdict("n0", False, "another reason")  # no change: no row
        assert not first.health_verdict("n9", False, "x")  # no such node: ignored
        first.stop()
        first = None
        second = Manager(
            store, executor, Cluster.from_nodes(NODES), tmp_path, settings=settings, clock=clock
        )
        view = second.node_view("n0")
        assert (view["state"], view["reason"], view["gpus_free"]) == (
            "unhealthy",
            "ECC: 3 uncorrectable",
            0,
        )
        second.recover()
        job_id = second.submit(
            parse_job_spec({"name": "w", "command": "true", "gpus": 1}), "alice"
        ).id
        second.step()
        (attempt,) = store.attempts(job_id)
        assert attempt.gpus == ["n1/0"]  # n0 is still out (consolidate would pick n0 first)
    finally:
        for manager in (first, second):
            if manager is not None:
                manager.stop()
        store.close()
