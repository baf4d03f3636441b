"""Philly's relaxed locality in a running manager: real job processes (local executor), a real
SQLite file, HTTP on loopback, the real clock. A gang waits for a consolidated placement (all its
GPUs on one node) until it has waited `relax.after_s`; then it takes the fewest nodes anywhere."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from corral.core.cluster import Cluster, NodeDef
from corral.exec.local import LocalExecutor
from corral.server.boot import RunningServer, ServerOptions, _build_with
from tests.server.helpers import (
    admin_token,
    api,
    considered,
    fast_settings,
    job,
    run_server,
    submit,
    wait_for,
    wait_until,
)

SLEEPER = {"gpus": 1, "command": "exec sleep 3600", "grace_seconds": 1}
RELAX_AFTER_S = 4.0


def two_nodes(data_dir: Path, **settings: Any) -> RunningServer:
    """Two nodes of two GPUs, n0 and n1, declared on this machine: the local executor runs both
    nodes' jobs here, and the scheduler places them on the nodes as on two machines."""
    data_dir.mkdir(parents=True)
    options = ServerOptions(data_dir=data_dir, settings=fast_settings(**settings), single_user=True)
    cluster = Cluster.from_nodes([NodeDef("n0", 2, "gpu"), NodeDef("n1", 2, "gpu")])
    return run_server(_build_with(options, LocalExecutor(), cluster, None))


def nodes_of(placement: list[str]) -> list[str]:
    return sorted(gpu.split("/")[0] for gpu in placement)


def test_a_gang_waits_for_one_node_then_relaxes_to_two_after_waiting(data_dir: Path) -> None:
    # fifo, placement relax, relax.after_s 4. By hand:
    # 1. a, b, c (1 GPU each): consolidate puts each on the tightest node that holds it: a and b
    #    on n0, c on n1. b is cancelled: one GPU is free on each node.
    # 2. w (2 GPUs, two workers of one GPU: each worker runs on one node) fits on no single
    #    node: it waits, though two GPUs are free.
    # 3. When w has waited 4 s, relax takes the fewest nodes anywhere: w starts on one GPU of
    #    each node, not before (a placement that never relaxes leaves it waiting; one that
    #    relaxes at once starts it as it arrives).
    server = two_nodes(data_dir, policy="fifo", placement="relax", relax_after_s=RELAX_AFTER_S)
    try:
        client = api(server.url, admin_token(data_dir))
        a, b, c = (submit(client, name=name, **SLEEPER) for name in "abc")
        placed = {
            job_id: wait_for(client, job_id, ["RUNNING"])["placement"] for job_id in (a, b, c)
        }
        assert [nodes_of(placed[j]) for j in (a, b, c)] == [["n0"], ["n0"], ["n1"]]
        client.post(f"/api/v1/jobs/{b}/cancel")
        wait_until(lambda: job(client, b)["attempt_history"][0]["state"] == "ended", "b gone")

        w = submit(client, name="w", **(SLEEPER | {"gpus": 2, "workers": 2}))
        waiting = considered(client, w)
        assert waiting["status"] == "PENDING"
        assert "locality: needs 2 GPUs on one node; no node has them free" in waiting["reason"]
        assert "(relaxes at t=" in waiting["reason"]

        started = wait_for(client, w, ["RUNNING"], timeout=60)
        waited = started["started_at"] - started["submitted_at"]
        assert RELAX_AFTER_S - 1e-3 <= waited < RELAX_AFTER_S + 10.0  # (epoch seconds' rounding)
        assert nodes_of(started["placement"]) == ["n0", "n1"]
        gpus = set(started["placement"])
        assert not gpus & {g for j in (a, c) for g in placed[j]}
        for job_id in (a, c, w):
            assert job(client, job_id)["status"] == "RUNNING"
            assert job(client, job_id)["preemptions"] == 0
        for job_id in (a, c, w):
            client.post(f"/api/v1/jobs/{job_id}/cancel")
            assert wait_for(client, job_id)["status"] == "CANCELLED"
    finally:
        server.stop()
