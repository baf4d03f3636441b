"""Everything a Ray worker starts ends with it (the guard's container: corral/exec/guard.py), and
the worker's capped log comes across to the manager with its holes. Against a real one-node Ray
cluster on loopback."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from corral.exec import contain, logcap
from corral.exec.local import AttemptEnded, AttemptLaunch, WorkerLaunch, placement_worker_envs
from corral.exec.ray import RayExecutor, actor_name
from tests.exec.contain_helpers import (
    escape,
    job_env,
    job_script,
    marked,
    mechanism_or_skip,
    wait_files,
    wait_until_none,
)
from tests.exec.ray_cluster import RayCluster, executor_on


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    ray_cluster = RayCluster(node_names=("a",))
    try:
        ray_cluster.start()
        yield ray_cluster
    finally:
        ray_cluster.stop()


@pytest.fixture(scope="module")
def executor(cluster: RayCluster) -> Iterator[RayExecutor]:
    with executor_on(cluster) as ray_executor:
        yield ray_executor


def launch_one(
    executor: RayExecutor, tmp_path: Path, job_id: str, script: str, env: dict[str, str]
) -> AttemptLaunch:
    checkpoint = tmp_path / "checkpoint"
    worker_env = placement_worker_envs(job_id, 1, [("a", [0])], checkpoint, env)[0]
    launch = AttemptLaunch(
        job_id=job_id,
        attempt=1,
        workers=[WorkerLaunch(0, ["/bin/sh", "-c", script], worker_env, "a")],
        workdir=str(tmp_path),
        stop_signal=signal.SIGTERM,
        grace_s=0.5,
        attempt_dir=tmp_path / "attempt-1",
        checkpoint_dir=checkpoint,
    )
    executor.launch(launch)
    return launch


def wait_ended(executor: RayExecutor, timeout: float = 60.0) -> AttemptEnded:
    deadline = time.monotonic() + timeout
    while not (ended := executor.poll()):
        assert time.monotonic() < deadline, f"no attempt ended within {timeout} s"
        time.sleep(0.05)
    assert len(ended) == 1, ended
    return ended[0]


@pytest.mark.parametrize("end", ["stop", "success"])
@pytest.mark.parametrize("kind", ["setsid", "double-fork", "torchrun"])
def test_nothing_a_ray_worker_started_outlives_it(
    executor: RayExecutor, tmp_path: Path, mark: str, kind: str, end: str
) -> None:
    ready = tmp_path / "ready"
    ready.mkdir()
    start_escape, names = escape(kind, tmp_path / "scripts")
    job_id = f"{kind}-{end}"
    launch_one(
        executor, tmp_path, job_id, job_script(start_escape, names, end), job_env(mark, ready)
    )
    wait_files(ready, names)
    assert marked(mark)
    if end == "success":
        (ready / "go").touch()  # the worker exits 0; what it started lives on
    else:
        executor.stop(job_id, 1)
    ended = wait_ended(executor)
    assert marked(mark) == []  # the guard ended them all before the worker's end was known
    assert ended.leftover == 0
    if end == "stop":
        assert ended.stopped
    else:
        assert (ended.exit_code, ended.reason) == (0, "exit code 0")


@pytest.mark.parametrize("mechanism", ["cgroup1", "subreaper"])
def test_each_mechanism_ends_a_ray_workers_escapes(
    executor: RayExecutor, tmp_path: Path, mark: str, mechanism: str
) -> None:
    mechanism_or_skip(mechanism)
    ready = tmp_path / "ready"
    ready.mkdir()
    start_escape, names = escape("setsid", tmp_path / "scripts")
    executor.containment = mechanism
    try:
        script = job_script(start_escape, names, "stop")
        launch_one(executor, tmp_path, f"m-{mechanism}", script, job_env(mark, ready))
    finally:
        executor.containment = None
    wait_files(ready, names)
    executor.stop(f"m-{mechanism}", 1)
    ended = wait_ended(executor)
    assert ended.stopped and marked(mark) == []


def test_a_stop_that_outlasts_its_grace_kills_everything(
    executor: RayExecutor, tmp_path: Path, mark: str
) -> None:
    # The worker ignores SIGTERM: after the grace the actor asks its guard to kill it all (a
    # SIGKILL to the group would kill the guard before it could end the escaped process).
    ready = tmp_path / "ready"
    ready.mkdir()
    start_escape, names = escape("setsid", tmp_path / "scripts")
    script = f"trap '' TERM\n{start_escape}\nwhile :; do sleep 0.1; done\n"
    launch_one(executor, tmp_path, "stubborn", script, job_env(mark, ready))
    wait_files(ready, names)
    executor.stop("stubborn", 1)
    ended = wait_ended(executor)
    assert (ended.signal, ended.stopped) == (signal.SIGKILL, True)
    assert ended.reason == "stopped: killed by SIGKILL after 0.5 s grace"
    assert marked(mark) == []


def test_a_workers_escapes_die_with_its_actor(
    executor: RayExecutor, tmp_path: Path, mark: str
) -> None:
    ready = tmp_path / "ready"
    ready.mkdir()
    start_escape, names = escape("setsid", tmp_path / "scripts")
    script = job_script(start_escape, names, "stop")
    launch_one(executor, tmp_path, "orphan", script, job_env(mark, ready))
    wait_files(ready, names)
    ray.kill(ray.get_actor(actor_name("orphan", 1, 0), namespace="corral"), no_restart=True)
    ended = wait_ended(executor)
    assert ended.reason.startswith("lost: rank 0")
    # The guard saw its actor go (its control pipe ended) and ends the job on its own.
    wait_until_none(mark)


CAP = 2 << 20
LINE = b"corral-flood\n"
FLOOD_BYTES = len(LINE) * (16 << 20)


def test_a_capped_log_comes_across_with_its_holes(executor: RayExecutor, tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint"
    env = placement_worker_envs("flood", 1, [("a", [0])], checkpoint)[0]
    script = f"yes corral-flood | head -c {FLOOD_BYTES}; echo THE-END"
    launch = AttemptLaunch(
        "flood",
        1,
        [WorkerLaunch(0, ["/bin/sh", "-c", script], env, "a")],
        str(tmp_path),
        signal.SIGTERM,
        0.5,
        tmp_path / "attempt-1",
        checkpoint_dir=checkpoint,
        log_cap_bytes=CAP,
    )
    executor.launch(launch)
    ended = wait_ended(executor, timeout=120)
    assert ended.exit_code == 0
    copy = launch.attempt_dir / "rank-0.stdout"
    info = os.stat(copy)
    # The same offsets as on the node: what the cap dropped is a hole here too.
    assert info.st_size == FLOOD_BYTES + len("THE-END\n")
    assert info.st_blocks * 512 <= 3 * CAP
    with open(copy, "rb") as handle:
        assert logcap.data_start(handle.fileno()) > 0
        # At least half the cap is kept whole at the end, here as on the node.
        tail = os.pread(handle.fileno(), CAP // 2, info.st_size - CAP // 2)
    lines = tail.split(b"\n")
    assert set(lines[1:-2]) == {b"corral-flood"} and lines[-2:] == [b"THE-END", b""]


HOG = "chunks = [bytearray(8 << 20) for _ in range(64)]\nprint('survived')\n"


def test_a_ray_worker_beyond_its_memory_fails_out_of_memory(
    executor: RayExecutor, tmp_path: Path
) -> None:
    # The guard gives the worker's container the spec's memory (each worker's), where the
    # node's cgroups allow: as root here.
    if contain.limits_unavailable().get("memory"):
        pytest.skip(contain.limits_unavailable()["memory"])
    checkpoint = tmp_path / "checkpoint"
    env = placement_worker_envs("hog", 1, [("a", [0])], checkpoint)[0]
    launch = AttemptLaunch(
        "hog",
        1,
        [WorkerLaunch(0, [sys.executable, "-c", HOG], env, "a")],
        str(tmp_path),
        signal.SIGTERM,
        0.5,
        tmp_path / "attempt-1",
        checkpoint_dir=checkpoint,
        memory_bytes=64 << 20,
        pids_max=64,
    )
    executor.launch(launch)
    ended = wait_ended(executor, timeout=120)
    assert ended.reason == (
        "out of memory: the kernel killed a process at the worker's memory limit 64 MiB; "
        "killed by SIGKILL (rank 0)"
    ), ended
    stdout = launch.attempt_dir / "rank-0.stdout"  # (not made when there was no output)
    assert not stdout.exists() or "survived" not in stdout.read_text()
