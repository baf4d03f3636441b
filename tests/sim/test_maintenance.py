"""Maintenance windows of a cluster config (`maintenance:`) in the simulator: each node drained
over its window (corral.core.nodes), worked out by hand on two nodes of two GPUs, fifo and
consolidate, a 4 s restore: the live scenario of tests/server/test_nodes_replay.py."""

from __future__ import annotations

import pytest

from corral.core import JobSpec, Preempt, Scheduler, Start
from corral.core.config import ConfigError, parse_cluster_config
from corral.core.placement import make_placement
from corral.core.policy import make_policy
from corral.sim.engine import Simulation

CONFIG = {
    "cell_types": {"NODE": {"child": "a100", "count": 2, "node": True}},
    "physical_cells": [{"type": "NODE", "names": ["n0", "n1"]}],
}


def run(maintenance: list[dict]) -> tuple[list[tuple[float, object]], dict[str, float]]:
    config = parse_cluster_config(CONFIG | {"maintenance": maintenance})
    scheduler = Scheduler(
        config.cluster, make_policy("fifo"), make_placement("consolidate"), restore_s=4.0
    )
    jobs = [
        JobSpec("j1", 0.0, 2, duration_s=50.0),
        JobSpec("j2", 0.0, 2, duration_s=100.0),
        JobSpec("j3", 20.0, 2, duration_s=20.0),
    ]
    sim = Simulation(jobs, scheduler, node_changes=config.maintenance, record_decisions=True)
    result = sim.run()
    return result.decisions, {job.id: job.finished_at for job in result.jobs}


def test_maintenance_windows_drain_and_resume_nodes_as_worked_out() -> None:
    decisions, ended = run(
        [
            {"node": "n0", "start": 10, "end": 70, "reason": "firmware"},
            {"node": "n1", "start": 60, "end": 80, "preempt": True},
        ]
    )
    # 0: j1 on n0 (GPUs 0, 1), j2 on n1 (2, 3). 10: n0 drained, j1 runs on. 20: j3 waits.
    # 50: j1 ends; n0 is drained, so j3 waits on (no drain: it starts on n0 here). 60: n1
    # drained with preemption: j2 preempted after 60 of its 100 s. 70: n0 back: j2 resumes
    # there (fifo: first), 4 s restore + 40 s: ends 114. 80: n1 back: j3 starts, ends 100.
    assert decisions == [
        (0.0, Start("j1", (0, 1))),
        (0.0, Start("j2", (2, 3))),
        (60.0, Preempt("j2", (2, 3), "drain of node n1")),
        (70.0, Start("j2", (0, 1), resumed=True)),
        (80.0, Start("j3", (2, 3))),
    ]
    assert ended == {"j1": 50.0, "j2": 114.0, "j3": 100.0}


def test_without_windows_the_run_goes_otherwise() -> None:
    decisions, ended = run([])
    assert (50.0, Start("j3", (0, 1))) in decisions  # j3 takes j1's GPUs at once
    assert ended == {"j1": 50.0, "j2": 100.0, "j3": 70.0}


@pytest.mark.parametrize(
    ("window", "message"),
    [
        ({"node": "n9", "start": 0}, "maintenance.0.node: no node 'n9'"),
        ({"node": "n0", "start": 10, "end": 5}, "maintenance.0.end: must be after start (10)"),
        ({"node": "n0", "start": -1}, "maintenance.0.start: must be a number of seconds >= 0"),
        ({"node": "n0", "start": 0, "preempt": "yes"}, "maintenance.0.preempt: must be true"),
        ({"node": "n0", "start": 0, "when": 1}, "maintenance.0.when: unknown key"),
    ],
)
def test_a_bad_window_is_refused_naming_its_field(window: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_cluster_config(CONFIG | {"maintenance": [window]})
