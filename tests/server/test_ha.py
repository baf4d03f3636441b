"""An active manager and standbys on one PostgreSQL database (docs/ha.md): real `corral up`
processes, each with its own data directory, the local executor, a real PostgreSQL server.

- fencing: the leader is stopped with SIGSTOP, the standby takes over, the old leader is resumed
  with SIGCONT: it writes nothing, starts nothing and steps down (exits 3);
- failover under load: clients listing both managers submit while jobs run, and the leader is
  killed with SIGKILL again and again (each time started again, as a standby): the standby leads
  within 10 s each time, no acknowledged submission is lost or stored twice, no job runs twice,
  every running job is found again, and no client sees an error.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from corral.client import Client, ClientError
from corral.exec.local import kill_attempt
from corral.server.leader import EXIT_DEPOSED, LEASE_S
from tests.exec.ray_cluster import RayCluster, stopped_at_the_end
from tests.server.helpers import admin_token, alive, api, wait_until
from tests.web.test_dashboard import dump_dom

#: The issue's promise: a standby leads within this many seconds of the leader's death.
TAKEOVER_S = 10.0

# Records each start of the job (one line in its checkpoint directory, which every attempt of
# the job shares), then runs until the file named by its argument exists.
GATED = (
    "import os, pathlib, sys, time\n"
    "pathlib.Path(os.environ['CORRAL_CHECKPOINT_DIR'], 'starts').open('a').write('start\\n')\n"
    "while not pathlib.Path(sys.argv[1]).exists():\n"
    "    time.sleep(0.05)\n"
)
# Records its start, then runs for its argument's seconds.
SHORT = (
    "import os, pathlib, sys, time\n"
    "pathlib.Path(os.environ['CORRAL_CHECKPOINT_DIR'], 'starts').open('a').write('start\\n')\n"
    "time.sleep(float(sys.argv[1]))\n"
)


def gated(name: str, gate: Path) -> dict[str, Any]:
    return {"name": name, "gpus": 1, "command": [sys.executable, "-c", GATED, str(gate)]}


def short(name: str, seconds: float) -> dict[str, Any]:
    return {"name": name, "gpus": 1, "command": [sys.executable, "-c", SHORT, str(seconds)]}


class Up:
    """One `corral up` on the shared database: its own data directory and port, started again
    (same directory and port) after a kill."""

    def __init__(
        self, name: str, root: Path, db: str, gpus: int, ray_address: str | None = None
    ) -> None:
        self.name = name
        self.ray_address = ray_address
        self.data_dir = root / name
        self.root = root
        self.db = db
        self.gpus = gpus
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> Up:
        self.starts += 1
        command = [
            sys.executable,
            "-m",
            "corral.cli",
            "up",
            *(
                ["--gpus", str(self.gpus)]
                if self.ray_address is None
                else ["--executor", "ray", "--ray-address", self.ray_address]
            ),
            "--single-user",
            "--db",
            self.db,
            "--data-dir",
            str(self.data_dir),
            "--port",
            str(self.port),
        ]
        with self.log().open("wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        wait_until(self.answers, f"{self.name} answering HTTP", timeout=180)
        return self

    def log(self) -> Path:
        return self.root / f"{self.name}-{self.starts}.log"

    def answers(self) -> bool:
        assert self.process is not None
        assert self.process.poll() is None, self.log().read_text()[-3000:]
        try:
            return httpx.get(self.url + "/healthz", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    def readyz(self) -> dict[str, Any]:
        try:
            return dict(httpx.get(self.url + "/readyz", timeout=5).json())
        except (httpx.TransportError, ValueError):
            return {}

    def leads(self) -> bool:
        return self.readyz().get("role") == "leader" and self.readyz().get("status") == "ready"

    def stands_by(self) -> bool:
        return self.readyz().get("role") == "standby"

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # (a stopped one never dies of SIGKILL)
            self.kill()


@pytest.fixture
def ups(postgres_url: str, tmp_path: Path) -> Iterator[list[Up]]:
    made: list[Up] = []
    try:
        yield made
    finally:
        for up in made:
            up.stop()
        for attempt in tmp_path.glob("*/jobs/*/attempt-*"):
            kill_attempt(attempt)


def lease(url: str) -> tuple[str, int]:
    """(address, epoch) of the manager's lease, as the database holds it."""
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            row = connection.execute(
                sa.text("SELECT address, epoch FROM leases WHERE name = 'manager'")
            ).one()
    finally:
        engine.dispose()
    return str(row[0]), int(row[1])


