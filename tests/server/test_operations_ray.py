"""The operator's tools on a real Ray cluster on 127.0.0.1: two nodes of 2 declared GPUs each (n1,
n2), each a `ray start` of its own, and `corral up` over them (the Ray executor). Node drain with
and without `--preempt`, health checks run on each node, EASY backfill and a reservation, each decided by the same core as under
the local executor (test_nodes_live.py, test_backfill_live.py, test_reservations_live.py): the
jobs here are real processes started by Ray's workers on the nodes they were placed on."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray

from corral.exec.ray import RayExecutor
from corral.server.boot import RunningServer, ServerOptions, build_manager
from corral.server.executors.ray import ray_namespace
from corral.server.health import HealthSettings
from tests.exec.ray_cluster import RayCluster, kill_named_actors, stopped_at_the_end
from tests.server.helpers import (
    admin_token,
    api,
    attempt_nodes,
    considered,
    fast_settings,
    job,
    nodes,
    python_job,
    run_server,
    settled,
    submit,
    train_job,
    wait_for,
    wait_until,
)
from tests.sim.test_queues_sim import EXPECTED

NODES = ("n1", "n2")


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    # No separate head: n1 is the head and declares its GPUs (one `ray start` fewer).
    ray_cluster = RayCluster(gpus_per_node=2, node_names=NODES)
    with stopped_at_the_end(ray_cluster):
        yield ray_cluster


@contextmanager
def serve(
    cluster: RayCluster, data_dir: Path, config: Path | None = None, **settings: Any
) -> Iterator[tuple[RunningServer, httpx.Client]]:
    """A manager on the cluster and an admin's client of it; at the end the manager is stopped
    and the actors of its jobs that still run are killed (they are detached: a failed test's
    would hold their Ray GPUs from the next test's jobs)."""
    data_dir.mkdir(parents=True)
    options = ServerOptions(
        data_dir=data_dir,
        executor="ray",
        executor_options={"address": cluster.address},
        config=config,
        settings=fast_settings(**settings),
        single_user=True,
    )
    namespace = ray_namespace(data_dir)
    executor = RayExecutor(cluster.address, namespace)
    try:
        manager = build_manager(options, executor)
    except BaseException:
        executor.close()
        raise
    running = run_server(manager)
    try:
        yield running, api(running.url, admin_token(data_dir))
    finally:
        try:
            running.stop()
        finally:
            connects = not ray.is_initialized()
            if connects:
                ray.init(address=cluster.address, log_to_driver=False)
            try:
                kill_named_actors(namespace)
            finally:
                if connects:
                    ray.shutdown()


@pytest.fixture
def server(cluster: RayCluster, tmp_path: Path) -> Iterator[tuple[RunningServer, httpx.Client]]:
    """fifo, consolidate: a manager of the drain tests."""
    with serve(cluster, tmp_path / "state", policy="fifo", placement="consolidate") as both:
        yield both


def until_file(name: str, path: Path, gpus: int = 2, **fields: Any) -> dict[str, Any]:
    """A job (a whole node's 2 GPUs unless told) that runs until `path` exists."""
    code = f"import os, time\nwhile not os.path.exists({str(path)!r}): time.sleep(0.05)"
    return python_job(name, code, gpus=gpus, grace_seconds=1, **fields)


def corral_cli(server: RunningServer, *args: str) -> subprocess.CompletedProcess[str]:
    """`corral ARGS` as a separate process, as an admin's shell runs it."""
    env = {
        **os.environ,
        "CORRAL_URL": server.url,
        "CORRAL_TOKEN": admin_token(server.manager.data_dir),
    }
    return subprocess.run(
        [sys.executable, "-m", "corral.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_on_each_node(client: httpx.Client, tmp_path: Path) -> tuple[str, str, str, str]:
    """Jobs a and b of 2 GPUs, one on each Ray node, running until go-a and go-b appear; the
    node of a, then of b."""
    a = submit(client, **until_file("a", tmp_path / "go-a"))
    wait_for(client, a, ["RUNNING"])
    b = submit(client, **until_file("b", tmp_path / "go-b"))
    wait_for(client, b, ["RUNNING"])
    (node_a,), (node_b,) = attempt_nodes(client, a), attempt_nodes(client, b)
    assert sorted((node_a, node_b)) == list(NODES)
    return a, b, node_a, node_b


def test_a_drained_ray_node_lets_its_job_finish_and_the_next_job_starts_on_the_other(
    server: tuple[RunningServer, httpx.Client], tmp_path: Path
) -> None:
    # Both Ray nodes full: a (2 GPUs) on X, b (2 GPUs) on Y. `corral node drain X`: a runs on
    # (no preempt). c (2 GPUs) arrives; a ends: X's 2 GPUs are idle but held out, so c waits
    # (0 attempts), its reason naming the drain. b ends: c starts on Y, never on X. After
    # `corral node resume X` two 2-GPU jobs run at once, one on each node.
    running, client = server
    assert {name: view["gpus"] for name, view in nodes(client).items()} == {"n1": 2, "n2": 2}
    a, b, x, y = one_on_each_node(client, tmp_path)

    drained = corral_cli(running, "node", "drain", x, "--reason", "swap a fan")
    assert drained.returncode == 0, drained.stderr
    assert drained.stdout == f"node {x} draining: swap a fan\n", drained.stdout  # a runs there
    view = nodes(client)[x]
    assert (view["state"], view["jobs"]) == ("draining", [a]), view
    assert job(client, a)["status"] == "RUNNING"  # not preempted: it finishes

    c = submit(client, **python_job("c", "print('c ran')", gpus=2))
    (tmp_path / "go-a").touch()  # a ends: X's GPUs are free, but X is drained
    wait_for(client, a, ["SUCCEEDED"])
    wait_until(lambda: nodes(client)[x]["state"] == "drained", f"{x} drained")
    settled(running)  # the round after a's end has run: it must not have started c on X
    found = job(client, c)
    assert (found["status"], found["attempts"]) == ("PENDING", 0), found
    view = nodes(client)[x]
    assert (view["reason"], view["gpus_used"], view["gpus_free"], view["gpus_held"]) == (
        "swap a fan",
        0,
        0,
        2,
    ), view
    assert f"node {x} is drained (swap a fan)" in found["reason"], found["reason"]

    (tmp_path / "go-b").touch()  # Y frees: c starts there, not on the drained X
    assert wait_for(client, c)["status"] == "SUCCEEDED"
    assert attempt_nodes(client, c) == [y]
    assert "c ran" in client.get(f"/api/v1/jobs/{c}/logs").text

    resumed = corral_cli(running, "node", "resume", x)
    assert resumed.returncode == 0 and resumed.stdout == f"node {x} up\n", resumed.stderr
    d = submit(client, **until_file("d", tmp_path / "go-d"))
    e = submit(client, **until_file("e", tmp_path / "go-e"))
    wait_for(client, d, ["RUNNING"])
    wait_for(client, e, ["RUNNING"])  # both nodes take jobs again
    assert sorted(attempt_nodes(client, d) + attempt_nodes(client, e)) == list(NODES)
    (tmp_path / "go-d").touch()
    (tmp_path / "go-e").touch()
    wait_for(client, d)
    wait_for(client, e)
    wait_for(client, b)


def test_a_drain_with_preempt_requeues_the_job_which_resumes_on_the_other_ray_node(
    server: tuple[RunningServer, httpx.Client], tmp_path: Path
) -> None:
    # a (train.py, 2 GPUs, checkpoints every step) on X; b (2 GPUs) on Y. Drain X with preempt:
    # a is stopped through its checkpoint contract and requeued (1 preemption, 0 failures); it
    # waits while X is drained and Y busy; when b ends it resumes on Y from its checkpoint.
    running, client = server
    a = submit(client, **train_job("a", steps=300, step_s=0.05, gpus=2))
    wait_for(client, a, ["RUNNING"])
    wait_until(lambda: job(client, a)["progress"], "a's first progress report")
    b = submit(client, **until_file("b", tmp_path / "go-b"))
    wait_for(client, b, ["RUNNING"])
    (x,), (y,) = attempt_nodes(client, a), attempt_nodes(client, b)
    assert sorted((x, y)) == list(NODES)

    answer = client.post(f"/api/v1/nodes/{x}/drain", json={"reason": "ECC", "preempt": True})
    assert answer.status_code == 200, answer.text
    found = wait_for(client, a, ["PENDING"])
    assert (found["failures"], found["preemptions"]) == (0, 1), found
    wait_until(
        lambda: job(client, a)["attempt_history"][0]["state"] == "ended", "a's attempt ended"
    )
    assert job(client, a)["attempt_history"][0]["outcome"] == "preempted"
    assert any(e["message"] == f"preempted by drain of node {x}" for e in job(client, a)["events"])
    wait_until(lambda: nodes(client)[x]["state"] == "drained", f"{x} drained")
    settled(running)
    assert job(client, a)["attempts"] == 1  # not restarted on the drained X

    (tmp_path / "go-b").touch()  # Y frees: a resumes there from its checkpoint
    done = wait_for(client, a)
    assert done["status"] == "SUCCEEDED", done
    assert attempt_nodes(client, a) == [x, y]
    assert done["failures"] == 0
    log = client.get(f"/api/v1/jobs/{a}/logs", params={"attempt": 2}).text
    assert int(log.split("resumed from step ")[1].split()[0]) > 0, log[-2000:]
    wait_for(client, b)


def sleeper(
    name: str, gpus: int, seconds: float, limit: float | None, **fields: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name,
        "gpus": gpus,
        "command": f"exec sleep {seconds}",
        "grace_seconds": 1,
        **fields,
    }
    if limit is not None:
        spec["time_limit"] = limit
    return spec


def test_easy_backfill_on_ray_starts_the_short_job_and_never_delays_the_head(
    cluster: RayCluster, tmp_path: Path
) -> None:
    # fifo, placement any, backfill easy. A (2 GPUs, sleeps 6 s, time_limit 30 s) takes one
    # node. H (4 GPUs as 2 workers: both nodes) cannot start: the head. A is released by its
    # limit at A's start + 30 s: H's shadow time, and its reservation is all 4 GPUs, the other
    # node's 2 free ones included. L (1 GPU, time_limit 120 s) would hold a reserved GPU past
    # the shadow time: it waits, "would delay job H". S (1 GPU, time_limit 10 s: a Ray worker's
    # start on a loaded machine counts in it) ends by the shadow time (it starts within 20 s of
    # A): it runs at once. A ends after 6 s and H starts then (no later than the shadow time);
    # L only after H (H holds all 4 GPUs until it ends).
    data_dir = tmp_path / "state"
    with serve(cluster, data_dir, policy="fifo", placement="any", backfill="easy") as (_, client):
        first = submit(client, **sleeper("A", 2, 6, 30))
        wait_for(client, first, ["RUNNING"])
        head = submit(client, **sleeper("H", 4, 1, 60, workers=2))
        long = submit(client, **sleeper("L", 1, 1, 120))
        short = submit(client, **sleeper("S", 1, 0.5, 10))
        delays = f"would delay job {head} reserved at t="

        def decided() -> dict[str, Any] | None:
            found = job(client, long)
            return found if found["attempts"] or delays in found["reason"] else None

        waiting = wait_until(decided, "L waiting for the head's reservation (or started)")
        assert waiting["attempts"] == 0, waiting
        done = wait_for(client, short)
        assert done["status"] == "SUCCEEDED", done  # within its time limit
        assert wait_for(client, head)["status"] == "SUCCEEDED"
        assert wait_for(client, long)["status"] == "SUCCEEDED"
        a, h, lj, s = (job(client, j) for j in (first, head, long, short))
        assert s["started_at"] < h["started_at"]  # the short job backfilled
        assert h["started_at"] <= a["started_at"] + 30  # the head kept its reservation
        assert lj["started_at"] >= h["started_at"]  # the long one did not pass it
        # S ran on the node A left free; H on both nodes, as two workers.
        (a_node,), (s_node,) = attempt_nodes(client, first), attempt_nodes(client, short)
        assert a_node != s_node
        (h_attempt,) = h["attempt_history"]
        assert sorted({gpu.split("/")[0] for gpu in h_attempt["gpus"]}) == list(NODES)


def test_a_reservation_of_a_ray_node_is_honoured_with_backfill_around_it(
    cluster: RayCluster, tmp_path: Path
) -> None:
    # fifo, greedy backfill, placement any (the lowest free GPUs first: n1's). `corral
    # reservation create maint --nodes n1` keeps n1's 2 GPUs for no one from lead_s from now
    # for window_s. L (2 GPUs, runs until told, time_limit 90 s) would run into the window on
    # n1: it starts on n2. S (1 GPU, sleeps 1 s, time_limit 10 s) ends before the window opens:
    # it starts on n1. U (1 GPU, no time_limit) is unbounded: it waits, its reason naming the
    # reservation, and starts on n1 once the window has closed (L holds n2 until after).
    lead_s, window_s = 25.0, 6.0
    data_dir = tmp_path / "state"
    go_long = tmp_path / "go-long"
    settings = {"policy": "fifo", "placement": "any", "backfill": "greedy"}
    with serve(cluster, data_dir, **settings) as (running, client):
        made = corral_cli(
            running,
            "reservation",
            "create",
            "maint",
            "--nodes",
            "n1",
            "--start",
            f"+{lead_s:g}s",
            "--duration",
            f"{window_s:g}s",
        )
        assert made.returncode == 0, made.stderr
        (reservation,) = client.get("/api/v1/reservations").json()
        assert (reservation["state"], sorted(reservation["gpus"])) == ("waiting", ["n1/0", "n1/1"])

        long = submit(client, **until_file("L", go_long, time_limit=90))
        short = submit(client, **sleeper("S", 1, 1, 10))
        unbounded = submit(client, **sleeper("U", 1, 1, None))
        wait_for(client, long, ["RUNNING"])
        assert attempt_nodes(client, long) == ["n2"]

        def waiting_for_window() -> dict[str, Any] | None:
            found = job(client, unbounded)
            return found if "reservation maint" in found["reason"] or found["attempts"] else None

        assert wait_until(waiting_for_window, "U held back by the window")["attempts"] == 0
        done = wait_for(client, short)
        assert done["status"] == "SUCCEEDED", (done, client.get(f"/api/v1/jobs/{short}/logs").text)
        assert attempt_nodes(client, short) == ["n1"]
        assert wait_for(client, unbounded, timeout=120)["status"] == "SUCCEEDED"
        s, u = job(client, short), job(client, unbounded)
        assert s["started_at"] < reservation["start"]
        assert u["started_at"] >= reservation["end"]
        assert attempt_nodes(client, unbounded) == ["n1"]
        assert job(client, long)["status"] == "RUNNING"  # n2 was never U's way in
        go_long.touch()
        assert wait_for(client, long)["status"] == "SUCCEEDED"
        running.stop()


#: test_queues_live.py's two-level queue (tests/sim/test_queues_sim.py: department d with teams
#: a (quota 2) and b (1); department e (quota 2, weight 3) with team c (2)) on the Ray nodes: 6
#: GPUs as three nodes of 2, the cells naming them.
RAY_TREE = """\
cell_types:
  ONE: {child: gpu, count: 1}
  NODE: {child: ONE, count: 2, node: true}
physical_cells:
  - {type: NODE, names: [n1, n2, n3]}
virtual_clusters:
  a: {cells: {ONE: 2}, parent: d}
  b: {cells: {ONE: 1}, parent: d}
  c: {cells: {ONE: 2}, parent: e}
departments:
  d: {quota: 3}
  e: {quota: 2, weight: 3}
"""


def test_a_two_level_queue_on_ray_lends_within_first_and_reclaims_from_outside_first(
    cluster: RayCluster, tmp_path: Path
) -> None:
    # n3 joins for the 6 GPUs of the scenario and leaves at the end (the other tests, in any
    # order, see n1 and n2 alone). The decisions are
    # the simulator's (EXPECTED, worked out by hand in tests/sim/test_queues_sim.py): c alone
    # runs 4 (e's quota 2 and the idle rest); b's three jobs take the 2 idle GPUs and a's idle
    # quota inside d, so c3 gives way; a0 (within a's quota) takes a GPU back from c (c2, the
    # borrower from outside d) though b is over its share too; a1 then from b (b2), the only
    # one still over its share.
    cluster.add_node("n3")
    try:
        config = tmp_path / "tree.yaml"
        config.write_text(RAY_TREE)
        settings = {"policy": "fifo", "admission": "quota"}
        with serve(cluster, tmp_path / "state", config, **settings) as (_, client):
            wait_until(
                lambda: sum(view["gpus"] for view in nodes(client).values()) == 6, "n3's 2 GPUs"
            )
            ids: dict[str, str] = {}
            preempted: list[str] = []

            def arrive(*names: str) -> None:
                for name in names:
                    spec = sleeper(name, 1, 3600, None, vc=name[0])
                    ids[name] = submit(client, **spec)
                for name in names:
                    wait_for(client, ids[name], ["RUNNING"], timeout=120)

            def gave_way(name: str) -> None:
                found = wait_for(client, ids[name], ["PENDING"], timeout=120)
                assert found["preemptions"] == 1, found
                preempted.append(name)

            arrive("c0", "c1", "c2", "c3")
            arrive("b0", "b1", "b2")
            gave_way("c3")
            arrive("a0")
            gave_way("c2")
            arrive("a1")
            gave_way("b2")
            final = {
                name: (job(client, i)["status"], job(client, i)["preemptions"])
                for name, i in ids.items()
            }
            assert final == {
                "c0": ("RUNNING", 0),
                "c1": ("RUNNING", 0),
                "c2": ("PENDING", 1),
                "c3": ("PENDING", 1),
                "b0": ("RUNNING", 0),
                "b1": ("RUNNING", 0),
                "b2": ("PENDING", 1),
                "a0": ("RUNNING", 0),
                "a1": ("RUNNING", 0),
            }
            assert preempted == [name for _, kind, name in EXPECTED if kind == "preempt"]
            # The six running jobs hold the GPUs of all three Ray nodes.
            held = [
                job(client, ids[n])["placement"][0] for n, (s, _) in final.items() if s == "RUNNING"
            ]
            assert sorted({gpu.split("/")[0] for gpu in held}) == ["n1", "n2", "n3"]
    finally:
        cluster.stop_node("n3")


# A site's health check that says where it ran: its parent is the process that started it, a
# Ray worker of the node whose processes all carry CORRAL_TEST_NODE (tests/exec/ray_cluster.py);
# run on the manager's machine its parent would be this test's process, which carries none.
WHERE_CHECK = """\
import os, pathlib, sys
parent = pathlib.Path(f"/proc/{os.getppid()}/environ").read_bytes().split(b"\\0")
where = next((e[17:].decode() for e in parent if e.startswith(b"CORRAL_TEST_NODE=")), "?")
asked = os.environ["CORRAL_NODE"]
pathlib.Path(sys.argv[1], f"ran-{asked}-on-{where}").touch()
if where != asked:
    sys.exit(f"asked about {asked}, ran on {where}")
if pathlib.Path(sys.argv[1], f"sick-{where}").exists():
    sys.exit(f"{where}: fan failed")
"""


def test_health_checks_run_on_each_ray_node_and_a_sick_one_is_held_out(
    cluster: RayCluster, tmp_path: Path
) -> None:
    # The check runs on the node it judges (its own record: ran-n1-on-n1, ran-n2-on-n2; on the
    # manager's machine it would say "ran on ?" and both nodes would be unhealthy). n2's check
    # then fails: n2 is unhealthy with the check's first line as the reason, its 2 GPUs held
    # out, so of two 2-GPU jobs one runs on n1 and the other waits, its reason naming n2. When
    # the check passes again n2 is up and the waiting job starts there.
    flags = tmp_path / "flags"
    flags.mkdir()
    script = tmp_path / "check.py"
    script.write_text(WHERE_CHECK)
    health = HealthSettings.parse(f"{sys.executable} {script} {flags}", 0.5, 30.0)
    with serve(
        cluster, tmp_path / "state", policy="fifo", placement="consolidate", health=health
    ) as (running, client):
        wait_until(
            lambda: {p.name for p in flags.iterdir()} >= {"ran-n1-on-n1", "ran-n2-on-n2"},
            "each node's check run on the node",
        )
        assert not [p.name for p in flags.iterdir() if p.name.endswith("-on-?")]
        assert {name: view["state"] for name, view in nodes(client).items()} == {
            "n1": "up",
            "n2": "up",
        }

        (flags / "sick-n2").touch()
        wait_until(lambda: nodes(client)["n2"]["state"] == "unhealthy", "n2 unhealthy")
        assert nodes(client)["n2"]["reason"] == "n2: fan failed"
        a = submit(client, **until_file("a", tmp_path / "go-a"))
        wait_for(client, a, ["RUNNING"])
        assert attempt_nodes(client, a) == ["n1"]
        b = submit(client, **python_job("b", "print('b ran')", gpus=2))
        found = considered(client, b)  # (the step in progress may have begun before b came)
        assert (found["status"], found["attempts"]) == ("PENDING", 0), found
        assert "n2" in found["reason"], found["reason"]

        (flags / "sick-n2").unlink()
        wait_until(lambda: nodes(client)["n2"]["state"] == "up", "n2 healthy again")
        assert wait_for(client, b)["status"] == "SUCCEEDED"
        assert attempt_nodes(client, b) == ["n2"]
        (tmp_path / "go-a").touch()
        wait_for(client, a)
