"""Mechanisms that need nodes of their own on a live manager: a real Ray cluster on 127.0.0.1
whose two nodes declare one GPU each of different types (V100, K80). The jobs report progress
through corral's helper on the nodes; the reports travel to the manager with the logs."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from corral.exec.ray import RayExecutor
from corral.server.boot import RunningServer, ServerOptions, build_manager, ray_namespace
from tests.exec.ray_cluster import RayCluster
from tests.server.helpers import (
    admin_token,
    api,
    fast_settings,
    job,
    run_server,
    submit,
    wait_for,
)

#: A job whose step takes STEP_V100 seconds on the V100 node and STEP_K80 on the K80 one (an
#: accelerator is a black box that only measurement describes); it reports every step through
#: corral's helper and ends after STEPS steps.
TYPED_STEPS = """\
import os, time
from corral.progress import report
node = os.environ["CORRAL_NODE"]
step_s = float(os.environ["STEP_V100"] if node.startswith("v100") else os.environ["STEP_K80"])
for step in range(1, int(os.environ["STEPS"]) + 1):
    time.sleep(step_s)
    report(step=step, loss=1.0 / step)
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    ray_cluster = RayCluster(
        gpus_per_node=1,
        node_names=("v100-node", "k80-node"),
        head="head",
        gpu_types={"v100-node": "V100", "k80-node": "K80"},
    )
    try:
        ray_cluster.start()
        yield ray_cluster
    finally:
        ray_cluster.stop()


@pytest.fixture
def hetero(cluster: RayCluster, tmp_path: Path) -> Iterator[tuple[RunningServer, httpx.Client]]:
    data_dir = tmp_path / "state"
    data_dir.mkdir()
    options = ServerOptions(
        data_dir=data_dir,
        executor="ray",
        ray_address=cluster.address,
        settings=fast_settings(placement="hetero", progress_check_s=0.1),
        single_user=True,
    )
    executor = RayExecutor(cluster.address, ray_namespace(data_dir))
    try:
        manager = build_manager(options, executor)
    except BaseException:
        executor.close()
        raise
    running = run_server(manager)
    try:
        yield running, api(running.url, admin_token(data_dir))
    finally:
        running.stop()


def typed_job(name: str, steps: int, v100_s: float, k80_s: float, **fields: object) -> dict:
    return {
        "name": name,
        "gpus": 1,
        "command": [sys.executable, "-c", TYPED_STEPS],
        "env": {"STEPS": steps, "STEP_V100": v100_s, "STEP_K80": k80_s},
        **fields,
    }


def ran_on(client: httpx.Client, job_id: str) -> str:
    return str(job(client, job_id)["attempt_history"][0]["gpus"][0])


def test_hetero_learns_each_models_speed_per_gpu_type_and_uses_it(
    hetero: tuple[RunningServer, httpx.Client],
) -> None:
    _, client = hetero
    # Nothing measured: every type looks alike, and the matching breaks the tie.
    unknown = submit(client, **typed_job("probe", 3, 0.01, 0.01))
    assert wait_for(client, unknown)["status"] == "SUCCEEDED"
    tie = ran_on(client, unknown)
    # fussy is 5x faster on the type the tie did NOT pick; measured once on each (pinned).
    fast = "k80" if tie.startswith("v100") else "v100"
    slow = "v100" if fast == "k80" else "k80"
    times = {fast: 0.02, slow: 0.1}
    for gpu_type in (fast, slow):
        pinned = submit(
            client, **typed_job("fussy", 60, times["v100"], times["k80"], gpu_type=gpu_type)
        )
        assert wait_for(client, pinned)["status"] == "SUCCEEDED"
    rates = {
        row["gpu_type"]: row["steps_per_s"]
        for row in client.get("/api/v1/profiles").json()
        if row["model"] == "fussy"
    }
    assert set(rates) == {"v100", "k80"}
    assert rates[fast] > 2 * rates[slow]  # 50 vs 10 steps/s at most; loaded, still apart
    # Both GPUs free: the matching now sends fussy where it was measured fastest.
    free = submit(client, **typed_job("fussy", 5, times["v100"], times["k80"]))
    assert wait_for(client, free)["status"] == "SUCCEEDED"
    assert ran_on(client, free) == f"{fast}-node/0"
    # A model measured on the slow type only is ranked on the fast one by fussy's ratio (the
    # prior), so it goes there too, though it never ran there.
    only = submit(client, **typed_job("other", 100, 0.02, 0.02, gpu_type=slow))
    assert wait_for(client, only)["status"] == "SUCCEEDED"
    assert [row["gpu_type"] for row in job(client, only)["throughput"]] == [slow]
    placed = submit(client, **typed_job("other", 5, 0.02, 0.02))
    assert wait_for(client, placed)["status"] == "SUCCEEDED"
    assert ran_on(client, placed) == f"{fast}-node/0"
