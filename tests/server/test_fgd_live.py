"""FGD choosing among GPUs and nodes in `corral up`: real job processes (local executor), a real
SQLite file, HTTP on loopback. With two GPUs, each share goes where the fragmentation of the target
workload (learned from the jobs submitted) grows the least, which is not always the fullest GPU;
with two nodes declared on this machine, FGD chooses the node the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from corral.core.cluster import Cluster, NodeDef
from corral.exec.local import LocalExecutor
from corral.server.boot import ServerOptions, _build_with
from tests.server.helpers import (
    admin_token,
    api,
    fast_settings,
    job,
    run_server,
    start_server,
    submit,
    wait_for,
)


def share(name: str, gpus: float) -> dict[str, Any]:
    return {"name": name, "gpus": gpus, "command": "exec sleep 3600", "grace_seconds": 1}


def test_fgd_places_each_share_where_fragmentation_grows_least(data_dir: Path) -> None:
    # Two GPUs of one machine, fifo, fgd. The target workload is the shapes of the jobs
    # submitted (here: this test's). F(m) of a GPU state for a task m: the free milli-GPU of the
    # GPUs with less free than m asks. By hand (free milli per GPU, GPU0 first):
    # 1. A (0.4) arrives: workload {0.4}. Both GPUs are alike: A goes on the first, GPU0.
    #    Free: (600, 1000).
    # 2. B (0.5) arrives: workload {0.4: 1, 0.5: 1}.
    #    On GPU0 -> (100, 1000): 100 is below both 400 and 500: F grows by 100 + 100 = 200.
    #    On GPU1 -> (600, 500): no GPU below 400 or 500: F grows by 0.
    #    FGD puts B on GPU1, the emptier GPU (best-fit or packing would fill GPU0, the fullest;
    #    FGD's score inverted would too).
    # 3. C (0.5) arrives: workload {0.4: 1, 0.5: 2}.
    #    On GPU0 -> (100, 500): 100 for the 0.4s, 100 for each of the two 0.5s: grows by 300.
    #    On GPU1 -> (600, 0): nothing free below a request: grows by 0.
    #    FGD puts C on GPU1, which it fills exactly (its score inverted would pick GPU0).
    server = start_server(data_dir, gpus=2, placement="fgd", policy="fifo")
    try:
        client = api(server.url, admin_token(data_dir))
        gpu0, gpu1 = [
            f"{node['name']}/{gpu['index']}"
            for node in client.get("/api/v1/cluster").json()["nodes"]
            for gpu in node["gpus"]
        ]
        placed = {}
        for name, gpus in (("A", 0.4), ("B", 0.5), ("C", 0.5)):
            job_id = submit(client, **share(name, gpus))
            placed[name] = (job_id, wait_for(client, job_id, ["RUNNING"], timeout=60)["placement"])
        assert {name: p for name, (_, p) in placed.items()} == {
            "A": [gpu0],
            "B": [gpu1],
            "C": [gpu1],
        }
        gpus = {
            f"{node['name']}/{gpu['index']}": gpu
            for node in client.get("/api/v1/cluster").json()["nodes"]
            for gpu in node["gpus"]
        }
        assert (gpus[gpu0]["share"], gpus[gpu1]["share"]) == (0.4, 1.0)
        assert sorted(j["job"] for j in gpus[gpu1]["jobs"]) == sorted(
            [placed["B"][0], placed["C"][0]]
        )
        for job_id, _ in placed.values():
            client.post(f"/api/v1/jobs/{job_id}/cancel")
            assert wait_for(client, job_id)["status"] == "CANCELLED"
            assert job(client, job_id)["preemptions"] == 0
    finally:
        server.stop()


def test_fgd_chooses_the_node_where_fragmentation_grows_least(data_dir: Path) -> None:
    # Two nodes declared on this machine: n0 with one GPU, n1 with two; fifo, fgd. The target
    # workload is the shapes of the jobs submitted. F_n(m) for a task m: the free milli-GPU of
    # the node's GPUs with less free than m asks; FGD scores each node by the growth of its
    # F_n over the workload, the lowest first (ties: the lowest node). By hand (free milli per
    # GPU of n0 | n1):
    # 1. A (0.4): workload {0.4}. On n0 -> (600) or on n1 -> (600, 1000): nothing below 400
    #    either way, both grow by 0: the tie goes to n0. Free: (1000 - 400 = 600) | (1000, 1000).
    # 2. B (0.5): workload {0.4: 1, 0.5: 1}.
    #    On n0 -> (100): 100 is below both 400 and 500: n0's F grows by 100 + 100 = 200.
    #    On n1 -> (500, 1000): nothing below 400 or 500: n1's grows by 0.
    #    FGD puts B on n1, the emptier node (best fit would fill n0's GPU; FGD's score
    #    inverted would too).
    # 3. C (0.5): workload {0.4: 1, 0.5: 2}.
    #    On n0 -> (100): grows by 100 + 2 x 100 = 300.
    #    On n1, on B's GPU -> (0, 1000), or on the free one -> (500, 500): grows by 0 either way;
    #    the tie goes to the fuller GPU, B's.
    #    FGD puts C on n1, on B's GPU, which it fills (its score inverted: on n0).
    # n1's second GPU stays whole.
    data_dir.mkdir(parents=True)
    settings = fast_settings(placement="fgd", policy="fifo")
    options = ServerOptions(data_dir=data_dir, settings=settings, single_user=True)
    cluster = Cluster.from_nodes([NodeDef("n0", 1, "gpu"), NodeDef("n1", 2, "gpu")])
    server = run_server(_build_with(options, LocalExecutor(), cluster, None))
    try:
        client = api(server.url, admin_token(data_dir))
        placed = {}
        for name, gpus in (("A", 0.4), ("B", 0.5), ("C", 0.5)):
            job_id = submit(client, **share(name, gpus))
            placed[name] = (job_id, wait_for(client, job_id, ["RUNNING"], timeout=60)["placement"])
        where = {name: p for name, (_, p) in placed.items()}
        assert [gpus[0].split("/")[0] for gpus in where.values()] == ["n0", "n1", "n1"], where
        assert where["C"] == where["B"]
        gpus = {
            f"{node['name']}/{gpu['index']}": gpu
            for node in client.get("/api/v1/cluster").json()["nodes"]
            for gpu in node["gpus"]
        }
        assert {name: gpu["share"] for name, gpu in gpus.items()} == {
            where["A"][0]: 0.4,
            where["B"][0]: 1.0,
            next(name for name in gpus if name.startswith("n1/") and name != where["B"][0]): 0.0,
        }
        for job_id, _ in placed.values():
            client.post(f"/api/v1/jobs/{job_id}/cancel")
            assert wait_for(client, job_id)["status"] == "CANCELLED"
            assert job(client, job_id)["preemptions"] == 0
    finally:
        server.stop()
