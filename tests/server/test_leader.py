"""The lease, its fencing and the clients' failover, piece by piece (docs/ha.md); the two real
managers on PostgreSQL are tests/server/test_ha.py's.

The lease's SQL is the same on SQLite, where these run quickly: two stores on one file stand for
two managers (SQLite itself never has two managers: `corral up` leads only on PostgreSQL).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from corral.cli.main import app
from corral.client import Client, ClientError
from corral.exec.local import AttemptEnded, AttemptLaunch
from corral.server.leader import Deposed, FencedExecutor, Lease
from corral.server.standby import StandbyServer
from corral.server.store import Store, StoreError
from tests.server.helpers import admin_token, api, start_server, wait_until

#: Short, so that the tests wait little: a lease of 1 s renewed every 0.2 s, acted on until
#: 0.3 s before it could lapse.
LEASE = {"lease_s": 1.0, "renew_s": 0.2, "margin_s": 0.3}


class Deposals:
    """Stands for stepping down (which ends the process in `corral up`): records why."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def __call__(self, reason: str) -> None:
        self.reasons.append(reason)


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[tuple[Store, Store]]:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    one, two = Store(url), Store(url)
    try:
        yield one, two
    finally:
        one.close()
        two.close()


def test_the_lease_is_taken_by_one_and_by_the_other_only_once_it_lapsed(
    stores: tuple[Store, Store],
) -> None:
    # `one` takes the free lease (epoch 0 -> 1); `two` cannot while it is renewed; once `one`
    # stops renewing, `two` takes it no sooner than 1 s (its length) after the last renewal,
    # at epoch 2; `one`'s next renewal finds it gone: it steps down, once.
    one_store, two_store = stores
    deposed = Deposals()
    one = Lease(one_store, "http://one", holder="one", on_deposed=deposed, **LEASE)
    two = Lease(two_store, "http://two", holder="two", **LEASE)
    assert one.try_take() and one.epoch == 1
    assert one.took_over_from is None
    for _ in range(6):  # 1.2 s of renewals: more than a lease's length
        time.sleep(0.2)
        renewed = time.monotonic()
        assert one.renew() and not two.try_take()
    assert one.valid()
    wait_until(two.try_take, "two taking the lapsed lease", timeout=30)
    assert time.monotonic() - renewed >= 1.0 - 0.05  # (the databases's clock, in ms)
    assert two.epoch == 2
    assert two.took_over_from is not None and two.took_over_from.holder == "one"
    current = two.current()
    assert current is not None and (current.holder, current.address) == ("two", "http://two")
    assert not one.renew()
    assert len(deposed.reasons) == 1 and "two at http://two, epoch 2" in deposed.reasons[0]
    assert not one.valid()


def test_a_deposed_leaders_write_changes_nothing(stores: tuple[Store, Store]) -> None:
    # `one` leads, fenced, and writes an event; it pauses (stops renewing) and `two` takes the
    # lease. `one`'s next write, a batch of two events, is rolled back whole (Deposed), and
    # `one` steps down; `two`'s own writes go through.
    one_store, two_store = stores
    deposed = Deposals()
    one = Lease(one_store, "http://one", holder="one", on_deposed=deposed, **LEASE)
    two = Lease(two_store, "http://two", holder="two", **LEASE)
    assert one.try_take()
    one_store.fence = one.fence
    one_store.add_event(None, 1.0, "note", "one leads")
    wait_until(two.try_take, "two taking the lapsed lease", timeout=30)
    two_store.fence = two.fence
    with pytest.raises(Deposed):
        with one_store.batch():
            one_store.add_event(None, 2.0, "note", "one, late")
            one_store.add_event(None, 3.0, "note", "one, later")
    with pytest.raises(Deposed):
        one_store.set_meta("written_by", "one")
    two_store.add_event(None, 4.0, "note", "two leads")
    assert [e.message for e in two_store.events(None)] == ["one leads", "two leads"]
    assert two_store.get_meta("written_by") is None
    assert len(deposed.reasons) == 2


