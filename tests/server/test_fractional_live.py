"""Shares of a GPU live (`gpus: 0.5`): real job processes on a 1-GPU manager placed by FGD.

Every job here waits for a file the test creates before it ends (`go-NAME`), after writing its
environment to its stdout and a file saying that it runs (`ready-NAME`): two jobs that have both
written `ready` while neither was let go ran at the same time, whatever the machine's load.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.core.fragmentation import TaskShape
from corral.core.placement.sharing import Fgd
from corral.server.boot import RunningServer
from tests.server.helpers import (
    Corral,
    admin_token,
    alive,
    api,
    job,
    kill_jobs_of,
    start_server,
    submit,
    wait_for,
    wait_until,
)

GPU_MEMORY_MIB = 16384  # the declared GPU's memory: 16 GiB
KEYS = [
    "CUDA_VISIBLE_DEVICES",
    "CORRAL_GPU_SHARE",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
]
WAITER = f"""\
import json, os, pathlib, signal, time
if os.environ.get("IGNORE_TERM"):  # a job slow to stop: it leaves only when let go
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print(json.dumps({{key: os.environ.get(key) for key in {KEYS!r}}} | {{"pid": os.getpid()}}),
      flush=True)
marks, name = pathlib.Path(os.environ["MARKS"]), os.environ["MARK"]
(marks / ("ready-" + name)).touch()
while not (marks / ("go-" + name)).exists():
    time.sleep(0.02)
