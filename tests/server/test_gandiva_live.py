"""Gandiva's packing and migration in `corral up`: real job processes (local executor), a real
SQLite file, HTTP on loopback.

Packing: a waiting job starts on the GPU of a running job when the pair gains, judged from what
the manager measured (each model's steps/s sharing over alone), a pair never measured being tried
once on the prior `packing.unmeasured`; a pair measured to lose is not packed again, and a running
one is split. Migration: a running 1-GPU job is moved (stopped, resumed from its checkpoint on
another node) so that a 2-GPU job gets a whole node.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx

from corral.core.cluster import Cluster, NodeDef
from corral.core.packing import Packing
from corral.exec.local import LocalExecutor
from corral.server.boot import RunningServer, ServerOptions, _build_with
from corral.server.store import ProfileRow, Store
from tests.server.helpers import (
    TRAIN,
    Corral,
    admin_token,
    api,
    fast_settings,
    job,
    run_server,
    start_server,
    submit,
    train_job,
    wait_for,
    wait_until,
)

PAIRJOB = Path(__file__).with_name("pairjob.py")
#: train.py, after printing the CUDA_VISIBLE_DEVICES it was given.
SHOW_VISIBLE = (
    "import os, runpy, sys; print('visible=' + os.environ['CUDA_VISIBLE_DEVICES'], flush=True); "
    f"sys.argv = [{str(TRAIN)!r}]; runpy.run_path({str(TRAIN)!r}, run_name='__main__')"
)
#: Read progress often and fold measurements every second, so that pairs are measured quickly.
MEASURING = {"progress_check_s": 0.1, "profile_fold_s": 1.0}


def packing_server(data_dir: Path, gpus: int, **options: Any) -> RunningServer:
    return start_server(
        data_dir, gpus=gpus, policy="fifo", stages=["packing"], **(MEASURING | options)
    )


def shown_train(name: str, model: str) -> dict[str, Any]:
    return train_job(name, 100000, 0.02, model=model) | {
        "command": [sys.executable, "-c", SHOW_VISIBLE]
    }


def pair_job(name: str, model: str, **env: str) -> dict[str, Any]:
    return {
        "name": name,
        "gpus": 1,
        "model": model,
        "command": [sys.executable, str(PAIRJOB)],
        "env": env,
        "grace_seconds": 5,
    }


def stdout(data_dir: Path, job_id: str, attempt: int) -> str:
    path = data_dir / "jobs" / job_id / f"attempt-{attempt}" / "rank-0.stdout"
    return path.read_text() if path.exists() else ""


def visible(data_dir: Path, job_id: str, attempt: int = 1) -> str | None:
    for line in stdout(data_dir, job_id, attempt).splitlines():
        if line.startswith("visible="):
            return line.removeprefix("visible=")
    return None


def events(found: dict[str, Any], kind: str) -> list[str]:
    return [e["message"] for e in found["events"] if e["kind"] == kind]


def profiles(client: httpx.Client) -> dict[tuple[str, str], dict[str, Any]]:
    return {(p["model"], p["colocated"]): p for p in client.get("/api/v1/profiles").json()}


def packing_counters(server: RunningServer) -> dict[str, int]:
    with server.manager.lock:
        counters = server.manager.scheduler.counters()
    return {k: counters[k] for k in ("preemptions", "packed_pairs", "unpacked_pairs")}


def test_a_waiting_job_packs_on_a_running_jobs_gpu_and_both_are_measured_as_sharing(
    data_dir: Path,
) -> None:
    # Two GPUs, fifo, packing; nothing measured, so every pair is unmeasured and tried once at
    # the prior 0.6 + 0.6 = 1.2 > 1.1. h1 (alpha) and h2 (beta) take the two GPUs; g (gamma)
    # cannot be placed nor preempt (fifo): it packs, on the host that arrived first among equal
    # pairs, h1. Both then run on h1's GPU, their processes given the same CUDA_VISIBLE_DEVICES.
    # Measurements are folded every 30 s here (the default), so what is stored below was folded
    # when the shapes changed: h1's rate alone when g joined it, the pair's rates sharing when g
    # left.
    server = packing_server(data_dir, 2, profile_fold_s=30.0)
    try:
        client = api(server.url, admin_token(data_dir))
        h1 = submit(client, **shown_train("h1", "alpha"))
        h2 = submit(client, **shown_train("h2", "beta"))
        wait_for(client, h2, ["RUNNING"])
        wait_until(lambda: (job(client, h1)["progress"] or {}).get("steps_per_s"), "h1's rate")
        g = submit(client, **shown_train("g", "gamma"))
        running = wait_for(client, g, ["RUNNING"])
        host = job(client, h1)
        assert host["status"] == "RUNNING"
        assert running["placement"] == host["placement"] != job(client, h2)["placement"]
        seen = wait_until(
            lambda: (v := [visible(data_dir, j) for j in (h1, g)]) and all(v) and v,
            "both jobs' CUDA_VISIBLE_DEVICES",
        )
        assert seen[0] == seen[1] != visible(data_dir, h2)
        (started,) = events(job(client, g), "started")
        assert started == f"attempt 1 started on {host['placement'][0]}, sharing with job {h1}"
        # h1's time alone was folded under its shape alone as g joined.
        assert ("alpha", "") in profiles(client)
        # The core's speeds: each at 0.6 of alone on the prior, recorded (nothing to carry out).
        for job_id in (h1, g):
            assert events(job(client, job_id), "speed")[-1].startswith("speed 0.60")
        # The cluster view shows both jobs on the GPU (`job` keeps naming one, as before).
        nodes = client.get("/api/v1/cluster").json()["nodes"]
        gpus = [gpu for node in nodes for gpu in node["gpus"]]
        (shared,) = [gpu for gpu in gpus if len(gpu["jobs"]) == 2]
        assert sorted(j["job"] for j in shared["jobs"]) == sorted([h1, g])
        assert shared["job"] in (h1, g)
        assert [[j["job"] for j in gpu["jobs"]] for gpu in gpus if gpu["job"] == h2] == [[h2]]
        # Some seconds of sharing (g reports from its step 1; h1 is measured from then on).
        wait_until(lambda: (job(client, g)["progress"] or {}).get("step", 0) >= 150, "g's steps")
        assert packing_counters(server) == {
            "preemptions": 0,
            "packed_pairs": 1,
            "unpacked_pairs": 0,
        }
        client.post(f"/api/v1/jobs/{g}/cancel")
        assert wait_for(client, g)["status"] == "CANCELLED"
        # Both rates while sharing are stored under the colocated shapes as g left; h1 runs on
        # alone, at its speed alone. gamma was never measured alone.
        found = wait_until(
            lambda: (
                (p := profiles(client)).keys() >= {("gamma", "alpha"), ("alpha", "gamma")} and p
            ),
            "the pair's measurements",
        )
        assert ("gamma", "") not in found
        for shape in (("gamma", "alpha"), ("alpha", "gamma")):
            assert found[shape]["steps_per_s"] > 0 and found[shape]["runs"] == 1
        wait_until(
            lambda: events(job(client, h1), "speed")[-1].startswith("speed 1.00"), "h1 alone"
        )
        listed = client.get("/api/v1/profiles").json()
        assert {p["colocated"] for p in listed} == {"", "alpha", "gamma"}
        for job_id in (h1, h2):
            client.post(f"/api/v1/jobs/{job_id}/cancel")
            assert wait_for(client, job_id)["status"] == "CANCELLED"
    finally:
        server.stop()


def test_a_pair_measured_to_lose_is_not_packed(data_dir: Path) -> None:
    # The store holds measurements: alpha and beta make 40 steps/s each alone on one GPU and 10
    # each while they share one: 0.25 + 0.25 = 0.5, not above 1.1. On one GPU, h (alpha) runs
    # and g (beta) waits: the round judges the pair by its measurement, not the prior.
    data_dir.mkdir(parents=True)
    store = Store(Store.sqlite_url(data_dir))
    try:
        for model, colocated, rate in (
            ("alpha", "", 40.0),
            ("beta", "", 40.0),
            ("alpha", "beta", 10.0),
            ("beta", "alpha", 10.0),
        ):
            store.save_profile(ProfileRow(model, "gpu", 1, 1, colocated, rate, None, 60.0, 1, 0.0))
    finally:
        store.close()
    server = packing_server(data_dir, 1)
    try:
        client = api(server.url, admin_token(data_dir))
        h = submit(client, **train_job("h", 100000, 0.02, model="alpha"))
        wait_for(client, h, ["RUNNING"])
        g = submit(client, **train_job("g", 100000, 0.02, model="beta"))
        waiting = wait_until(
            lambda: (found := job(client, g))["reason"].startswith("PENDING") and found,
            "g considered by a round",
        )
        assert waiting["status"] == "PENDING" and waiting["attempts"] == 0
        assert packing_counters(server)["packed_pairs"] == 0
        for job_id in (h, g):
            client.post(f"/api/v1/jobs/{job_id}/cancel")
            assert wait_for(client, job_id)["status"] == "CANCELLED"
    finally:
        server.stop()


def test_a_running_pair_measured_to_lose_is_split_and_not_packed_again(data_dir: Path) -> None:
    # One GPU, fifo, packing with threshold 1.5 and prior 0.8 (1.6: an unmeasured pair is tried).
    # `victim` steps every 0.02 s, but every 0.5 s while the marker file exists; `intruder`
    # creates it while it runs. By hand:
    # 1. i1 (intruder) runs alone and ends: intruder alone is measured (about 50 steps/s).
    # 2. v (victim) runs alone: victim alone is measured (about 50 steps/s) when i2 joins it.
    # 3. i2 (intruder) cannot be placed, victim+intruder is unmeasured: it packs on v's GPU at
    #    the prior. v slows down 25 times: sharing, victim makes ~0.04 of alone and intruder
    #    about 1: ~1.04, at or below 1.5 once measured (folded every second).
    # 4. The next round splits the pair: i2 is stopped ("unpacked"), v runs at its speed alone,
    #    and i2 waits: the pair is measured to lose, so it is not packed again.
    # 5. v is cancelled: i2 runs alone, resumed from its checkpoint.
    marker = data_dir.parent / "intruder-is-on-the-gpu"
    server = packing_server(data_dir, 1, packing_threshold=1.5, packing_unmeasured=0.8)
    try:
        client = api(server.url, admin_token(data_dir))
        i1 = submit(client, **pair_job("i1", "intruder", TRAIN_STEPS="100", MARK=str(marker)))
        assert wait_for(client, i1)["status"] == "SUCCEEDED"
        assert ("intruder", "") in profiles(client)
        v = submit(client, **pair_job("v", "victim", SLOW_WHILE=str(marker)))
        wait_until(lambda: (job(client, v)["progress"] or {}).get("steps_per_s"), "v's rate")
        i2 = submit(client, **pair_job("i2", "intruder", MARK=str(marker)))
        wait_for(client, i2, ["RUNNING"])
        assert job(client, i2)["placement"] == job(client, v)["placement"]

        def split() -> dict[str, Any] | None:
            found = job(client, i2)
            first = found["attempt_history"][0]
            return found if first["outcome"] == "unpacked" and first["state"] == "ended" else None

        found = wait_until(split, "the pair split")
        measured = profiles(client)
        together = (
            measured[("victim", "intruder")]["steps_per_s"]
            / measured[("victim", "")]["steps_per_s"]
            + measured[("intruder", "victim")]["steps_per_s"]
            / measured[("intruder", "")]["steps_per_s"]
        )
        assert together <= 1.5
        (unpacked,) = events(found, "unpacked")
        assert unpacked.startswith(f"unpacked from job {v}: sharing, they ran at ")
        assert unpacked.endswith("not above the packing threshold 1.5")
        # The end of i2's attempt made a round (under the lock, it is over): i2 still waits.
        with server.manager.lock:
            assert server.manager.scheduler.jobs[i2].status.value == "PENDING"
            assert server.manager.scheduler.counters()["packed_pairs"] == 1
            assert server.manager.scheduler.counters()["unpacked_pairs"] == 1
        assert job(client, i2)["status"] == "PENDING"
        assert job(client, v)["status"] == "RUNNING"
        assert events(job(client, v), "speed")[-1].startswith("speed 1.00")
        client.post(f"/api/v1/jobs/{v}/cancel")
        resumed = wait_for(client, i2, ["RUNNING"])
        assert resumed["attempts"] == 2
        wait_until(lambda: "resumed from step" in stdout(data_dir, i2, 2), "i2 resumed")
        client.post(f"/api/v1/jobs/{i2}/cancel")
        assert wait_for(client, i2)["status"] == "CANCELLED"
        assert wait_for(client, v)["status"] == "CANCELLED"
    finally:
        server.stop()


def test_a_packed_pair_is_found_again_after_a_restart(data_dir: Path) -> None:
    # One GPU: h runs, g packs beside it on the prior. The manager stops (its jobs run on) and
    # a new one starts on the same data: it finds both attempts running on the one GPU and takes
    # them back as a pair (g, which started later, the guest), at the prior's speeds; nothing
    # is failed or requeued.
    server = packing_server(data_dir, 1)
    try:
        client = api(server.url, admin_token(data_dir))
        h = submit(client, **train_job("h", 100000, 0.02, model="alpha"))
        wait_for(client, h, ["RUNNING"])
        g = submit(client, **train_job("g", 100000, 0.02, model="beta"))
        wait_for(client, g, ["RUNNING"])
    finally:
        server.stop()
    server = packing_server(data_dir, 1)
    try:
        client = api(server.url, admin_token(data_dir))
        for job_id in (h, g):
            found = job(client, job_id)
            assert (found["status"], found["attempts"]) == ("RUNNING", 1)
            assert events(found, "recovered") == ["attempt 1 found running"]
        with server.manager.lock:
            jobs = server.manager.scheduler.jobs
            packing = server.manager.scheduler.stage("packing")
            assert isinstance(packing, Packing) and packing.partner[g] is jobs[h]
            assert (jobs[h].speed, jobs[g].speed) == (0.6, 0.6)
        (gpu,) = [
            gpu for node in client.get("/api/v1/cluster").json()["nodes"] for gpu in node["gpus"]
        ]
        assert sorted(j["job"] for j in gpu["jobs"]) == sorted([h, g])
        for job_id in (h, g):
            client.post(f"/api/v1/jobs/{job_id}/cancel")
            assert wait_for(client, job_id)["status"] == "CANCELLED"
    finally:
        server.stop()


def two_nodes(data_dir: Path) -> RunningServer:
    """Two nodes of two GPUs, n0 and n1, whose jobs all run on this machine (the local executor
    runs one node's jobs; as logical nodes they are what migration needs: it moves jobs between
    nodes). fifo, consolidate (every job on one node), migration."""
    data_dir.mkdir(parents=True)
    settings = fast_settings(policy="fifo", placement="consolidate", stages=["migration"])
    options = ServerOptions(data_dir=data_dir, settings=settings, single_user=True)
    cluster = Cluster.from_nodes([NodeDef("n0", 2, "gpu"), NodeDef("n1", 2, "gpu")])
    return run_server(_build_with(options, LocalExecutor(), cluster, None))


def test_migration_moves_a_running_job_so_that_a_gang_gets_a_whole_node(data_dir: Path) -> None:
    # By hand: a, b, c (1 GPU each) start: consolidate puts each on the tightest node that fits,
    # a and b on n0, c on n1. b is cancelled: one GPU is free on each node. w (2 GPUs on one
    # node) does not fit; moving a to n1 or c to n0 is one move of one GPU either way, and the
    # node first in order wins: a moves (stopped, its start on n1 waits until its processes are
    # gone), then resumes from its checkpoint there, and w starts on n0's two GPUs.
    server = two_nodes(data_dir)
    try:
        client = api(server.url, admin_token(data_dir))
        a, b, c = (submit(client, **train_job(name, 100000, 0.05)) for name in "abc")
        placed = {
            job_id: wait_for(client, job_id, ["RUNNING"])["placement"] for job_id in (a, b, c)
        }
        assert [p[0].split("/")[0] for p in placed.values()] == ["n0", "n0", "n1"]
        wait_until(lambda: "step 2/" in stdout(data_dir, a, 1), "a's checkpoint")
        client.post(f"/api/v1/jobs/{b}/cancel")
        wait_until(lambda: job(client, b)["attempt_history"][0]["state"] == "ended", "b gone")
        w = submit(client, **train_job("w", 100000, 0.05, gpus=2))
        gang = wait_for(client, w, ["RUNNING"])
        assert sorted(gang["placement"]) == ["n0/0", "n0/1"]
        moved = wait_for(client, a, ["RUNNING"])
        first, second = moved["attempt_history"]
        assert (first["gpus"], first["outcome"], first["state"]) == (placed[a], "migrated", "ended")
        assert second["gpus"][0].startswith("n1/") and second["gpus"] != placed[c]
        assert second["started_at"] >= first["ended_at"]  # never two attempts of a at once
        assert events(moved, "migrated") == [f"migrated to make room for job {w}"]
        assert events(moved, "preempted") == [] and moved["preemptions"] == 0
        wait_until(lambda: "resumed from step" in stdout(data_dir, a, 2), "a resumed")
        step = int(stdout(data_dir, a, 2).split("resumed from step ")[1].split()[0])
        assert step >= 2
        assert job(client, c)["attempts"] == 1  # c stayed where it was
        with server.manager.lock:
            assert server.manager.scheduler.counters()["migrations"] == 1
        for job_id in (a, c, w):
            client.post(f"/api/v1/jobs/{job_id}/cancel")
            assert wait_for(client, job_id)["status"] == "CANCELLED"
    finally:
        server.stop()


def test_corral_up_runs_packing_and_migration(data_dir: Path) -> None:
    # `corral up` itself, as a user starts it: both stages build (packing from the measured
    # profiles, empty at first) and the config it stores says so.
    up = Corral(data_dir, "--gpus", "2", "--stages", "packing,migration")
    try:
        client = up.start()
        config = client.get("/api/v1/config").json()["scheduler"]
        assert config["stages"] == ["packing", "migration"] and config["admission"] == "none"
        assert config["packing"]["unmeasured"] == 0.6
        assert config["packing"]["threshold"] == 1.1
    finally:
        up.stop()
