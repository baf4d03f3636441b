"""The manager on a real Ray cluster on 127.0.0.1: a CPU-only head and two nodes of 4 declared
GPUs (n1, n2), each a `ray start` of its own. Every process of a node carries CORRAL_TEST_NODE,
so a job's own environment tells which node it ran under (see tests/exec/ray_cluster.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.exec.ray import RayExecutor
from corral.server.boot import RunningServer, ServerOptions, build_manager
from corral.server.executors.ray import ray_namespace
from tests.exec.ray_cluster import RayCluster, processes_of
from tests.server.helpers import (
    WAIT_S,
    Corral,
    admin_token,
    api,
    fast_settings,
    job,
    run_server,
    submit,
    train_job,
    wait_for,
    wait_until,
)

ENV_DUMP = (
    "import json, os; rank = os.environ['RANK']; "
    "json.dump(dict(os.environ), open(f'env-{rank}.json', 'w')); "
    "print(f'hello from rank {rank}', flush=True)"
)
# Prints train.py's step lines (`rank R: step S/100 loss=...`), but holds before step 51 until
# the file named by its argument exists: the test decides how long the job runs.
GATED_STEPS = (
    "import os, pathlib, sys, time\n"
    "rank, gate = os.environ['RANK'], pathlib.Path(sys.argv[1])\n"
    "for step in range(1, 101):\n"
    "    while step == 51 and not gate.exists():\n"
    "        time.sleep(0.05)\n"
    "    time.sleep(0.02)\n"
    "    print(f'rank {rank}: step {step}/100 loss=0.0', flush=True)\n"
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    ray_cluster = RayCluster(gpus_per_node=4, node_names=("n1", "n2"), head="head")
    try:
        ray_cluster.start()  # a start that fails stops the nodes it began, and so does stop()
        yield ray_cluster
    finally:
        ray_cluster.stop()


def start(cluster: RayCluster, data_dir: Path, **settings: Any) -> RunningServer:
    options = ServerOptions(
        data_dir=data_dir,
        executor="ray",
        executor_options={"address": cluster.address},
        settings=fast_settings(**settings),
        single_user=True,
    )
    data_dir.mkdir(parents=True)
    executor = RayExecutor(cluster.address, ray_namespace(data_dir))
    try:
        manager = build_manager(options, executor)
    except BaseException:
        executor.close()
        raise
    return run_server(manager)


@pytest.fixture
def server(cluster: RayCluster, tmp_path: Path) -> Iterator[tuple[RunningServer, httpx.Client]]:
    running = start(cluster, tmp_path / "state")
    try:
        yield running, api(running.url, admin_token(tmp_path / "state"))
    finally:
        running.stop()


def node_names(client: httpx.Client) -> list[tuple[str, int]]:
    nodes = client.get("/api/v1/cluster").json()["nodes"]
    return [(node["name"], len(node["gpus"])) for node in nodes]


def events(client: httpx.Client, job_id: str) -> list[str]:
    return [event["message"] for event in job(client, job_id)["events"]]


def wait_for_log(client: httpx.Client, job_id: str, rank: int, text: str) -> None:
    """Until the job's latest attempt's rank-R stdout, as the API serves it, holds `text`."""
    deadline = time.monotonic() + WAIT_S
    while text not in (
        seen := client.get(f"/api/v1/jobs/{job_id}/logs", params={"rank": rank}).text
    ):
        assert time.monotonic() < deadline, f"rank {rank} never printed {text!r}: {seen[-300:]!r}"
        time.sleep(0.2)


def test_an_8_gpu_job_runs_as_two_workers_on_two_4_gpu_nodes(
    server: tuple[RunningServer, httpx.Client], tmp_path: Path
) -> None:
    _, client = server
    # The head declares no GPUs: it is no node of corral's.
    assert node_names(client) == [("n1", 4), ("n2", 4)]
    workdir = tmp_path / "work"
    spec = {
        "name": "wide",
        "gpus": 8,
        "workers": 2,
        "command": [sys.executable, "-c", ENV_DUMP],
        "workdir": str(workdir),
    }
    done = wait_for(client, submit(client, **spec))
    assert done["status"] == "SUCCEEDED", done
    envs = [json.loads((workdir / f"env-{rank}.json").read_text()) for rank in (0, 1)]
    assert [env["RANK"] for env in envs] == ["0", "1"]
    assert {env["WORLD_SIZE"] for env in envs} == {"2"}
    assert [env["LOCAL_RANK"] for env in envs] == ["0", "0"]
    # Two different nodes, as the node's own processes (not just corral's variable) say.
    ran_under = [env["CORRAL_TEST_NODE"] for env in envs]
    assert sorted(ran_under) == ["n1", "n2"]
    assert [env["CORRAL_NODE"] for env in envs] == ran_under
    # One rendezvous: rank 0's node address and one port.
    assert {env["MASTER_ADDR"] for env in envs} == {"127.0.0.1"}
    assert len({env["MASTER_PORT"] for env in envs}) == 1
    # Four distinct GPUs each: all four of its node.
    for env in envs:
        devices = env["CUDA_VISIBLE_DEVICES"].split(",")
        assert sorted(devices) == ["0", "1", "2", "3"]
    (attempt,) = job(client, done["id"])["attempt_history"]
    assert sorted(attempt["gpus"]) == [f"{n}/{d}" for n in ("n1", "n2") for d in range(4)]
    # Each worker's output came back to the manager.
    for rank in (0, 1):
        text = client.get(f"/api/v1/jobs/{done['id']}/logs", params={"rank": rank}).text
        assert text == f"hello from rank {rank}\n"


def test_a_worker_that_cannot_span_machines_is_refused(
    server: tuple[RunningServer, httpx.Client],
) -> None:
    _, client = server
    response = client.post(
        "/api/v1/jobs", json={"name": "one", "gpus": 8, "workers": 1, "command": "true"}
    )
    assert response.status_code == 422
    assert "4" in response.text and "8" in response.text


def test_preemption_and_cancel_behave_as_on_one_machine(
    cluster: RayCluster, tmp_path: Path
) -> None:
    running = start(cluster, tmp_path / "state", policy="las", las_thresholds_gpu_s=[8.0])
    try:
        client = api(running.url, admin_token(tmp_path / "state"))
        long = submit(client, **train_job("long", steps=150, gpus=8, workers=2))
        wait_for(client, long, ["RUNNING"])
        running_since = time.monotonic()
        wait_for_log(client, long, 0, "step 2/150")  # checkpointed: a resume starts past 0
        # 8 GPUs x 1 s = 8 GPU-seconds: past LAS's first queue (time the scheduler counts)
        time.sleep(max(0.0, running_since + 2.0 - time.monotonic()))
        short = submit(client, **train_job("short", steps=5, gpus=4))
        done_short = wait_for(client, short, timeout=240)
        done_long = wait_for(client, long, timeout=300)
        assert done_short["status"] == done_long["status"] == "SUCCEEDED"
        assert (done_long["preemptions"], done_long["attempts"]) == (1, 2)
        logs = client.get(f"/api/v1/jobs/{long}/logs", params={"attempt": 2}).text
        assert int(logs.split("resumed from step ")[1].split()[0]) > 0
        # Cancel: the job's signal reaches every worker, which exits after its checkpoint.
        third = submit(client, **train_job("third", steps=400, gpus=8, workers=2))
        # Both run (rank 1 may resume from the checkpoint rank 0 has already written).
        wait_for_log(client, third, 0, "starting from step 0")
        wait_for_log(client, third, 1, "rank 1: step ")
        assert client.post(f"/api/v1/jobs/{third}/cancel").status_code == 200
        assert wait_for(client, third)["status"] == "CANCELLED"
        for rank in (0, 1):
            wait_for_log(client, third, rank, "stopped at step")
    finally:
        running.stop()


def test_corral_up_on_ray_survives_kill_9_and_finds_its_workers_again(
    cluster: RayCluster, tmp_path: Path
) -> None:
    # The cluster's token only in ~/.ray/auth_token: corral uses it as a bare ray.init() would.
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(Path(os.environ["RAY_AUTH_TOKEN_PATH"]).read_text())
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_AUTH")}
    env["HOME"] = str(home)
    up_args = ("--executor", "ray", "--ray-address", cluster.address)
    corral = Corral(tmp_path / "state", *up_args, env=env)
    gate = tmp_path / "go-on"  # the job holds at step 51 until it exists
    try:
        client = corral.start()
        assert (
            f"8 GPUs on 2 nodes of the Ray cluster at {cluster.address}" in corral.log().read_text()
        )
        command = [sys.executable, "-c", GATED_STEPS, str(gate)]
        wide = submit(client, name="wide", gpus=8, workers=2, command=command)
        wait_for(client, wide, ["RUNNING"])
        wait_for_log(client, wide, 0, "step 2/100")
        corral.kill()  # the manager dies; the detached actors and their workers do not
        client = corral.start()
        # Found running again (the job holds until the gate opens, however slow the restart).
        found = "attempt 1 found running"
        wait_until(lambda: found in events(client, wide), f"event {found!r}")
        assert job(client, wide)["status"] == "RUNNING"
        gate.touch()
        done = wait_for(client, wide)
        assert done["status"] == "SUCCEEDED" and done["attempts"] == 1  # never started twice
        # Rank 0's output from both sides of the restart came across, each line once: it
        # printed steps 1 to 100.
        text = client.get(f"/api/v1/jobs/{wide}/logs", params={"rank": 0}).text
        steps = [line.split()[3] for line in text.splitlines() if "/100 loss=" in line]
        assert steps == [f"{step}/100" for step in range(1, 101)]
    finally:
        corral.stop()


def test_a_node_that_dies_mid_run_requeues_the_job_which_completes_on_a_new_node(
    cluster: RayCluster, tmp_path: Path
) -> None:
    # Last in the module: n2 does not come back.
    running = start(cluster, tmp_path / "state")
    try:
        client = api(running.url, admin_token(tmp_path / "state"))
        wide = submit(client, **train_job("wide", steps=120, gpus=8, workers=2))
        wait_for(client, wide, ["RUNNING"])
        wait_for_log(client, wide, 0, "step 2/120")  # some steps checkpointed
        # rank 1 runs on n2 (from a step of rank 0's checkpoint if it started late)
        wait_for_log(client, wide, 1, "rank 1: step ")
        assert processes_of("n2", jobs=True, cluster=cluster.id)  # rank 1's guard and python
        assert cluster.kill_node("n2") > 0
        # Its Ray is gone, the machine is not: the job's processes there die with their actor.
        deadline = time.monotonic() + 60
        while processes_of("n2", jobs=True, cluster=cluster.id):
            assert time.monotonic() < deadline, "a dead node's job processes live on"
            time.sleep(0.1)
        # Ray finds the node dead; its attempt ends as lost; the job waits for 8 GPUs.
        requeued = wait_for(client, wide, ["PENDING"])
        deadline = time.monotonic() + WAIT_S
        while node_names(client) != [("n1", 4)]:
            assert time.monotonic() < deadline, node_names(client)
            time.sleep(0.2)
        assert requeued["failures"] == 0  # a node's death is not the job's failure
        cluster.add_node("n3", gpus=4)
        done = wait_for(client, wide, timeout=300)
        assert done["status"] == "SUCCEEDED", done
        # The attempt on n2 was lost; so may be a retry launched before n2 had left the core's
        # cluster (the launch fails); the last attempt, on n1 and n3, succeeded.
        *lost, last = job(client, wide)["attempt_history"]
        assert lost and all(attempt["outcome"] == "lost" for attempt in lost)
        assert "died" in lost[0]["reason"]
        assert last["outcome"] == "succeeded"
        assert {gpu.split("/")[0] for gpu in last["gpus"]} == {"n1", "n3"}
        # Never twice at once: each attempt began after every worker of the one before ended.
        attempts = [*lost, last]
        for before, after in zip(attempts, attempts[1:], strict=False):
            assert after["started_at"] >= before["ended_at"]
        logs = client.get(f"/api/v1/jobs/{wide}/logs", params={"attempt": last["number"]}).text
        assert int(logs.split("resumed from step ")[1].split()[0]) > 0
        assert node_names(client) == [("n1", 4), ("n3", 4)]
    finally:
        running.stop()


@pytest.mark.parametrize(
    ("token", "message"),
    [
        (None, "the cluster requires its token: set RAY_AUTH_TOKEN"),
        ("0" * 64, "the cluster refused the token"),
    ],
)
def test_a_manager_without_the_clusters_token_is_refused_in_one_line(
    cluster: RayCluster, tmp_path: Path, token: str | None, message: str
) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_AUTH")}
    env["HOME"] = str(tmp_path)  # no ~/.ray/auth_token either
    if token is not None:
        env["RAY_AUTH_TOKEN"] = token
    command = [sys.executable, "-m", "corral.cli", "up", "--data-dir", str(tmp_path / "state")]
    command += ["--executor", "ray", "--ray-address", cluster.address]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: --ray-address {cluster.address}: {message}")
