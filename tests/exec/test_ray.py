"""The Ray executor against a real two-node Ray cluster (2 declared GPUs per node) on this
machine's loopback."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from corral.exec.local import (
    AttemptEnded,
    AttemptLaunch,
    WorkerLaunch,
    launch_argv,
    placement_worker_envs,
)
from corral.exec.ray import RayExecutor, actor_name
from tests.exec.ray_cluster import RayCluster, executor_on, processes_of_job

PYTHON = sys.executable
ENV_DUMP = "import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], 'w'))"
# Writes a "ready" file once its SIGTERM handler is in place, then runs until stopped (however
# long a loaded machine makes the test take).
TRAP = (
    "import signal, sys, time, pathlib\n"
    "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
    "pathlib.Path(sys.argv[1]).touch()\n"
    "time.sleep(3600)\n"
)
# Waits (the actors' starts, the workers' ends) on a loaded 2-core machine: generous budgets, the
# waits end as soon as their condition holds.
WAIT_S = 120.0
IGNORE = TRAP.replace("lambda *a: sys.exit(0)", "signal.SIG_IGN")


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    ray_cluster = RayCluster()
    try:
        ray_cluster.start()  # a start that fails stops the nodes it began, and so does stop()
        print(f"ray cluster started in {ray_cluster.started_in_s:.1f} s")
        yield ray_cluster
    finally:
        ray_cluster.stop()


@pytest.fixture(scope="module")
def executor(cluster: RayCluster) -> Iterator[RayExecutor]:
    with executor_on(cluster) as ray_executor:
        yield ray_executor


def make_launch(
    tmp_path: Path,
    argvs: list[list[str]],
    placement: list[tuple[str, list[int]]],
    job_id: str,
    grace_s: float = 0.5,
) -> AttemptLaunch:
    checkpoint = tmp_path / "jobs" / job_id / "checkpoint"
    envs = placement_worker_envs(job_id, 1, placement, checkpoint, {"MY_VAR": "x"})
    return AttemptLaunch(
        job_id=job_id,
        attempt=1,
        workers=[
            WorkerLaunch(rank, argv, envs[rank], placement[rank][0])
            for rank, argv in enumerate(argvs)
        ],
        workdir=str(tmp_path),
        stop_signal=signal.SIGTERM,
        grace_s=grace_s,
        attempt_dir=tmp_path / "jobs" / job_id / "attempt-1",
        checkpoint_dir=checkpoint,
    )


def wait_ended(
    executor: RayExecutor, count: int = 1, timeout: float = WAIT_S
) -> list[AttemptEnded]:
    ended: list[AttemptEnded] = []
    deadline = time.monotonic() + timeout
    while len(ended) < count and time.monotonic() < deadline:
        ended += executor.poll()
        time.sleep(0.1)
    assert len(ended) == count, f"only {len(ended)} of {count} attempts ended"
    return sorted(ended, key=lambda end: end.job_id)


def wait_for(path: Path, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_multi_node_envs_follow_torchrun() -> None:
    envs = placement_worker_envs("7", 2, [("a", [1, 3]), ("a", [0, 2]), ("b", [5, 6])], "/ck")
    assert [env["CUDA_VISIBLE_DEVICES"] for env in envs] == ["1,3,0,2", "1,3,0,2", "5,6"]
    assert [env["CORRAL_LOCAL_GPUS"] for env in envs] == ["0,1", "2,3", "0,1"]
    assert [env["LOCAL_RANK"] for env in envs] == ["0", "1", "0"]
    assert [env["LOCAL_WORLD_SIZE"] for env in envs] == ["2", "2", "1"]
    assert {env["WORLD_SIZE"] for env in envs} == {"3"}
    assert [env["CORRAL_NODE"] for env in envs] == ["a", "a", "b"]


def test_a_torchrun_job_rendezvouses_across_two_ray_nodes(
    executor: RayExecutor, tmp_path: Path
) -> None:
    """torchrun's flags come from each worker's environment as it starts on its node: rank 0's
    node picks MASTER_PORT there, and the two agents (one per node, one process each) meet."""
    script = tmp_path / "seen.py"
    script.write_text(
        "import json, os, sys\n"
        "keys = ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'CUDA_VISIBLE_DEVICES', 'NODE_RANK')\n"
        "seen = {key: os.environ.get(key) for key in keys}\n"
        "json.dump(seen, open(sys.argv[1] + '/seen-' + seen['RANK'] + '.json', 'w'))\n"
    )
    placement = [("a", [1]), ("b", [0])]
    checkpoint = tmp_path / "jobs" / "40" / "checkpoint"
    path = f"{Path(PYTHON).parent}:/usr/bin:/bin"  # torchrun is the test's virtualenv's
    envs = placement_worker_envs(
        "40", 1, placement, checkpoint, {"PATH": path}, launcher="torchrun"
    )
    argv = launch_argv([str(script), str(tmp_path)], "torchrun")
    launch = AttemptLaunch(
        job_id="40",
        attempt=1,
        workers=[WorkerLaunch(rank, argv, envs[rank], placement[rank][0]) for rank in (0, 1)],
        workdir=str(tmp_path),
        stop_signal=signal.SIGTERM,
        grace_s=5,
        attempt_dir=tmp_path / "jobs" / "40" / "attempt-1",
        checkpoint_dir=checkpoint,
    )
    executor.launch(launch)
    (end,) = wait_ended(executor, timeout=240)
    assert (end.exit_code, end.reason) == (0, "exit code 0"), end
    seen = [json.loads((tmp_path / f"seen-{rank}.json").read_text()) for rank in (0, 1)]
    assert seen == [
        {
            "RANK": "0",
            "WORLD_SIZE": "2",
            "LOCAL_RANK": "0",
            "CUDA_VISIBLE_DEVICES": "1",
            "NODE_RANK": "0",
        },
        {
            "RANK": "1",
            "WORLD_SIZE": "2",
            "LOCAL_RANK": "0",
            "CUDA_VISIBLE_DEVICES": "0",
            "NODE_RANK": "1",
        },
    ]


def test_nodes_are_read_from_ray(executor: RayExecutor) -> None:
    nodes = executor.nodes()
    assert [(node.name, node.gpus) for node in nodes] == [("a", 2), ("b", 2)]
    assert nodes[0].node_id != nodes[1].node_id


def test_two_workers_on_two_nodes_get_the_cores_gpus(executor: RayExecutor, tmp_path: Path) -> None:
    # Ray would hand each 1-GPU actor its device 0; the core chose device 1 on node a.
    # Rank 1 fails once rank 0 has written its environment (renamed into place whole): the
    # failure stops rank 0, which on a loaded machine may not have written it yet.
    argvs = [
        [
            "/bin/sh",
            "-c",
            f'{PYTHON} -c "{ENV_DUMP}" {tmp_path}/env-0.tmp && mv {tmp_path}/env-0.tmp {tmp_path}/env-0.json',
        ],
        [
            "/bin/sh",
            "-c",
            f'{PYTHON} -c "{ENV_DUMP}" {tmp_path}/env-1.json; until [ -e {tmp_path}/env-0.json ]; do sleep 0.05; done; exit 3',
        ],
    ]
    launch = make_launch(tmp_path, argvs, [("a", [1]), ("b", [0])], job_id="10")
    executor.launch(launch)
    (end,) = wait_ended(executor)
    assert (end.job_id, end.exit_code, end.stopped) == ("10", 3, False)
    assert end.reason == "exit code 3 (rank 1)"
    envs = [json.loads((tmp_path / f"env-{rank}.json").read_text()) for rank in (0, 1)]
    assert [env["CUDA_VISIBLE_DEVICES"] for env in envs] == ["1", "0"]
    assert [env["RANK"] for env in envs] == ["0", "1"]
    assert {env["WORLD_SIZE"] for env in envs} == {"2"}
    assert [env["LOCAL_RANK"] for env in envs] == ["0", "0"]
    nodes = {node.name: node for node in executor.nodes()}
    assert {env["MASTER_ADDR"] for env in envs} == {nodes["a"].address}
    ports = {env["MASTER_PORT"] for env in envs}
    assert len(ports) == 1 and int(ports.pop()) > 0
    assert [env["MY_VAR"] for env in envs] == ["x", "x"]
    # Each worker ran under the node the core chose: it inherited that node's processes' marker.
    assert [env["CORRAL_TEST_NODE"] for env in envs] == ["a", "b"]
    assert [env["CORRAL_NODE"] for env in envs] == ["a", "b"]
    # What Ray sets for its own workers is not the job's: not the cluster's token least of all.
    for env in envs:
        assert os.environ["RAY_AUTH_TOKEN_PATH"] and "RAY_AUTH_TOKEN_PATH" not in env
        assert not [key for key in env if key.startswith("RAY_")]
        assert "OMP_NUM_THREADS" not in env
    # The actors are gone once the end was reported: their GPUs are Ray's again.
    with pytest.raises(ValueError):
        ray.get_actor(actor_name("10", 1, 0), namespace="corral")


def test_stop_signals_then_kills_after_grace(executor: RayExecutor, tmp_path: Path) -> None:
    trap = make_launch(
        tmp_path, [[PYTHON, "-c", TRAP, str(tmp_path / "ready-20")]], [("a", [0])], job_id="20"
    )
    stubborn = make_launch(
        tmp_path,
        [[PYTHON, "-c", IGNORE, str(tmp_path / "ready-21")]],
        [("b", [1])],
        job_id="21",
        grace_s=0.5,
    )
    executor.launch(trap)
    executor.launch(stubborn)
    wait_for(tmp_path / "ready-20")
    wait_for(tmp_path / "ready-21")
    began = time.monotonic()
    executor.stop("20", 1)
    executor.stop("21", 1)
    executor.stop("21", 1)  # idempotent
    clean, killed = wait_ended(executor, count=2)
    assert (clean.exit_code, clean.signal, clean.stopped) == (0, None, True)
    assert clean.reason == "stopped: exit code 0 after SIGTERM"
    assert (killed.exit_code, killed.signal, killed.stopped) == (None, signal.SIGKILL, True)
    assert killed.reason == "stopped: killed by SIGKILL after 0.5 s grace"
    assert time.monotonic() - began >= 0.5


RESTARTED_MANAGER = textwrap.dedent(
    """
    import sys
    import time
    from pathlib import Path
    from corral.exec.local import AttemptLaunch, WorkerLaunch, placement_worker_envs
    from corral.exec.ray import RayExecutor

    address, tmp, job = sys.argv[1], Path(sys.argv[2]), sys.argv[4]
    executor = RayExecutor(address)
    envs = placement_worker_envs(job, 1, [("a", [0]), ("b", [1])], tmp / "ck")
    ready = [tmp / f"ready-{job}-{r}" for r in (0, 1)]
    workers = [
        WorkerLaunch(r, [sys.executable, "-c", sys.argv[3], str(ready[r])], envs[r], "ab"[r])
        for r in (0, 1)
    ]
    executor.launch(AttemptLaunch(job, 1, workers, str(tmp), 15, 0.5, tmp / "attempt-1"))
    # Dies with its workers running (calls still in flight when a driver exits are dropped).
    while not all(path.exists() for path in ready):
        time.sleep(0.05)
    executor.close()
    """
)


def launch_and_die(cluster: RayCluster, tmp_path: Path, job_id: str) -> None:
    """Another process launches a 2-worker attempt and exits, as a manager that dies would."""
    subprocess.run(
        [PYTHON, "-c", RESTARTED_MANAGER, cluster.address, str(tmp_path), TRAP, job_id],
        check=True,
        timeout=240,  # a new driver's connection to Ray, two actors' starts: slow under load
        capture_output=True,
    )


def test_a_new_executor_finds_a_running_attempt_by_name(
    executor: RayExecutor, cluster: RayCluster, tmp_path: Path
) -> None:
    launch_and_die(cluster, tmp_path, "30")
    assert executor.recover("30", 1, tmp_path / "nowhere") == "never-started"
    assert executor.recover("30", 1, tmp_path / "attempt-1") == "running"
    assert ("30", 1) in executor.active()
    assert executor.poll() == []
    executor.stop("30", 1)
    (end,) = wait_ended(executor)
    assert (end.job_id, end.exit_code, end.stopped) == ("30", 0, True)


def test_many_recoveries_leave_a_workers_actor_able_to_answer(
    executor: RayExecutor, cluster: RayCluster, tmp_path: Path
) -> None:
    # Every executor that recovers an attempt asks each of its actors to wait for the worker's
    # end, and that call holds one of the actor's threads. Were it unbounded, a few restarts
    # would leave no thread to answer state() (recovery then took a busy actor for one that
    # never started, and killed a running gang) or stop().
    launch_and_die(cluster, tmp_path, "31")
    for _ in range(10):
        other = RayExecutor(cluster.address)  # shares this process's connection to Ray
        try:
            assert other.recover("31", 1, tmp_path / "attempt-1") == "running"
        finally:
            other.close()
    assert executor.recover("31", 1, tmp_path / "attempt-1") == "running"
    executor.stop("31", 1)
    (end,) = wait_ended(executor)
    assert (end.job_id, end.exit_code, end.stopped) == ("31", 0, True)


def test_a_gang_whose_rank_0_dies_before_starting_ends_as_lost(
    executor: RayExecutor, tmp_path: Path
) -> None:
    # Rank 0's actor dies before it can pick the gang's port: rank 1's start then fails, and
    # must not leave the attempt waiting for a worker that never runs.
    argvs = [[PYTHON, "-c", TRAP, str(tmp_path / f"ready-{rank}")] for rank in (0, 1)]
    executor.launch(make_launch(tmp_path, argvs, [("a", [0]), ("b", [0])], job_id="40"))
    ray.kill(ray.get_actor(actor_name("40", 1, 0), namespace="corral"), no_restart=True)
    (end,) = wait_ended(executor)
    assert (end.exit_code, end.signal, end.stopped) == (None, None, False)
    assert end.reason.startswith("lost: rank 0")
    assert processes_of_job("40") == []


def test_a_worker_ray_cannot_place_ends_as_lost(
    executor: RayExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("corral.exec.ray.START_TIMEOUT_S", 2.0)
    # Three GPUs on a node that declares two: Ray says at once that it never can.
    launch = make_launch(tmp_path, [[PYTHON, "-c", "pass"]], [("a", [0, 1, 2])], job_id="41")
    executor.launch(launch)
    (end,) = wait_ended(executor)
    assert end.reason.startswith("lost: rank 0 could not start: its start failed (The actor is")
    # One GPU on a node whose two Ray counts as taken (by a worker of another manager, say):
    # Ray would hold the actor back for as long as they are.
    hog = [[PYTHON, "-c", TRAP, str(tmp_path / "ready-43")]]
    executor.launch(make_launch(tmp_path, hog, [("a", [0, 1])], job_id="43"))
    wait_for(tmp_path / "ready-43")
    executor.launch(make_launch(tmp_path, [[PYTHON, "-c", "pass"]], [("a", [0])], job_id="44"))
    (end,) = wait_ended(executor)
    assert end.job_id == "44"
    assert end.reason == "lost: rank 0 could not start: Ray did not place it on node a in 2 s"
    for job_id in ("41", "44"):
        with pytest.raises(ValueError):
            ray.get_actor(actor_name(job_id, 1, 0), namespace="corral")
    executor.stop("43", 1)
    (end,) = wait_ended(executor)
    assert (end.job_id, end.stopped) == ("43", True)


def test_a_big_log_comes_across_whole_and_leaves_the_node(
    executor: RayExecutor, tmp_path: Path
) -> None:
    size = 66 << 20  # more than 64 reads of 1 MiB, the copy's old limit
    write = f"import sys; sys.stdout.buffer.write(b'x' * {size}); print('done', file=sys.stderr)"
    executor.launch(make_launch(tmp_path, [[PYTHON, "-c", write]], [("b", [0])], job_id="42"))
    (end,) = wait_ended(executor, timeout=300)  # 66 MiB copied off the node
    assert end.exit_code == 0
    attempt_dir = tmp_path / "jobs" / "42" / "attempt-1"
    assert (attempt_dir / "rank-0.stdout").stat().st_size == size
    assert (attempt_dir / "rank-0.stderr").read_text() == "done\n"
    node_copies = Path(tempfile.gettempdir()) / "corral-workers"
    assert list(node_copies.glob(f"{actor_name('42', 1, 0)}-*")) == []


def test_a_launch_that_fails_half_way_leaves_no_actor(
    executor: RayExecutor, tmp_path: Path
) -> None:
    # An actor of another run holds rank 1's name: the launch fails there, after rank 0's.
    holder = (
        ray.remote(num_cpus=0)(dict)
        .options(name=actor_name("60", 1, 1), namespace="corral", lifetime="detached")
        .remote()
    )
    argvs = [[PYTHON, "-c", "pass"]] * 2
    with pytest.raises(ValueError):
        executor.launch(make_launch(tmp_path, argvs, [("a", [0]), ("b", [0])], job_id="60"))
    ray.kill(holder, no_restart=True)
    assert ("60", 1) not in executor.active()
    deadline = time.monotonic() + WAIT_S
    while True:  # rank 0's actor is killed (Ray forgets its name soon after)
        try:
            ray.get_actor(actor_name("60", 1, 0), namespace="corral")
        except ValueError:
            break
        assert time.monotonic() < deadline, "rank 0's actor outlived the failed launch"
        time.sleep(0.1)


def test_a_joining_node_is_named_by_its_host_and_racked_by_its_label(
    executor: RayExecutor, cluster: RayCluster, tmp_path: Path
) -> None:
    # Last in the module: it changes the cluster (and puts it back). The node owns two of the
    # machine's GPUs, 6 and 7, as a Ray node started with CUDA_VISIBLE_DEVICES=6,7 does.
    cluster.add_node("c", gpus=2, rack="r9", named=False, devices="6,7")
    try:
        nodes = executor.nodes()
        named = [(node.name, node.gpus, node.rack) for node in nodes if node.name in ("a", "b")]
        assert named == [("a", 2, "rack-0"), ("b", 2, "rack-0")]
        (joined,) = [node for node in nodes if node.name not in ("a", "b")]
        # No corral-node resource: its host's name (a and b, on the same host, declare theirs).
        assert joined.name == socket.gethostname().split(".")[0]
        assert (joined.gpus, joined.gpu_type, joined.rack) == (2, "gpu", "r9")
        # The core's device 1 on that node is the machine's GPU 7.
        argv = [PYTHON, "-c", ENV_DUMP, str(tmp_path / "env.json")]
        executor.launch(make_launch(tmp_path, [argv], [(joined.name, [1])], job_id="50"))
        (end,) = wait_ended(executor)
        assert end.exit_code == 0
        env = json.loads((tmp_path / "env.json").read_text())
        assert (env["CUDA_VISIBLE_DEVICES"], env["CORRAL_TEST_NODE"]) == ("7", "c")
    finally:
        cluster.stop_node("c")
    deadline = time.monotonic() + WAIT_S
    while len(executor.nodes()) != 2:  # a node that stopped is gone from the list
        assert time.monotonic() < deadline, executor.nodes()
        time.sleep(0.2)