def snapshot(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table the managers write, but the lease's (renewed all the time)."""
    engine = sa.create_engine(url, poolclass=NullPool)
    tables = ["jobs", "attempts", "events", "progress", "profiles", "node_changes", "meta"]
    try:
        with engine.connect() as connection:
            return {
                table: [tuple(row) for row in connection.execute(sa.text(f"SELECT * FROM {table}"))]
                for table in tables
            }
    finally:
        engine.dispose()


def query(url: str, sql: str) -> list[tuple[Any, ...]]:
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.execute(sa.text(sql))]
    finally:
        engine.dispose()


def starts(jobs_root: Path, job_id: str) -> int:
    """How many times the job's processes started (its checkpoint directory's record)."""
    path = jobs_root / job_id / "checkpoint" / "starts"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_a_stopped_leader_is_replaced_and_when_resumed_writes_and_starts_nothing(
    ups: list[Up], postgres_url: str, tmp_path: Path
) -> None:
    # One GPU. The leader `one` runs `first` (gated) and queues `second`, which waits for the
    # GPU. `one` is stopped (SIGSTOP); `two` takes the lease (within TAKEOVER_S), finds `first`
    # running again, and, once `first` ends, starts `second`: its only start. `one` is resumed
    # (SIGCONT) with a control loop that saw `first` end (its shim was its child) and a core
    # that would start `second` on the freed GPU: fenced, its round's transaction changes no row,
    # it starts nothing, and it exits with EXIT_DEPOSED (3) (whichever of its renewal, its write
    # or its launch finds the lease taken first). With no fencing at all (no write fence, a
    # renewal that never finds the lease taken) it never steps down and this test fails; the
    # write fence alone is test_leader.py's.
    one = Up("one", tmp_path, postgres_url, gpus=1)
    ups.append(one)
    one.start()
    wait_until(one.leads, "one leading")
    two = Up("two", tmp_path, postgres_url, gpus=1)
    ups.append(two)
    two.start()
    assert wait_until(two.stands_by, "two standing by")
    hint = two.readyz()
    assert hint["leader"] == one.url, hint
    # A standby's API answers 503 with the leader's address, in a header and the body.
    refused = httpx.get(two.url + "/api/v1/jobs", timeout=10)
    assert refused.status_code == 503
    assert refused.headers["X-Corral-Leader"] == one.url
    assert refused.json()["leader"] == one.url
    assert "standby" in refused.json()["detail"]
    address, epoch = lease(postgres_url)
    assert address == one.url

    token = admin_token(one.data_dir)
    client = api(one.url, token)
    gate = tmp_path / "first-may-end"
    final_gate = tmp_path / "second-may-end"
    first = client.post("/api/v1/jobs", json=gated("first", gate)).json()["id"]
    wait_until(lambda: client.get(f"/api/v1/jobs/{first}").json()["status"] == "RUNNING", "run")
    second = client.post("/api/v1/jobs", json=gated("second", final_gate)).json()["id"]
    wait_until(
        lambda: "PENDING" in client.get(f"/api/v1/jobs/{second}").json()["reason"],
        "second considered",
    )
    client.close()
    jobs_root = one.data_dir / "jobs"
    wait_until(lambda: starts(jobs_root, first) == 1, "first's start")

    assert one.process is not None
    one.process.send_signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    wait_until(lambda: lease(postgres_url)[1] > epoch, "two taking the lease", timeout=60)
    took_s = time.monotonic() - stopped_at
    wait_until(two.leads, "two leading", timeout=60)
    ready_s = time.monotonic() - stopped_at
    assert lease(postgres_url) == (two.url, epoch + 1)
    # The lease lapses LEASE_S after its last renewal (at most LEASE_S before the stop): taken
    # after at least LEASE_S less a renewal period, and within TAKEOVER_S.
    assert LEASE_S - 2.0 <= took_s <= ready_s <= TAKEOVER_S, (took_s, ready_s)
    print(f"\nSIGSTOP: two took the lease after {took_s:.1f} s, ready after {ready_s:.1f} s")

    client = api(two.url, token)
    assert client.get(f"/api/v1/jobs/{first}").json()["status"] == "RUNNING"  # found again
    metrics = client.get("/metrics").text
    assert "corral_manager_leader 1.0" in metrics
    assert "corral_failovers_total 1.0" in metrics
    assert f"corral_lease_epoch {epoch + 1}.0" in metrics
    assert "corral_lease_age_seconds" in metrics
    gate.touch()
    wait_for_status = lambda job_id, status: wait_until(  # noqa: E731
        lambda: client.get(f"/api/v1/jobs/{job_id}").json()["status"] == status,
        f"job {job_id} {status}",
    )
    wait_for_status(first, "SUCCEEDED")
    wait_for_status(second, "RUNNING")
    wait_until(lambda: starts(jobs_root, second) == 1, "second's start")
    # Quiet now (`second` runs gated, `first` ended): only the lease's row changes.
    before = snapshot(postgres_url)

    one.process.send_signal(signal.SIGCONT)
    assert one.process.wait(timeout=60) == EXIT_DEPOSED
    assert "deposed" in one.log().read_text()
    time.sleep(1.0)  # (anything `one` could have written would be there by now)
    assert snapshot(postgres_url) == before  # `one` wrote nothing
    assert starts(jobs_root, second) == 1  # and started nothing
    detail = client.get(f"/api/v1/jobs/{first}").json()
    assert [e["kind"] for e in detail["events"]].count("succeeded") == 1
    assert query(postgres_url, f"SELECT number FROM attempts WHERE job_id = {second}") == [(1,)]
    assert lease(postgres_url) == (two.url, epoch + 1)
    assert two.leads()
    final_gate.touch()
    wait_for_status(second, "SUCCEEDED")
    client.close()


