"""Bulk control on a real manager with real job processes: cancel, hold and release by a filter
(state, user, VC, name glob) in one call, through the REST API, the SDK and `corral cancel`.

The cluster (2 GPUs, fifo: nothing is preempted) holds, by hand:

    id  user   name        state
    1   alice  sweep-run   RUNNING  (a process that runs until stopped)
    2   bob    b-run       RUNNING
    3   alice  sweep-1     PENDING
    4   alice  sweep-2     PENDING
    5   alice  other-1     PENDING
    6   bob    sweep-3     PENDING
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from sqlalchemy.pool import NullPool

from corral.cli.main import app
from corral.client import Client
from corral.server.auth import Principal, create_token
from corral.server.boot import ServerOptions, build_manager
from corral.server.bulk import JobFilter, parse_filter
from corral.server.store import StoreUnavailable
from tests.server.helpers import (
    admin_token,
    alive,
    api,
    fast_settings,
    job,
    run_server,
    start_server,
    submit,
    wait_for,
    wait_until,
)
from tests.server.postgres import PostgresServer

#: Writes its pid, then runs until stopped.
FOREVER = (
    "import os, pathlib, sys, time\n"
    "pathlib.Path(sys.argv[1]).write_text(str(os.getpid()))\n"
    "while True:\n"
    "    time.sleep(0.1)\n"
)


def forever(name: str, pid_file: Path) -> dict[str, Any]:
    command = [sys.executable, "-c", FOREVER, str(pid_file)]
    return {"name": name, "gpus": 1, "command": command, "grace_seconds": 2}


@pytest.fixture
def cluster(data_dir: Path, tmp_path: Path) -> Iterator[dict[str, Any]]:
    running = start_server(data_dir, gpus=2, policy="fifo")
    try:
        store = running.manager.store
        clients = {
            "admin": api(running.url, admin_token(data_dir)),
            "alice": api(running.url, create_token(store, "alice")),
            "bob": api(running.url, create_token(store, "bob")),
        }
        ids = {}
        for user, name in (
            ("alice", "sweep-run"),
            ("bob", "b-run"),
            ("alice", "sweep-1"),
            ("alice", "sweep-2"),
            ("alice", "other-1"),
            ("bob", "sweep-3"),
        ):
            ids[name] = submit(clients[user], **forever(name, tmp_path / f"{name}.pid"))
            if name.endswith("run"):  # started before the next is submitted: fifo keeps order
                wait_for(clients["admin"], ids[name], ["RUNNING"])
        yield {"server": running, "ids": ids, "pids": tmp_path, **clients}
    finally:
        running.stop()


def statuses(admin: httpx.Client, ids: dict[str, str]) -> dict[str, str]:
    return {name: job(admin, job_id)["status"] for name, job_id in ids.items()}


def test_a_users_filter_selects_exactly_their_matching_jobs_and_no_one_elses(
    cluster: dict[str, Any],
) -> None:
    ids, alice, admin = cluster["ids"], cluster["alice"], cluster["admin"]
    # alice, PENDING, sweep-*: her sweep-1 and sweep-2 (not her running sweep-run, not other-1,
    # not bob's sweep-3).
    answer = alice.post("/api/v1/jobs/cancel", json={"state": "PENDING", "name": "sweep-*"})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {
        "verb": "cancel",
        "count": 2,
        "ids": [ids["sweep-1"], ids["sweep-2"]],
    }
    # durable before the answer: the store says so already
    assert statuses(admin, ids) == {
        "sweep-run": "RUNNING",
        "b-run": "RUNNING",
        "sweep-1": "CANCELLED",
        "sweep-2": "CANCELLED",
        "other-1": "PENDING",
        "sweep-3": "PENDING",
    }
    # The same call again: nothing left to do (repeating is safe).
    again = alice.post("/api/v1/jobs/cancel", json={"state": "PENDING", "name": "sweep-*"})
    assert again.json() == {"verb": "cancel", "count": 0, "ids": []}
    # Another user's jobs: refused for a user, in one line; an empty filter is refused.
    refused = alice.post("/api/v1/jobs/cancel", json={"user": "bob"})
    assert refused.status_code == 403
    assert refused.json()["detail"] == ("user: bob: only an admin may act on another user's jobs")
    assert alice.post("/api/v1/jobs/cancel", json={}).status_code == 422
    bad = alice.post("/api/v1/jobs/cancel", json={"state": "DONE"})
    assert bad.status_code == 422 and bad.json()["detail"].startswith("state: DONE")
    assert alice.post("/api/v1/jobs/cancel", json={"owner": "x"}).status_code == 422
    # alice holds "every job" of hers (name *): only other-1 is pending and not held.
    held = alice.post("/api/v1/jobs/hold", json={"name": "*"}).json()
    assert held["ids"] == [ids["other-1"]]
    assert job(admin, ids["other-1"])["held_by"] == "alice"
    assert job(admin, ids["sweep-3"])["held_by"] is None  # bob's: untouched
    released = alice.post("/api/v1/jobs/release", json={"name": "other-*"}).json()
    assert released["ids"] == [ids["other-1"]]
    assert job(admin, ids["other-1"])["held_by"] is None


def test_an_admins_filter_reaches_every_user_and_running_jobs_are_stopped(
    cluster: dict[str, Any],
) -> None:
    ids, admin, pids = cluster["ids"], cluster["admin"], cluster["pids"]
    pid = int(wait_until(lambda: (p := pids / "sweep-run.pid").is_file() and p.read_text(), "pid"))
    # admin, any state, sweep-*: alice's running sweep-run, her sweep-1 and sweep-2, bob's
    # sweep-3; not b-run, not other-1.
    with Client(cluster["server"].url, admin_token(cluster["server"].manager.data_dir)) as sdk:
        answer = sdk.cancel_jobs(name="sweep-*")
    expected = [ids["sweep-run"], ids["sweep-1"], ids["sweep-2"], ids["sweep-3"]]
    assert answer == {"verb": "cancel", "count": 4, "ids": expected}
    assert statuses(admin, ids) == {
        "sweep-run": "CANCELLED",
        "b-run": "RUNNING",
        "sweep-1": "CANCELLED",
        "sweep-2": "CANCELLED",
        "other-1": "PENDING",
        "sweep-3": "CANCELLED",
    }
    wait_until(lambda: not alive(pid), "sweep-run's process to be stopped")
    # other-1 takes the GPU sweep-run left
    wait_for(admin, ids["other-1"], ["RUNNING"])
    # the VC filter: every job is in VC default
    assert admin.post("/api/v1/jobs/cancel", json={"vc": "elsewhere"}).json()["count"] == 0


def test_corral_cancel_by_filter_and_by_id(cluster: dict[str, Any]) -> None:
    ids, admin, server = cluster["ids"], cluster["admin"], cluster["server"]
    env = {"CORRAL_URL": server.url, "CORRAL_TOKEN": admin_token(server.manager.data_dir)}
    runner = CliRunner()
    result = runner.invoke(app, ["cancel", "-t", "PENDING", "-u", "bob"], env=env)
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"1 job cancelled: {ids['sweep-3']}"
    result = runner.invoke(app, ["cancel", ids["b-run"]], env=env)  # one id, as before
    assert result.exit_code == 0 and result.output.strip() == f"job {ids['b-run']} cancelled"
    result = runner.invoke(app, ["cancel", ids["other-1"], "--name", "x*"], env=env)
    assert result.exit_code != 0 and "not both" in result.output
    result = runner.invoke(app, ["hold"], env=env)
    assert result.exit_code != 0 and "give a JOB, or a filter" in result.output
    # b-run's GPU goes to sweep-1 (fifo): of alice's sweep-?, only sweep-2 is pending
    wait_for(admin, ids["sweep-1"], ["RUNNING"])
    result = runner.invoke(app, ["hold", "--user", "alice", "--name", "sweep-?"], env=env)
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"1 job held: {ids['sweep-2']}"
    assert job(admin, ids["sweep-2"])["held_by"] == "admin"
    result = runner.invoke(app, ["cancel", "--state", "pending", "-n", "*-?"], env=env)
    # sweep-2 (held, pending) and other-1; not the running sweep-1
    assert result.output.strip() == f"2 jobs cancelled: {ids['sweep-2']}, {ids['other-1']}"


def test_the_filter_is_read_field_by_field() -> None:
    alice = Principal("alice", None, False)
    root = Principal("root", None, True)
    assert parse_filter({"name": "s*"}, alice) == JobFilter(user="alice", name="s*")
    assert parse_filter({"state": ["running"]}, root) == JobFilter(frozenset({"RUNNING"}))
    chosen = parse_filter({"vc": "a", "name": "sweep-?"}, root)
    assert chosen.matches("PENDING", "bob", "a", "sweep-1")
    assert not chosen.matches("PENDING", "bob", "b", "sweep-1")  # another VC
    assert not chosen.matches("PENDING", "bob", "a", "sweep-10")  # ? is one character
    with pytest.raises(PermissionError):
        parse_filter({"user": "bob"}, alice)
    with pytest.raises(ValueError, match="name: must be a non-empty string"):
        parse_filter({"name": 3}, root)


def sql(url: str, statement: str) -> list[tuple[Any, ...]]:
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as connection:
            result = connection.exec_driver_sql(statement)
            return [tuple(row) for row in result] if result.returns_rows else []
    finally:
        engine.dispose()


def test_a_store_failure_mid_call_changes_nothing_answers_503_and_the_call_may_be_repeated(
    postgres: PostgresServer, data_dir: Path, tmp_path: Path
) -> None:
    options = ServerOptions(
        data_dir=data_dir,
        gpus=1,
        db_url=postgres.url,
        settings=fast_settings(policy="fifo"),
        single_user=True,
    )
    running = run_server(build_manager(options))
    try:
        client = api(running.url, admin_token(data_dir))
        first = submit(client, **forever("run", tmp_path / "run.pid"))
        wait_for(client, first, ["RUNNING"])
        waiting = [submit(client, **forever(f"w-{i}", tmp_path / f"w{i}.pid")) for i in range(5)]
        # The third waiting job's row, once it is written CANCELLED, sleeps in the database:
        # the call's transaction has written the first two by then, and the database stops.
        sql(
            postgres.url,
            "CREATE FUNCTION stall() RETURNS trigger AS $$ BEGIN PERFORM pg_sleep(120); "
            "RETURN NEW; END $$ LANGUAGE plpgsql",
        )
        sql(
            postgres.url,
            "CREATE TRIGGER stall BEFORE UPDATE ON jobs FOR EACH ROW WHEN "
            f"(NEW.id = {waiting[2]} AND NEW.status = 'CANCELLED') EXECUTE FUNCTION stall()",
        )
        answers: list[httpx.Response] = []
        call = threading.Thread(
            target=lambda: answers.append(
                client.post("/api/v1/jobs/cancel", json={"state": "PENDING"})
            )
        )
        call.start()
        try:
            sleeping = "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'"
            wait_until(lambda: sql(postgres.url, sleeping)[0][0] == 1, "the call mid-way")
            postgres.halt()
            call.join(120)
            assert answers and answers[0].status_code == 503, answers and answers[0].text
            assert answers[0].json()["detail"].startswith("the store is unavailable")
        finally:
            call.join(120)
            postgres.resume()
        sql(postgres.url, "DROP TRIGGER stall ON jobs")

        def pending() -> list[str] | None:
            try:
                rows = running.manager.store.list_jobs(status="PENDING")
            except StoreUnavailable:
                return None
            return sorted((row.id for row in rows), key=int) or None

        # nothing was cancelled, not even the two written before the stall: one transaction
        assert wait_until(pending, "the store back") == waiting
        assert job(client, first)["status"] == "RUNNING"

        def answered() -> httpx.Response | None:
            response = client.post("/api/v1/jobs/cancel", json={"state": "PENDING"})
            return None if response.status_code == 503 else response

        again = wait_until(answered, "the same call taken", timeout=120)
        assert again.json() == {"verb": "cancel", "count": 5, "ids": waiting}
        assert [job(client, job_id)["status"] for job_id in waiting] == ["CANCELLED"] * 5
        assert job(client, first)["status"] == "RUNNING"
    finally:
        running.stop()
