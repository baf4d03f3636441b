"""Hierarchical queues in `corral up`: real job processes (local executor), a real SQLite file,
HTTP on loopback. A two-level queue (department d: teams a and b; department e: team c) on one
machine of 6 declared GPUs lends a team's idle GPU inside its department before across, and
takes GPUs back from outside the department first: the decisions of the same scenario in the
simulator (tests/sim/test_queues_sim.py, worked out by hand there)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from corral.cli.main import app
from corral.server.boot import RunningServer
from tests.server.helpers import (
    admin_token,
    api,
    job,
    kill_jobs_of,
    start_server,
    submit,
    wait_for,
)
from tests.sim.test_queues_sim import EXPECTED, TREE_YAML


def sleeper(name: str, vc: str) -> dict[str, Any]:
    return {"name": name, "vc": vc, "gpus": 1, "command": "exec sleep 3600", "grace_seconds": 1}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RunningServer]:
    data_dir = tmp_path / "corral"
    running = start_server(data_dir, gpus=6, config=TREE_YAML, policy="fifo", admission="quota")
    try:
        yield running
    finally:
        running.stop()
        kill_jobs_of(data_dir)


def statuses(client: httpx.Client, ids: dict[str, str]) -> dict[str, tuple[str, int]]:
    """Each job's status and preemptions so far, by name."""
    out = {}
    for name, job_id in ids.items():
        found = job(client, job_id)
        out[name] = (found["status"], found["preemptions"])
    return out


def vc_ls(server: RunningServer) -> list[dict[str, Any]]:
    env = {"CORRAL_URL": server.url, "CORRAL_TOKEN": admin_token(server.manager.data_dir)}
    result = CliRunner().invoke(app, ["vc", "ls", "-o", "json"], env=env)
    assert result.exit_code == 0, result.output
    return list(json.loads(result.stdout))


def tree_row(rows: list[dict[str, Any]], name: str) -> tuple[int, int, int]:
    """A level's (quota, GPUs used, GPUs borrowed) as `corral vc ls` shows them."""
    row = next(r for r in rows if r["name"] == name)
    return row["guaranteed_gpus"], row["allocated_gpus"], row["borrowed_gpus"]