"""
SHARE_ENV = {
    "CUDA_VISIBLE_DEVICES": "0",
    "CORRAL_GPU_SHARE": "0.5",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8192M",  # half of 16 GiB, device 0 as the job sees it
}


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "corral"
    marks = tmp_path / "marks"
    marks.mkdir()
    try:
        yield directory
    finally:
        for waiting in marks.glob("ready-*"):  # let every job go, then kill what is left
            (marks / waiting.name.replace("ready-", "go-", 1)).touch()
        kill_jobs_of(directory)


@pytest.fixture
def marks(data_dir: Path) -> Path:
    return data_dir.parent / "marks"


@pytest.fixture
def server(data_dir: Path) -> Iterator[RunningServer]:
    """One GPU of 16 GiB, FGD, FIFO (nothing is preempted: each wait below is the GPU's)."""
    running = start_server(
        data_dir, gpus=1, placement="fgd", policy="fifo", gpu_memory_mib={"gpu": GPU_MEMORY_MIB}
    )
    try:
        yield running
    finally:
        running.stop()


def waiter(marks: Path, name: str, gpus: float = 0.5, **fields: Any) -> dict[str, Any]:
    env = {"MARKS": str(marks), "MARK": name} | fields.pop("env", {})
    return {
        "name": name,
        "gpus": gpus,
        "command": [sys.executable, "-c", WAITER],
        "env": env,
        "grace_seconds": 60,
        **fields,
    }


def ready(marks: Path, *names: str) -> None:
    for name in names:
        wait_until(lambda n=name: (marks / f"ready-{n}").exists(), f"job {name} to run")


def let_go(marks: Path, name: str) -> None:
    (marks / f"go-{name}").touch()


def seen_env(data_dir: Path, job_id: str, attempt: int = 1) -> dict[str, Any]:
    stdout = data_dir / "jobs" / job_id / f"attempt-{attempt}" / "rank-0.stdout"
    wait_until(lambda: stdout.is_file() and stdout.read_text().strip(), f"job {job_id}'s env")
    return dict(json.loads(stdout.read_text().splitlines()[0]))


def considered(client: httpx.Client, job_id: str) -> str:
    """Wait until a scheduling round has placed the waiting job in the queue; its reason."""
    return str(
        wait_until(
            lambda: (
                (found := job(client, job_id))["status"] == "PENDING"
                and found["reason"].startswith("PENDING, position")
                and "not yet considered" not in found["reason"]
                and found["reason"]
            ),
            f"job {job_id} to be considered by a round",
        )
    )


def attempt(client: httpx.Client, job_id: str, number: int = 1) -> dict[str, Any]:
    return dict(job(client, job_id)["attempt_history"][number - 1])


def gpu_view(client: httpx.Client) -> dict[str, Any]:
    (node,) = client.get("/api/v1/cluster").json()["nodes"]
    (gpu,) = node["gpus"]
    return dict(gpu)


def test_two_halves_share_the_gpu_a_third_waits_and_a_whole_gpu_waits_for_both(
    server: RunningServer, data_dir: Path, marks: Path
) -> None:
    client = api(server.url, admin_token(data_dir))
    first, second = (submit(client, **waiter(marks, name)) for name in ("a", "b"))
    for job_id in (first, second):
        wait_for(client, job_id, ["RUNNING"])
    ready(marks, "a", "b")  # both run at once: neither may end before the test lets it go
    for job_id in (first, second):
        env = seen_env(data_dir, job_id)
        assert {key: env[key] for key in KEYS} == SHARE_ENV
    assert seen_env(data_dir, first)["pid"] != seen_env(data_dir, second)["pid"]
    events = [e["message"] for e in job(client, first)["events"]]
    assert any(m.endswith("/0 (0.5 of the GPU)") for m in events), events

    gpu = gpu_view(client)  # both jobs on the one GPU; `job` (the first) as before
    assert [(j["job"], j["share"], j["stopping"]) for j in gpu["jobs"]] == [
        (first, 0.5, False),
        (second, 0.5, False),
    ]
    assert (gpu["job"], gpu["busy"], gpu["share"]) == (first, True, 1.0)
    assert [j["job_name"] for j in gpu["jobs"]] == ["a", "b"]

    third = submit(client, **waiter(marks, "c"))
    whole = submit(client, **waiter(marks, "d", gpus=1))
    considered(client, third)  # the GPU's 1000 milli are taken
    assert job(client, whole)["status"] == "PENDING"

    let_go(marks, "a")
    assert wait_for(client, first)["status"] == "SUCCEEDED"
    wait_for(client, third, ["RUNNING"])  # in a's place, beside b
    ready(marks, "c")
    assert attempt(client, third)["started_at"] >= attempt(client, first)["ended_at"]
    # The round that started c found no whole GPU for d; none comes free while b and c run.
    assert job(client, whole)["status"] == "PENDING"

    let_go(marks, "b")
    assert wait_for(client, second)["status"] == "SUCCEEDED"
    assert job(client, whole)["status"] == "PENDING"  # c still holds half of the GPU
    assert [j["job"] for j in gpu_view(client)["jobs"]] == [third]
    assert gpu_view(client)["share"] == 0.5

    let_go(marks, "c")
    assert wait_for(client, third)["status"] == "SUCCEEDED"
    wait_for(client, whole, ["RUNNING"])
    ready(marks, "d")
    started = attempt(client, whole)["started_at"]
    assert started >= attempt(client, second)["ended_at"]
    assert started >= attempt(client, third)["ended_at"]
    env = seen_env(data_dir, whole)  # a whole GPU: no share, no MPS limits
    assert {key: env[key] for key in KEYS} == dict.fromkeys(KEYS, None) | {
        "CUDA_VISIBLE_DEVICES": "0"
    }
    gpu = gpu_view(client)
    assert [(j["job"], j["share"]) for j in gpu["jobs"]] == [(whole, 1.0)]
    let_go(marks, "d")
    assert wait_for(client, whole)["status"] == "SUCCEEDED"
    assert gpu_view(client)["jobs"] == [] and gpu_view(client)["share"] == 0


def test_a_share_waits_for_a_stopping_attempt_on_its_gpu(
    server: RunningServer, data_dir: Path, marks: Path
) -> None:
    client = api(server.url, admin_token(data_dir))
    slow = submit(client, **waiter(marks, "slow", env={"IGNORE_TERM": "1"}))
    beside = submit(client, **waiter(marks, "beside"))
    for job_id in (slow, beside):
        wait_for(client, job_id, ["RUNNING"])
    ready(marks, "slow", "beside")
    pid = seen_env(data_dir, slow)["pid"]
    assert client.post(f"/api/v1/jobs/{slow}/cancel").json()["status"] == "CANCELLED"
    # The core gave the cancelled half back at once; its process ignores SIGTERM and stays.
    late = submit(client, **waiter(marks, "late"))
    wait_until(
        lambda: job(client, late)["reason"].startswith("starting: waiting for a stopped job"),
        "the new share's start to wait for the stopping attempt",
    )
    assert alive(pid) and not (marks / "ready-late").exists()
    gpu = gpu_view(client)
    assert [(j["job"], j["stopping"]) for j in gpu["jobs"]] == [(beside, False), (slow, True)]
    assert job(client, late)["status"] == "PENDING" and job(client, late)["attempts"] == 0

    let_go(marks, "slow")  # its process leaves: the GPU's half is free for real
    wait_for(client, late, ["RUNNING"])
    ready(marks, "late")
    assert attempt(client, late)["started_at"] >= attempt(client, slow)["ended_at"]
    assert attempt(client, slow)["outcome"] == "cancelled"
    assert sorted(j["job"] for j in gpu_view(client)["jobs"]) == sorted([beside, late])
    for name in ("beside", "late"):
        let_go(marks, name)
    for job_id in (beside, late):
        assert wait_for(client, job_id)["status"] == "SUCCEEDED"


def test_gpu_memory_sizes_the_share_and_its_mps_limits(
    server: RunningServer, data_dir: Path, marks: Path
) -> None:
    client = api(server.url, admin_token(data_dir))
    # 6 GiB of a 16 GiB GPU is 0.375 of it, more than the 0.25 asked for
    sized = submit(client, **waiter(marks, "sized", gpus=0.25, gpu_memory="6GiB"))
    wait_for(client, sized, ["RUNNING"])
    env = seen_env(data_dir, sized)
    assert {key: env[key] for key in KEYS} == {
        "CUDA_VISIBLE_DEVICES": "0",
        "CORRAL_GPU_SHARE": "0.375",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "37",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=6144M",
    }
    assert gpu_view(client)["jobs"][0]["share"] == 0.375
    assert job(client, sized)["spec"]["gpu_memory"] == 6144  # stored in MiB
    let_go(marks, "sized")
    assert wait_for(client, sized)["status"] == "SUCCEEDED"


def test_fgd_runs_live_and_learns_its_target_workload_from_the_jobs(
    server: RunningServer, data_dir: Path, marks: Path
) -> None:
    placement = server.manager.scheduler.placement
    assert isinstance(placement, Fgd)
    one_gpu = TaskShape(cpu_milli=0, memory_mib=0, num_gpu=1, gpu_milli=1000)
    assert placement.workload.types == ((one_gpu, 1),)  # before any job: one-GPU jobs
    client = api(server.url, admin_token(data_dir))
    ids = [submit(client, **waiter(marks, name)) for name in ("w1", "w2")]
    half = TaskShape(cpu_milli=0, memory_mib=0, num_gpu=1, gpu_milli=500)
    assert placement.workload.types == ((half, 2),)  # learnt as they were queued
    for name in ("w1", "w2"):
        let_go(marks, name)
    for job_id in ids:
        assert wait_for(client, job_id)["status"] == "SUCCEEDED"
    server.manager.resync()  # rebuilt from the store: the jobs it was given are still there
    rebuilt = server.manager.scheduler.placement
    assert isinstance(rebuilt, Fgd) and rebuilt is not placement
    assert rebuilt.workload.types == ((half, 2),)


def test_shares_running_are_found_again_after_a_restart(data_dir: Path, marks: Path) -> None:
    settings: dict[str, Any] = {"placement": "fgd", "policy": "fifo"}
    first = start_server(data_dir, gpus=1, **settings)
    try:
        client = api(first.url, admin_token(data_dir))
        ids = [submit(client, **waiter(marks, name)) for name in ("r1", "r2")]
        for job_id in ids:
            wait_for(client, job_id, ["RUNNING"])
        ready(marks, "r1", "r2")
    finally:
        first.stop()  # the jobs keep running
    again = start_server(data_dir, gpus=1, **settings)
    try:
        client = api(again.url, admin_token(data_dir))
        assert [job(client, j)["status"] for j in ids] == ["RUNNING", "RUNNING"]
        assert sorted(j["job"] for j in gpu_view(client)["jobs"]) == sorted(ids)
        assert again.manager.cluster.gpu_milli_free(0) == 0  # both halves held again
        third = submit(client, **waiter(marks, "r3"))
        considered(client, third)
        let_go(marks, "r1")
        wait_for(client, third, ["RUNNING"])
        ready(marks, "r3")
        for name in ("r2", "r3"):
            let_go(marks, name)
        for job_id in [*ids, third]:
            assert wait_for(client, job_id)["status"] == "SUCCEEDED"
        for job_id in ids:  # found running, then ended: one attempt each
            assert job(client, job_id)["attempts"] == 1
    finally:
        again.stop()


REFUSED = [
    ({"gpus": 0}, "gpus: must be a positive integer"),
    (
        {"gpus": 1.5},
        "gpus: must be a positive integer, or a share of one GPU between 0 and 1 (got 1.5)",
    ),
    (
        {"gpus": 0.0001},
        "gpus: a share of one GPU has at most 3 decimals (0.001 to 0.999), got 0.0001",
    ),
    ({"gpus": 0.5, "workers": 2}, "workers: must be 1 for a share of one GPU (gpus 0.5)"),
    (
        {"gpus": 0.5, "gpu_memory": "8GB"},
        "gpu_memory: must be a size such as 8GiB or 512MiB, or a whole number of MiB (got '8GB')",
    ),
    (
        {"gpus": 0.5, "gpu_memory": "8 gigs"},
        "gpu_memory: must be a size such as 8GiB or 512MiB, or a whole number of MiB "
        "(got '8 gigs')",
    ),
    (
        {"gpus": 0.5, "gpu_memory": "0.5MiB"},
        "gpu_memory: must be a whole number of MiB (got '0.5MiB')",
    ),
    ({"gpus": 0.5, "gpu_memory": 0}, "gpu_memory: must be at least 1MiB"),
    (
        {"gpus": 0.5, "gpu_memory": "20GiB"},
        "gpu_memory: asks for 20GiB but a GPU of type gpu has 16GiB",
    ),
    ({"gpus": 2}, "gpus: asks for 2 GPUs but the cluster has only 1 GPU"),
]


def test_bad_shares_are_refused_in_one_line_and_nothing_is_stored(
    server: RunningServer, data_dir: Path
) -> None:
    client = api(server.url, admin_token(data_dir))
    for fields, message in REFUSED:
        response = client.post("/api/v1/jobs", json={"name": "x", "command": "true", **fields})
        assert (response.status_code, response.json()) == (422, {"detail": message}), fields
    assert client.get("/api/v1/jobs").json() == []
    assert server.manager.scheduler.jobs == {}


def test_shares_need_a_sharing_placement_and_gpu_memory_a_known_memory(data_dir: Path) -> None:
    server = start_server(data_dir, gpus=1)  # relax: whole GPUs only; the memory not known
    try:
        client = api(server.url, admin_token(data_dir))
        for fields, message in [
            (
                {"gpus": 0.5},
                "gpus: a share of one GPU (0.5) needs a placement that shares GPUs (best-fit, "
                "fgd, gpu-packing, gpu-packing-cpu, random-fit); this manager runs placement "
                "relax",
            ),
            (
                {"gpus": 1, "gpu_memory": "8GiB"},
                "gpu_memory: the memory of GPU type gpu is not known here (declare it: corral "
                "up --gpu-memory SIZE)",
            ),
        ]:
            response = client.post("/api/v1/jobs", json={"name": "x", "command": "true", **fields})
            assert (response.status_code, response.json()) == (422, {"detail": message})
        assert client.get("/api/v1/jobs").json() == []
    finally:
        server.stop()


def test_corral_up_runs_fgd_with_the_declared_gpu_memory(data_dir: Path, marks: Path) -> None:
    corral = Corral(
        data_dir, "--gpus", "1", "--gpu-memory", "16G", "--placement", "fgd", "--policy", "fifo"
    )
    try:
        client = corral.start()
        job_id = submit(client, **waiter(marks, "cli"))
        wait_for(client, job_id, ["RUNNING"])
        env = seen_env(data_dir, job_id)
        assert {key: env[key] for key in KEYS} == SHARE_ENV
        let_go(marks, "cli")
        assert wait_for(client, job_id)["status"] == "SUCCEEDED"
    finally:
        corral.stop()
