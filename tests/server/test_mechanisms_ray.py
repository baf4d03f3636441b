"""Mechanisms that need several nodes on a live manager: a real Ray cluster on 127.0.0.1 whose
nodes declare 2 GPUs each, of two types (v100-a, v100-b: V100; k80-a: K80). The jobs report
progress through corral's helper on the nodes; the reports travel to the manager with the logs."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from corral.exec.ray import RayExecutor
from corral.server.boot import RunningServer, ServerOptions, build_manager
from corral.server.executors.ray import ray_namespace
from tests.exec.ray_cluster import RayCluster, stopped_at_the_end
from tests.server.helpers import (
    admin_token,
    api,
    fast_settings,
    job,
    run_server,
    submit,
    wait_for,
    wait_until,
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
        gpus_per_node=2,
        node_names=("v100-a", "v100-b", "k80-a"),
        head="head",
        gpu_types={"v100-a": "V100", "v100-b": "V100", "k80-a": "K80"},
    )
    with stopped_at_the_end(ray_cluster):
        yield ray_cluster


def serve(cluster: RayCluster, data_dir: Path, **settings: object) -> RunningServer:
    """A manager on the cluster (again, on the same data dir, after a stop: it recovers)."""
    data_dir.mkdir(exist_ok=True)
    options = ServerOptions(
        data_dir=data_dir,
        executor="ray",
        executor_options={"address": cluster.address},
        settings=fast_settings(progress_check_s=0.1, **settings),
        single_user=True,
    )
    executor = RayExecutor(cluster.address, ray_namespace(data_dir))
    try:
        manager = build_manager(options, executor)
    except BaseException:
        executor.close()
        raise
    return run_server(manager)


@pytest.fixture
def hetero(cluster: RayCluster, tmp_path: Path) -> Iterator[tuple[RunningServer, httpx.Client]]:
    running = serve(cluster, tmp_path / "state", placement="hetero")
    try:
        yield running, api(running.url, admin_token(tmp_path / "state"))
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
    # 200 steps: 4 s on the fast type, long enough to be measured on the manager's clock (the
    # reports come with the logs, about once a second).
    for gpu_type in (fast, slow):
        pinned = submit(
            client, **typed_job("fussy", 200, times["v100"], times["k80"], gpu_type=gpu_type)
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
    assert ran_on(client, free).startswith(fast)
    # A model measured on the slow type only is ranked on the fast one by fussy's ratio (the
    # prior), so it goes there too, though it never ran there.
    only = submit(client, **typed_job("other", 200, 0.02, 0.02, gpu_type=slow))
    assert wait_for(client, only)["status"] == "SUCCEEDED"
    assert [row["gpu_type"] for row in job(client, only)["throughput"]] == [slow]
    placed = submit(client, **typed_job("other", 5, 0.02, 0.02))
    assert wait_for(client, placed)["status"] == "SUCCEEDED"
    assert ran_on(client, placed).startswith(fast)


#: A 2-worker job that runs 4x slower when its workers are on different nodes (a model whose
#: gradients are large: Tiresias's "skewed" models); it reports every step, and ends after
#: STEPS steps or when the file GATE names exists.
SPREAD_SENSITIVE = """\
import os, pathlib, time
from corral.progress import report
packed = os.environ["LOCAL_WORLD_SIZE"] == os.environ["WORLD_SIZE"]
gate = pathlib.Path(os.environ["GATE"])
for step in range(1, int(os.environ["STEPS"]) + 1):
    if gate.exists():
        break
    time.sleep(0.02 if packed else 0.08)
    if os.environ["RANK"] == "0":
        report(step=step)
