"""Draining and resuming nodes through a live manager: real job processes (local executor), a real
SQLite file, HTTP on loopback, and `corral up` killed with SIGKILL.

Two logical nodes of one GPU each, n0 and n1, whose jobs all run on this machine (the local
executor runs one node's jobs; as logical nodes they are what a drain needs), fifo and
consolidate: the first job lands on n0, the second on n1."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.core.cluster import Cluster, NodeDef
from corral.exec.local import LocalExecutor
from corral.server.boot import RunningServer, ServerOptions, _build_with
from tests.server.helpers import (
    Corral,
    admin_token,
    api,
    attempt_nodes,
    considered,
    fast_settings,
    job,
    kill_jobs_of,
    nodes,
    python_job,
    settled,
    submit,
    train_job,
    wait_for,
    wait_until,
)


def two_nodes(data_dir: Path) -> RunningServer:
    data_dir.mkdir(parents=True, exist_ok=True)
    settings = fast_settings(policy="fifo", placement="consolidate")
    options = ServerOptions(data_dir=data_dir, settings=settings, single_user=True)
    cluster = Cluster.from_nodes([NodeDef("n0", 1, "gpu"), NodeDef("n1", 1, "gpu")])
    return run_built(_build_with(options, LocalExecutor(), cluster, None))


def run_built(manager: Any) -> RunningServer:
    running = RunningServer(manager)
    try:
        return running.start()
    except BaseException:
        running.server.should_exit = True
        manager.stop()
        raise


@pytest.fixture
def server(data_dir: Path) -> Iterator[RunningServer]:
    running = two_nodes(data_dir)
    try:
        yield running
    finally:
        running.stop()


def until_file(name: str, path: Path) -> dict[str, Any]:
    """A job that runs until `path` exists."""
    code = f"import os, time\nwhile not os.path.exists({str(path)!r}): time.sleep(0.05)"
    return python_job(name, code)


def one_on_each_node(client: httpx.Client, tmp_path: Path) -> tuple[str, str, Path, Path]:
    """Jobs a (on n0) and b (on n1) running until their files go_a and go_b appear."""
    go_a, go_b = tmp_path / "go-a", tmp_path / "go-b"
    a = submit(client, **until_file("a", go_a))
    wait_for(client, a, ["RUNNING"])
    b = submit(client, **until_file("b", go_b))
    wait_for(client, b, ["RUNNING"])
    assert (attempt_nodes(client, a), attempt_nodes(client, b)) == (["n0"], ["n1"])
    return a, b, go_a, go_b


def test_a_drained_node_lets_its_job_finish_and_the_next_job_starts_on_the_other(
    server: RunningServer, tmp_path: Path
) -> None:
    client = api(server.url, admin_token(server.manager.data_dir))
    a, b, go_a, go_b = one_on_each_node(client, tmp_path)

    answer = client.post("/api/v1/nodes/n0/drain", json={"reason": "swap a fan"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["state"] == "draining" and answer.json()["jobs"] == [a]
    assert job(client, a)["status"] == "RUNNING"  # not preempted: it finishes

    c = submit(client, **python_job("c", "print('c ran')"))
    go_a.touch()  # a finishes: n0's GPU is free, but n0 is drained
    wait_for(client, a, ["SUCCEEDED"])
    wait_until(lambda: nodes(client)["n0"]["state"] == "drained", "n0 drained")
    settled(server)  # the round after a's end has run: it must not have started c on n0
    found = job(client, c)
    assert (found["status"], found["attempts"]) == ("PENDING", 0), found
    view = nodes(client)["n0"]
    assert (view["reason"], view["by"], view["gpus_used"], view["jobs"]) == (
        "swap a fan",
        "admin",
        0,
        [],
    )
    # Its idle GPU is held out, not free; c waits for it, not for GPUs "all in use".
    assert (view["gpus_free"], view["gpus_held"]) == (0, 1), view
    assert "1 on node n0 is drained (swap a fan)" in found["reason"], found["reason"]

    go_b.touch()  # n1 frees: c starts there, not on the drained n0
    assert wait_for(client, c)["status"] == "SUCCEEDED"
    assert attempt_nodes(client, c) == ["n1"]

    answer = client.post("/api/v1/nodes/n0/resume")
    assert answer.status_code == 200, answer.text
    assert answer.json()["state"] == "up"
    d = submit(client, **until_file("d", tmp_path / "go-d"))
    e = submit(client, **until_file("e", tmp_path / "go-e"))
    wait_for(client, d, ["RUNNING"])
    wait_for(client, e, ["RUNNING"])  # both nodes take jobs again
    assert sorted(attempt_nodes(client, d) + attempt_nodes(client, e)) == ["n0", "n1"]
    (tmp_path / "go-d").touch()
    (tmp_path / "go-e").touch()
    wait_for(client, d)
    wait_for(client, e)


def test_a_drain_with_preempt_requeues_the_job_which_restarts_elsewhere(
    server: RunningServer, tmp_path: Path
) -> None:
    client = api(server.url, admin_token(server.manager.data_dir))
    go_b = tmp_path / "go-b"
    a = submit(client, **train_job("a", steps=400, step_s=0.05))
    wait_until(lambda: job(client, a)["progress"], "a's first progress report")
    b = submit(client, **until_file("b", go_b))
    wait_for(client, b, ["RUNNING"])
    assert (attempt_nodes(client, a), attempt_nodes(client, b)) == (["n0"], ["n1"])

    answer = client.post("/api/v1/nodes/n0/drain", json={"reason": "ECC", "preempt": True})
    assert answer.status_code == 200, answer.text
    # a is stopped through its checkpoint contract and waits again: a preemption, not a
    # failure; nothing free for it (n0 drained, n1 busy with b).
    found = wait_for(client, a, ["PENDING"])
    assert (found["failures"], found["preemptions"]) == (0, 1), found
    wait_until(
        lambda: job(client, a)["attempt_history"][0]["state"] == "ended", "a's attempt ended"
    )
    first = job(client, a)["attempt_history"][0]
    assert first["outcome"] == "preempted", first
    assert any(e["message"] == "preempted by drain of node n0" for e in job(client, a)["events"]), (
        job(client, a)["events"]
    )
    wait_until(lambda: nodes(client)["n0"]["state"] == "drained", "n0 drained")
    settled(server)
    assert job(client, a)["attempts"] == 1  # not restarted on the drained n0

    go_b.touch()  # n1 frees: a resumes there from its checkpoint
    done = wait_for(client, a)
    assert done["status"] == "SUCCEEDED", done
    assert attempt_nodes(client, a) == ["n0", "n1"]
    assert done["failures"] == 0
    log = client.get(f"/api/v1/jobs/{a}/logs").text
    assert "resumed from step" in log, log[-2000:]


def test_a_preempted_job_restarts_on_its_node_after_resume(
    server: RunningServer, tmp_path: Path
) -> None:
    client = api(server.url, admin_token(server.manager.data_dir))
    a, b, go_a, go_b = one_on_each_node(client, tmp_path)
    answer = client.post("/api/v1/nodes/n0/drain", json={"reason": "x", "preempt": True})
    assert answer.status_code == 200, answer.text
    wait_for(client, a, ["PENDING"])
    wait_until(lambda: nodes(client)["n0"]["state"] == "drained", "n0 drained")
    settled(server)
    assert job(client, a)["attempts"] == 1
    assert client.post("/api/v1/nodes/n0/resume").status_code == 200
    wait_for(client, a, ["RUNNING"])
    assert attempt_nodes(client, a) == ["n0", "n0"]
    go_a.touch()
    go_b.touch()
    assert wait_for(client, a)["status"] == "SUCCEEDED"
    wait_for(client, b)


def test_drain_refusals_name_the_node_and_the_rule(server: RunningServer) -> None:
    admin = api(server.url, admin_token(server.manager.data_dir))
    answer = admin.post("/api/v1/nodes/n9/drain", json={"reason": "x"})
    assert answer.status_code == 404 and "no node 'n9'" in answer.json()["detail"], answer.text
    answer = admin.post("/api/v1/nodes/n0/drain", json={})
    assert answer.status_code == 422 and "reason" in answer.json()["detail"]
    answer = admin.post("/api/v1/nodes/n0/resume")
    assert answer.status_code == 409 and "node n0 is not drained" in answer.json()["detail"]
    created = admin.post("/api/v1/tokens", json={"user": "alice"})
    user = api(server.url, created.json()["token"])
    answer = user.post("/api/v1/nodes/n0/drain", json={"reason": "x"})
    assert answer.status_code == 403 and "only an admin" in answer.json()["detail"]
    assert user.get("/api/v1/nodes").status_code == 200  # everyone reads the nodes


def test_metrics_carry_every_node_state(server: RunningServer) -> None:
    admin = api(server.url, admin_token(server.manager.data_dir))
    assert admin.post("/api/v1/nodes/n1/drain", json={"reason": "x"}).status_code == 200
    body, _ = server.manager.metrics.text()
    text = body.decode()
    for node, up in (("n0", 1), ("n1", 0)):
        assert f'corral_node_state{{node="{node}",state="up"}} {up}.0' in text, text
        assert f'corral_node_state{{node="{node}",state="drained"}} {1 - up}.0' in text
        for state in ("draining", "down"):
            assert f'corral_node_state{{node="{node}",state="{state}"}} 0.0' in text


# -- a drain outlives a kill -9 ---------------------------------------------------------------


@pytest.fixture
def corral(tmp_path: Path) -> Iterator[Corral]:
    server = Corral(tmp_path / "corral", "--gpus", "1")
    try:
        yield server
    finally:
        try:
            server.stop()
        finally:
            kill_jobs_of(server.data_dir)


def node_cli(corral: Corral, *args: str) -> subprocess.CompletedProcess[str]:
    """`corral node ARGS` as a separate process, as an admin's shell runs it."""
    env = {**os.environ, "CORRAL_URL": corral.url, "CORRAL_TOKEN": admin_token(corral.data_dir)}
    return subprocess.run(
        [sys.executable, "-m", "corral.cli", "node", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_drained_node_stays_drained_after_kill_9_and_restart(corral: Corral) -> None:
    client = corral.start()
    (name,) = nodes(client)
    drained = node_cli(corral, "drain", name, "--reason", "replace a DIMM")
    assert drained.returncode == 0, drained.stderr
    assert drained.stdout == f"node {name} drained: replace a DIMM\n"
    unknown = node_cli(corral, "drain", "no-such-node", "--reason", "x")
    assert unknown.returncode == 1 and "no node 'no-such-node'" in unknown.stderr
    assert unknown.stderr.count("\n") == 1, unknown.stderr
    corral.kill()

    client = corral.start()  # the drain is in the store: the node is still drained
    listed = node_cli(corral, "ls")
    assert listed.returncode == 0, listed.stderr
    row = listed.stdout.splitlines()[1].split()
    assert row[:2] == [name, "drained"] and "replace" in listed.stdout, listed.stdout
    waiting = submit(client, **python_job("w", "print('ran')"))
    assert considered(client, waiting)["attempts"] == 0  # its only node is drained
    resumed = node_cli(corral, "resume", name)
    assert resumed.returncode == 0 and resumed.stdout == f"node {name} up\n", resumed.stderr
    assert wait_for(client, waiting)["status"] == "SUCCEEDED"
    states = [
        row.state for row in _store_changes(corral.data_dir) if row.node == name
    ]  # every change with its time, the manager's own join first
    assert states[:1] == ["joined"] and states[-2:] == ["draining", "resumed"], states


def _store_changes(data_dir: Path) -> list[Any]:
    from corral.server.store import Store

    store = Store(Store.sqlite_url(data_dir))
    try:
        return store.node_changes()
    finally:
        store.close()