CLIENTS = 4
# Local: 100 each by default (a loaded 2-core machine runs 4 x 100 in a few minutes), the issue's
# 300 with CORRAL_HA_PER_CLIENT=300 (docs/ha.md#the-test has both runs' figures). Ray: 25 each
# (each attempt a Ray actor whose start takes a second or more there).
PER_CLIENT = {
    "local": int(os.environ.get("CORRAL_HA_PER_CLIENT", "100")),
    "ray": int(os.environ.get("CORRAL_HA_RAY_PER_CLIENT", "25")),
}
KILLS = {"local": 3, "ray": 2}
#: By when the new leader answers /readyz 200 after a kill.
READY_S = {"local": TAKEOVER_S, "ray": TAKEOVER_S + 30.0}
GPUS = 8


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    """Two Ray nodes of 4 declared GPUs each: the managers' 8 GPUs on Ray."""
    cluster = RayCluster(gpus_per_node=GPUS // 2, node_names=("n1", "n2"))
    with stopped_at_the_end(cluster):
        yield cluster


@pytest.mark.parametrize("executor", ["local", "ray"])
def test_kill_9_of_the_leader_again_and_again_under_a_burst_of_submissions(
    ups: list[Up], postgres_url: str, tmp_path: Path, executor: str, request: pytest.FixtureRequest
) -> None:
    # Two managers, `a` leading, `b` standing by, running the jobs as local processes or as Ray
    # actors on a 2-node Ray cluster; 4 clients listing both submit PER_CLIENT short jobs each
    # (0.3 s: they start and end all the time on 8 GPUs) while a few long ones run. The leader
    # is killed with SIGKILL KILLS times, each time once the burst has moved on, and is started
    # again as a standby. Expected, each time: the other leads within TAKEOVER_S (its lease
    # taken and its /readyz 200), the running long jobs are found again (the same attempt, still
    # running: on Ray, the actors the old leader started, in the namespace the managers share);
    # at the end:
    # every acknowledged submission is stored once (the ids the clients got, one job per name),
    # each job's processes started once, and no client saw an error.
    per_client, kills = PER_CLIENT[executor], KILLS[executor]
    address = request.getfixturevalue("ray_cluster").address if executor == "ray" else None
    a = Up("a", tmp_path, postgres_url, gpus=GPUS, ray_address=address)
    b = Up("b", tmp_path, postgres_url, gpus=GPUS, ray_address=address)
    ups.extend([a, b])
    a.start()
    wait_until(a.leads, "a leading")
    b.start()
    wait_until(b.stands_by, "b standing by")
    token = admin_token(a.data_dir)
    urls = f"{a.url},{b.url}"
    jobs_root = a.data_dir / "jobs"
    gate = tmp_path / "long-may-end"
    with Client(urls, token) as setup:
        long_ids = [setup.submit(gated(f"long-{i}", gate))["id"] for i in range(2)]
        wait_until(
            lambda: all(setup.job(j)["status"] == "RUNNING" for j in long_ids), "long jobs run"
        )

    acknowledged: dict[str, str] = {}  # name -> id
    errors: list[str] = []
    sent = [0] * CLIENTS

    def submitter(index: int) -> None:
        with Client(urls, token, timeout=30) as client:
            for n in range(per_client):
                name = f"c{index}-{n}"
                try:
                    acknowledged[name] = client.submit(short(name, 0.3))["id"]
                except ClientError as error:
                    errors.append(f"{name}: {error}")
                sent[index] = n + 1

    threads = [threading.Thread(target=submitter, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    leader, standby = a, b
    takeovers: list[float] = []
    found_again = never_started = 0
    readies: list[float] = []
    try:
        for kill in range(kills):
            target = (kill + 1) * CLIENTS * per_client // (kills + 1)
            wait_until(
                lambda t=target: sum(sent) >= t or not any(map(threading.Thread.is_alive, threads)),
                "the burst moving on",
                timeout=600,
            )  # noqa: E501
            _, epoch = lease(postgres_url)
            running = {
                str(job_id): number
                for job_id, number in query(
                    postgres_url,
                    "SELECT job_id, number FROM attempts WHERE state = 'running'",
                )
            }
            leader.kill()
            killed_at = time.monotonic()
            wait_until(lambda e=epoch: lease(postgres_url)[1] > e, "takeover", timeout=60)
            takeovers.append(time.monotonic() - killed_at)
            wait_until(standby.leads, "the standby leading", timeout=60)
            readies.append(time.monotonic() - killed_at)
            assert lease(postgres_url) == (standby.url, epoch + 1)
            # Every attempt running at the kill is found again: still running, the same one
            # (or ended on its own by now: a short job); unless the kill fell between its
            # record and its launch: then it never started, and the job was requeued (its
            # processes then start once all the same: checked at the end).
            for job_id, number in running.items():
                rows = query(
                    postgres_url,
                    f"SELECT number, state, outcome, reason FROM attempts WHERE job_id = {job_id} "
                    "ORDER BY number",
                )
                attempt = {row[0]: row for row in rows}[number]
                if attempt[3] == "never started":
                    never_started += 1
                    continue
                assert rows[-1][0] == number, (job_id, rows)
                assert rows[-1][2] in (None, "succeeded"), (job_id, rows)
                found_again += 1
            leader.start()  # again, as the standby
            wait_until(leader.stands_by, "the old leader standing by")
            leader, standby = standby, leader
        for thread in threads:
            thread.join(timeout=600)
        gate.touch()
        with Client(urls, token) as check:
            for job_id in long_ids:
                wait_until(lambda j=job_id: check.job(j)["status"] == "SUCCEEDED", "long end")
            wait_until(
                lambda: (
                    not query(
                        postgres_url, "SELECT id FROM jobs WHERE status IN ('PENDING', 'RUNNING')"
                    )
                ),
                "every job ended",
                # each a Ray actor's start on Ray (seconds on a loaded machine, 8 at a time)
                timeout=max(600.0, CLIENTS * per_client * (3.0 if executor == "ray" else 0.5)),
            )
    finally:
        gate.touch()
        for thread in threads:
            thread.join(timeout=60)
    print(
        f"\n{executor}: {CLIENTS} x {per_client} submissions, {kills} kills: lease taken after "
        + ", ".join(f"{s:.1f}" for s in takeovers)
        + " s; ready after "
        + ", ".join(f"{s:.1f}" for s in readies)
        + f" s; attempts running at the kills: {found_again} found again, {never_started} "
        "recorded but never started (requeued)"
    )
    assert errors == []
    assert len(acknowledged) == CLIENTS * per_client
    stored = query(postgres_url, "SELECT id, name, status, attempts FROM jobs ORDER BY id")
    names = [name for _id, name, _status, _attempts in stored if not name.startswith("long-")]
    assert len(names) == len(set(names)) == CLIENTS * per_client  # none lost, none twice
    by_name = {name: str(job_id) for job_id, name, _status, _attempts in stored}
    assert all(by_name[name] == job_id for name, job_id in acknowledged.items())
    assert {status for _id, _name, status, _attempts in stored} == {"SUCCEEDED"}
    twice = [job_id for job_id, *_ in stored if starts(jobs_root, str(job_id)) != 1]
    assert twice == []  # each job's processes started once
    # Ready within TAKEOVER_S too; on Ray not while the machine is loaded: the new leader waits
    # for the actors the old one created whose workers are still starting (seconds each at load
    # 8-15, 30 s at most: RayExecutor.recover) before it knows whether they started their job.
    for took, ready in zip(takeovers, readies, strict=True):
        assert took <= TAKEOVER_S and ready <= READY_S[executor], (takeovers, readies)
    assert found_again > 0
    assert all(alive(up.process.pid) for up in (a, b) if up.process is not None)


def test_a_leader_stopped_cleanly_gives_its_lease_up(
    ups: list[Up], postgres_url: str, tmp_path: Path
) -> None:
    # The first step of a rolling upgrade: the leader is stopped with SIGTERM (exit 0); it gives
    # its lease up as it stops (`expires_at` 0 in the database, where a lapsed lease would show
    # its last renewal + 5 s), so the next manager takes it at once: it never stands by.
    a = Up("a", tmp_path, postgres_url, gpus=1)
    ups.append(a)
    a.start()
    wait_until(a.leads, "a leading")
    _, epoch = lease(postgres_url)
    assert a.process is not None
    a.process.send_signal(signal.SIGTERM)
    assert a.process.wait(timeout=60) == 0
    assert query(postgres_url, "SELECT holder <> '', expires_at FROM leases") == [(True, 0.0)]
    b = Up("b", tmp_path, postgres_url, gpus=1)
    ups.append(b)
    b.start()
    wait_until(b.leads, "b leading", timeout=60)
    assert lease(postgres_url) == (b.url, epoch + 1)
    assert "standby" not in b.log().read_text()
    assert "took over from" in b.log().read_text()
    # b's dashboard says which manager it talks to: b, the leader, at the lease's new epoch.
    token = (b.data_dir / "admin.token").read_text().strip()
    dom = dump_dom(tmp_path / "browser", f"{b.url}/#token={token}")
    manager = dom.by_id("manager")
    assert manager.attrs["data-role"] == "leader"
    assert manager.text() == f"127.0.0.1:{b.port} · leader (epoch {epoch + 1})"


def test_a_standby_on_ray_connects_beforehand_in_the_namespace_the_leader_recorded(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    # A standby on Ray connects while it waits (connecting is most of a takeover there), in the
    # namespace the leader recorded in the store, where the leader's actors are: a standby
    # connected in its own namespace would find none of them once it leads. Before the leader
    # recorded one, it connects at the takeover (when the namespace is the store's to give).
    import ray

    from corral.server.executors.base import Boot
    from corral.server.executors.ray import NAMESPACE_KEY, RayEntry, RayOptions
    from corral.server.state import ManagerSettings

    options = RayOptions(address=ray_cluster.address)
    boot = Boot(data_dir=tmp_path, settings=ManagerSettings())
    assert RayEntry.prepare(options, boot, {}.get) is None
    assert not ray.is_initialized()
    recorded = {NAMESPACE_KEY: "corral-the-leaders"}
    executor = RayEntry.prepare(options, boot, recorded.get)
    assert executor is not None
    try:
        assert ray.get_runtime_context().namespace == "corral-the-leaders"
    finally:
        executor.close()