class Recording:
    """An executor that records what it was asked to do."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def launch(self, launch: AttemptLaunch) -> None:
        self.calls.append(f"launch {launch.job_id}")

    def stop(self, job_id: str, attempt: int) -> None:
        self.calls.append(f"stop {job_id}")

    def signal(self, job_id: str, attempt: int, number: int) -> None:
        self.calls.append(f"signal {job_id}")

    def poll(self) -> list[AttemptEnded]:
        return []

    def recover(self, job_id: str, attempt: int, attempt_dir: Path) -> str:
        return "never-started"

    def leftover(self, job_id: str, attempt: int, attempt_dir: Path) -> int:
        return 0

    def close(self) -> None:
        pass


def test_a_leader_whose_lease_lapsed_stops_and_signals_nothing_once_replaced(
    stores: tuple[Store, Store],
) -> None:
    # While its lease is valid, `one`'s executor stops and signals; past the lease (not renewed
    # for 0.7 s: its length less the margin) it renews first, which fails once `two` took the
    # lease: nothing reaches the executor, and `one` steps down.
    one_store, two_store = stores
    deposed = Deposals()
    one = Lease(one_store, "http://one", holder="one", on_deposed=deposed, **LEASE)
    two = Lease(two_store, "http://two", holder="two", **LEASE)
    assert one.try_take()
    inner = Recording()
    fenced = FencedExecutor(inner, one)
    fenced.stop("1", 1)
    assert inner.calls == ["stop 1"]
    wait_until(two.try_take, "two taking the lapsed lease", timeout=30)
    assert not one.valid()
    with pytest.raises(Deposed):
        fenced.stop("2", 1)
    with pytest.raises(Deposed):
        fenced.signal("2", 1, 10)
    assert inner.calls == ["stop 1"]
    assert deposed.reasons


def test_a_lapsed_lease_nobody_took_is_renewed_before_acting(
    stores: tuple[Store, Store],
) -> None:
    # The database was away longer than the lease (here: no renewal for 1.2 s) but no standby
    # took it: the next stop renews it first (the epoch unchanged) and goes through.
    one_store, _ = stores
    one = Lease(one_store, "http://one", holder="one", **LEASE)
    assert one.try_take()
    inner = Recording()
    fenced = FencedExecutor(inner, one)
    wait_until(lambda: not one.valid(), "the lease lapsing", timeout=30)
    fenced.stop("1", 1)
    assert inner.calls == ["stop 1"] and one.valid() and one.epoch == 1


def test_a_submission_repeated_with_its_key_is_stored_once(tmp_path: Path) -> None:
    # The same Idempotency-Key twice from the admin: the second answer is the first job (id 1),
    # and one job is stored (the id the repeat was given, 2, is not used); a submission without
    # a key, or with another one, is a new job (3, 4). An array (tasks 5-7) repeated answers its
    # first task, with the same tasks: 6 jobs in all.
    server = start_server(tmp_path / "corral", gpus=1)
    try:
        client = api(server.url, admin_token(server.manager.data_dir))
        spec = {"name": "once", "gpus": 1, "command": ["true"]}
        key = {"Idempotency-Key": "k-1"}
        first = client.post("/api/v1/jobs", json=spec, headers=key)
        again = client.post("/api/v1/jobs", json=spec, headers=key)
        assert first.status_code == again.status_code == 201
        assert first.json()["id"] == again.json()["id"] == "1"
        other = client.post("/api/v1/jobs", json=spec, headers={"Idempotency-Key": "k-2"})
        plain = client.post("/api/v1/jobs", json=spec)
        assert (other.json()["id"], plain.json()["id"]) == ("3", "4")
        array = {**spec, "name": "tasks", "array": "0-2"}
        tasks = client.post("/api/v1/jobs", json=array, headers={"Idempotency-Key": "k-3"})
        repeated = client.post("/api/v1/jobs", json=array, headers={"Idempotency-Key": "k-3"})
        assert tasks.json()["array_tasks"] == repeated.json()["array_tasks"] == ["5", "6", "7"]
        assert len(client.get("/api/v1/jobs").json()) == 6
        too_long = client.post("/api/v1/jobs", json=spec, headers={"Idempotency-Key": "x" * 129})
        assert too_long.status_code == 422 and "Idempotency-Key" in too_long.json()["detail"]
        client.close()
    finally:
        server.stop()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_client_listing_several_managers_reaches_the_leader(tmp_path: Path) -> None:
    # CORRAL_URL lists a manager that is down, a standby and the leader: a submission goes to
    # the leader (the first refuses the connection, the standby answers 503 naming the leader)
    # and is stored once. Listing only the standby works too: its hint is followed. Listing
    # only a manager that is down fails with the one-line error, once `failover_s` has passed.
    server = start_server(tmp_path / "corral", gpus=1)
    store = Store(f"sqlite:///{tmp_path / 'lease.db'}")
    leader = Lease(store, server.url, holder="leader", **LEASE)
    assert leader.try_take()
    standby = StandbyServer(Lease(store, "http://standby", **LEASE), "127.0.0.1", free_port())
    standby.start()
    standby_url = f"http://127.0.0.1:{standby.server.config.port}"
    down = f"http://127.0.0.1:{free_port()}"
    try:
        token = admin_token(server.manager.data_dir)
        refused = httpx.get(standby_url + "/api/v1/jobs", timeout=10)
        assert refused.status_code == 503
        assert refused.headers["X-Corral-Leader"] == server.url
        assert httpx.get(standby_url + "/readyz", timeout=10).json()["role"] == "standby"
        with Client(f"{down},{standby_url},{server.url}", token, failover_s=30) as client:
            job = client.submit({"name": "reached", "gpus": 1, "command": ["true"]})
            assert client.url == server.url
        with Client(standby_url, token, failover_s=30) as client:
            assert client.job(job["id"])["name"] == "reached"
            assert client.url == server.url
        with Client(down, token, failover_s=0.5) as client, pytest.raises(ClientError) as error:
            client.jobs()
        assert error.value.message.startswith(f"cannot reach corral at {down}")
        with Client(f"{down},{down}", token, failover_s=0.5) as client:
            began = time.monotonic()
            with pytest.raises(ClientError):
                client.jobs()
            assert time.monotonic() - began >= 0.5  # tried again for `failover_s`
        assert [row.name for row in server.manager.store.list_jobs()] == ["reached"]
        # The CLI is the same client: `corral ls` with the same list finds the job.
        listed = CliRunner().invoke(
            app, ["ls"], env={"CORRAL_URL": f"{down},{standby_url}", "CORRAL_TOKEN": token}
        )
        assert listed.exit_code == 0, listed.output
        assert "reached" in listed.output
    finally:
        standby.stop()
        store.close()
        server.stop()


def test_a_lease_and_an_advisory_claim_exclude_each_other(postgres_url: str) -> None:
    # A manager that claims PostgreSQL by its advisory lock (built in-process, or a version
    # before leases) leads it: a lease is not taken while it runs, and is once it is gone; then
    # the advisory claim is refused while the lease is held, and granted once it is given up.
    claimed, leased, third = Store(postgres_url), Store(postgres_url), Store(postgres_url)
    try:
        claimed.claim()
        lease = Lease(leased, "http://leased", holder="leased", **LEASE)
        assert not lease.try_take()
        claimed.close()
        assert lease.try_take() and lease.epoch == 1
        with pytest.raises(StoreError, match="another corral manager is using this database"):
            third.claim()
        lease.stop()  # gives it up
        third.claim()
    finally:
        for store in (claimed, leased, third):
            store.close()