"""


def test_profile_placement_consolidates_a_model_measured_to_slow_down_when_spread(
    cluster: RayCluster, tmp_path: Path
) -> None:
    data_dir = tmp_path / "state"
    gate = tmp_path / "gate"

    def sensitive(name: str, **fields: object) -> dict:
        return {
            "name": name,
            "model": "skewed",
            "gpus": 2,
            "workers": 2,
            "gpu_type": "v100",
            "command": [sys.executable, "-c", SPREAD_SENSITIVE],
            "env": {"STEPS": 100000, "GATE": str(gate)},
            **fields,
        }

    def runs_for(client: httpx.Client, job_id: str, reports: int) -> None:
        """Until the job made `reports` steps and the manager measured its rate (on its own
        clock: over a second of reports at least)."""

        def measured() -> bool:
            progress = job(client, job_id)["progress"] or {}
            return progress.get("step", 0) >= reports and bool(progress.get("steps_per_s"))

        wait_until(measured, f"job {job_id}'s reports and rate")

    # Measured with `any` (the first free GPUs): packed on v100-a, then spread over both V100
    # nodes behind a 1-GPU blocker on v100-a/0.
    running = serve(cluster, data_dir, placement="any")
    try:
        client = api(running.url, admin_token(data_dir))
        packed = submit(client, **sensitive("packed"))
        runs_for(client, packed, 60)
        client.post(f"/api/v1/jobs/{packed}/cancel")
        wait_for(client, packed)
        blocker = submit(client, name="blocker", gpus=1, gpu_type="v100", command="sleep 3600")
        assert wait_for(client, blocker, ["RUNNING"])["placement"] == ["v100-a/0"]
        spread = submit(client, **sensitive("spread"))
        assert sorted(wait_for(client, spread, ["RUNNING"])["placement"]) == [
            "v100-a/1",
            "v100-b/0",
        ]
        runs_for(client, spread, 20)
        # Both stay: v100-a and v100-b have one free GPU each. The blocker moves aside.
        client.post(f"/api/v1/jobs/{blocker}/cancel")
        wait_for(client, blocker)
    finally:
        running.stop()  # the spread job keeps running: the next manager finds it again

    running = serve(cluster, data_dir, placement="profile")
    try:
        client = api(running.url, admin_token(data_dir))
        # What the first manager measured (the spread job's rate folded in when it stopped).
        rates = {
            row["nodes"]: row["steps_per_s"]
            for row in client.get("/api/v1/profiles").json()
            if row["model"] == "skewed"
        }
        assert set(rates) == {1, 2} and rates[1] > 2 * rates[2]  # 50 vs 12.5 steps/s at most
        assert sorted(wait_for(client, spread, ["RUNNING"])["placement"]) == [
            "v100-a/1",
            "v100-b/0",
        ]
        # Free now: v100-a/0 and v100-b/1, one per node. The measured model waits for a node of
        # its own; an unmeasured one (taken as insensitive) spreads over both and runs.
        waits = submit(client, **sensitive("waits"))
        other = submit(
            client, name="other", gpus=2, workers=2, gpu_type="v100", command="sleep 3600"
        )
        assert sorted(wait_for(client, other, ["RUNNING"])["placement"]) == [
            "v100-a/0",
            "v100-b/1",
        ]
        assert job(client, waits)["status"] == "PENDING"
        assert (
            "consolidate" in job(client, waits)["reason"]
            or "one node" in job(client, waits)["reason"]
        ), job(client, waits)["reason"]
        gate.write_text("")  # the spread job ends; v100-a/1 and v100-b/0 come free
        client.post(f"/api/v1/jobs/{other}/cancel")
        placement = sorted(wait_for(client, waits, ["RUNNING", "SUCCEEDED"])["placement"] or [])
        assert placement in ([], ["v100-a/0", "v100-a/1"], ["v100-b/0", "v100-b/1"])
    finally:
        running.stop()


#: HiveD on the cluster above: VC `a` is guaranteed one V100 node, `b` one V100 node and the
#: K80 node; the physical cells name the Ray nodes.
HIVED = """\
cell_types:
  V100-NODE: {child: v100, count: 2, node: true}
  K80-NODE: {child: k80, count: 2, node: true}
physical_cells:
  - {type: V100-NODE, names: [v100-a, v100-b]}
  - {type: K80-NODE, names: [k80-a]}
virtual_clusters:
  a: {V100-NODE: 1}
  b: {V100-NODE: 1, K80-NODE: 1}
"""


def test_hived_binds_vcs_to_cells_of_the_ray_nodes_and_lends_idle_ones(
    cluster: RayCluster, tmp_path: Path
) -> None:
    config = tmp_path / "cluster.yaml"
    config.write_text(HIVED)
    data_dir = tmp_path / "state"
    data_dir.mkdir()
    options = ServerOptions(
        data_dir=data_dir,
        executor="ray",
        executor_options={"address": cluster.address},
        config=config,
        settings=fast_settings(admission="hived"),
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
        client = api(running.url, admin_token(data_dir))
        sleeper = {"gpus": 2, "gpu_type": "v100", "command": "sleep 3600", "grace_seconds": 1}
        first = submit(client, name="a-first", vc="a", **sleeper)
        node_of_first = wait_for(client, first, ["RUNNING"])["placement"][0].split("/")[0]
        # a's second job borrows b's idle V100 node (hived lends idle cells) ...
        second = submit(client, name="a-second", vc="a", **sleeper)
        lent = wait_for(client, second, ["RUNNING"])["placement"][0].split("/")[0]
        assert {node_of_first, lent} == {"v100-a", "v100-b"}
        # ... until b needs its cell: the borrower is preempted, b's job runs there.
        mine = submit(client, name="b-own", vc="b", **sleeper)
        assert wait_for(client, mine, ["RUNNING"])["placement"][0].startswith(lent)
        preempted = wait_for(client, second, ["PENDING"])
        assert preempted["preemptions"] == 1
        assert job(client, first)["status"] == "RUNNING"
        vcs = {vc["name"]: vc for vc in client.get("/api/v1/vcs").json()}
        assert (vcs["a"]["guaranteed_gpus"], vcs["b"]["guaranteed_gpus"]) == (2, 4)
    finally:
        running.stop()