def test_a_two_level_queue_lends_within_first_and_reclaims_from_outside_first(
    server: RunningServer,
) -> None:
    client = api(server.url, admin_token(server.manager.data_dir))
    ids: dict[str, str] = {}
    preempted: list[str] = []

    def arrive(*names: str) -> None:
        for name in names:
            ids[name] = submit(client, **sleeper(name, name[0]))
        for name in names:
            wait_for(client, ids[name], ["RUNNING"], timeout=120)

    def gave_way(name: str) -> None:
        found = wait_for(client, ids[name], ["PENDING"], timeout=120)
        assert found["preemptions"] == 1
        preempted.append(name)

    # c asks for 4: e's quota 2 and the idle rest are lent to it (nobody in d asks). 2 idle.
    arrive("c0", "c1", "c2", "c3")
    # b asks for 3: b0 and b1 take the idle GPUs; b2 is lent a's idle quota inside d before c
    # keeps it (though e weighs 3 to d's 1): c3 (c's lowest in fifo order) gives way.
    arrive("b0", "b1", "b2")
    gave_way("c3")
    rows = vc_ls(server)
    assert [(r["name"], r["depth"], r["kind"]) for r in rows] == [
        ("d", 0, "department"),
        ("a", 1, "vc"),
        ("b", 1, "vc"),
        ("e", 0, "department"),
        ("c", 1, "vc"),
    ]
    # (quota, used, borrowed): b borrows a's idle quota inside d, c one GPU no quota holds.
    assert [tree_row(rows, n) for n in ("d", "a", "b", "e", "c")] == [
        (3, 3, 0),
        (2, 0, 0),
        (1, 3, 2),
        (2, 3, 1),
        (2, 3, 1),
    ]
    # a asks for 1, within its quota: b (3 of a share of 2.25) and c (3 of 2.75) are both over
    # their shares; the borrower from outside d gives way (c2), not b.
    arrive("a0")
    gave_way("c2")
    assert statuses(client, {n: ids[n] for n in ("b0", "b1", "b2", "c0", "c1")}) == {
        "b0": ("RUNNING", 0),
        "b1": ("RUNNING", 0),
        "b2": ("RUNNING", 0),
        "c0": ("RUNNING", 0),
        "c1": ("RUNNING", 0),
    }
    # a asks for 1 more: now only b is over its share (3 of 1.25): b2 gives way.
    arrive("a1")
    gave_way("b2")
    final = statuses(client, ids)
    assert final == {
        "c0": ("RUNNING", 0),
        "c1": ("RUNNING", 0),
        "c2": ("PENDING", 1),
        "c3": ("PENDING", 1),
        "b0": ("RUNNING", 0),
        "b1": ("RUNNING", 0),
        "b2": ("PENDING", 1),
        "a0": ("RUNNING", 0),
        "a1": ("RUNNING", 0),
    }
    # The simulator, given the same arrivals, takes the same decisions in the same order.
    assert preempted == [name for _, kind, name in EXPECTED if kind == "preempt"]
    started = [name for _, kind, name in EXPECTED if kind == "start"]
    assert sorted(started) == sorted(ids)
    rows = vc_ls(server)
    assert [tree_row(rows, n) for n in ("d", "a", "b", "e", "c")] == [
        (3, 4, 1),
        (2, 2, 0),
        (1, 2, 1),
        (2, 2, 0),
        (2, 2, 0),
    ]
    table = CliRunner().invoke(
        app,
        ["vc", "ls"],
        env={"CORRAL_URL": server.url, "CORRAL_TOKEN": admin_token(server.manager.data_dir)},
    )
    lines = table.stdout.splitlines()
    assert lines[0].split() == [
        "VC",
        "QUOTA",
        "USED",
        "BORROWED",
        "WEIGHT",
        "LIMIT",
        "PENDING",
        "RUNNING",
    ]
    assert lines[1].split() == ["d/", "3", "4", "1", "1", "-", "1", "4"]
    assert lines[3].split() == ["b", "1", "2", "1", "1", "-", "1", "2"]
    assert lines[4].split() == ["e/", "2", "2", "0", "3", "-", "2", "2"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            TREE_YAML.replace("parent: d}", "parent: x}", 1),
            "virtual_clusters.a.parent: no department 'x' (departments: d, e)",
        ),
        (
            TREE_YAML.replace("d: {quota: 3}", "d: {quota: 2}"),
            "departments.d.quota: its children's quotas sum to 3 GPUs (a 2, b 1), over its "
            "quota of 2",
        ),
        (
            TREE_YAML.replace("e: {quota: 2,", "e: {quota: 2, parent: d,").replace(
                "d: {quota: 3}", "d: {quota: 3, parent: e}"
            ),
            "departments.d.parent: a cycle of departments: d -> e -> d",
        ),
    ],
)
def test_corral_up_refuses_a_bad_tree_in_one_line(tmp_path: Path, text: str, message: str):
    config = tmp_path / "tree.yaml"
    config.write_text(text)
    done = subprocess.run(
        [
            sys.executable,
            *("-m", "corral.cli", "up", "--gpus", "6", "--config", str(config)),
            *("--data-dir", str(tmp_path / "data"), "--single-user"),
        ],
        capture_output=True,
        text=True,
        timeout=600,  # a refusal, but on a loaded 2-core machine the start alone took 50 s
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr


def test_corral_up_refuses_hived_with_departments(tmp_path: Path):
    config = tmp_path / "tree.yaml"
    config.write_text(TREE_YAML)
    done = subprocess.run(
        [
            sys.executable,
            *("-m", "corral.cli", "up", "--gpus", "6", "--config", str(config)),
            *("--data-dir", str(tmp_path / "data"), "--single-user", "--admission", "hived"),
        ],
        capture_output=True,
        text=True,
        timeout=600,  # a refusal, but on a loaded 2-core machine the start alone took 50 s
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "admission hived does not run with departments" in lines[0], (
        done.stderr
    )
