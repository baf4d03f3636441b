"""FGD choosing among GPUs in `corral up`: real job processes (local executor), a real SQLite file,
HTTP on loopback. With two GPUs, each share goes where the fragmentation of the target workload
(learned from the jobs submitted) grows the least, which is not always the fullest GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.server.helpers import admin_token, api, job, start_server, submit, wait_for


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
