"""The embedded manager on a real PostgreSQL server: real job processes, HTTP on loopback, a restart.

The same manager as tests/server/test_manager.py, with `--db URL` instead of the SQLite file in
the data directory; the data directory still holds the admin token and the jobs' files.
"""

from __future__ import annotations

import csv
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from sqlalchemy.pool import NullPool

from corral.cli.main import app
from corral.server.boot import RunningServer, ServerOptions, build_manager
from tests.server.helpers import (
    admin_token,
    api,
    fast_settings,
    job,
    python_job,
    run_server,
    submit,
    wait_for,
)

HOLD_GPUS = "import time; time.sleep(600)"  # until the test cancels it, or its fixture kills it


def start_on(url: str, data_dir: Path) -> RunningServer:
    options = ServerOptions(
        data_dir=data_dir, gpus=2, db_url=url, settings=fast_settings(), single_user=True
    )
    return run_server(build_manager(options))


def stop(server: RunningServer) -> None:
    server.stop()
    server.manager.store.close()


def rows(url: str, query: str) -> list[tuple[object, ...]]:
    """Ask PostgreSQL itself, not the manager: what did it really store?"""
    engine = sa.create_engine(url, poolclass=NullPool)
    with engine.connect() as connection:
        found = [tuple(row) for row in connection.exec_driver_sql(query)]
    engine.dispose()
    return found


def test_jobs_run_and_a_restarted_server_finds_every_job_in_postgresql(
    postgres_url: str, data_dir: Path
) -> None:
    server = start_on(postgres_url, data_dir)
    try:
        client = api(server.url, admin_token(data_dir))
        done = submit(client, **python_job("hello", "print('hello from a job')"))
        finished = wait_for(client, done)
        assert (finished["status"], finished["exit_code"], finished["attempts"]) == (
            "SUCCEEDED",
            0,
            1,
        )
        logs = client.get(f"/api/v1/jobs/{done}/logs", params={"attempt": 1})
        assert logs.text == "hello from a job\n"
        holder = submit(client, **python_job("holder", HOLD_GPUS, gpus=2, grace_seconds=1))
        wait_for(client, holder, ["RUNNING"])
        waiting = submit(client, **python_job("waits", "print('ran after the restart')"))
        assert job(client, waiting)["status"] == "PENDING"  # both GPUs are the holder's
    finally:
        stop(server)
    assert (done, holder, waiting) == ("1", "2", "3")
    # the state is in PostgreSQL, and nothing went to a SQLite file on the side
    assert rows(postgres_url, "SELECT id, status, attempts FROM jobs ORDER BY id") == [
        (1, "SUCCEEDED", 1),
        (2, "RUNNING", 1),
        (3, "PENDING", 0),
    ]
    assert not (data_dir / "corral.db").exists()

    again = start_on(postgres_url, data_dir)
    try:
        client = api(again.url, admin_token(data_dir))
        found = job(client, done)
        assert (found["status"], found["finished_at"]) == ("SUCCEEDED", finished["finished_at"])
        running = job(client, holder)  # still its first attempt: found again, not started twice
        assert running["status"] == "RUNNING"
        assert [a["number"] for a in running["attempt_history"]] == [1]
        assert job(client, waiting)["status"] == "PENDING"
        assert submit(client, **python_job("next", "pass")) == "4"  # ids go on from the store
        assert client.post(f"/api/v1/jobs/{holder}/cancel").json()["status"] == "CANCELLED"
        ran = wait_for(client, waiting)
        assert (ran["status"], ran["attempts"]) == ("SUCCEEDED", 1)
        logs = client.get(f"/api/v1/jobs/{waiting}/logs", params={"attempt": 1})
        assert logs.text == "ran after the restart\n"
        wait_for(client, "4")
    finally:
        stop(again)
    assert rows(postgres_url, "SELECT id, status FROM jobs ORDER BY id") == [
        (1, "SUCCEEDED"),
        (2, "CANCELLED"),
        (3, "SUCCEEDED"),
        (4, "SUCCEEDED"),
    ]


def test_a_restart_whose_executor_answers_slowly_holds_no_transaction_open_meanwhile(
    postgres_url: str, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A leader sharing PostgreSQL has its sessions ended after 4 s idle in a transaction
    # (docs/ha.md), and finding a running attempt again may take longer (on Ray, an actor's
    # answer under load). Recovery asks the executor first and writes after, in a transaction
    # of its own. Here PostgreSQL ends sessions idle in a transaction for 0.5 s and each lookup
    # takes 1 s: the restarted manager must start and find the running job again (the same
    # attempt, its "found running" event), where a transaction kept open across the lookups
    # would be ended and the manager's start would fail.
    server = start_on(postgres_url, data_dir)
    try:
        client = api(server.url, admin_token(data_dir))
        holder = submit(client, **python_job("holder", HOLD_GPUS, gpus=2, grace_seconds=1))
        wait_for(client, holder, ["RUNNING"])
    finally:
        stop(server)
    engine = sa.create_engine(postgres_url, poolclass=NullPool)
    with engine.begin() as connection:
        connection.exec_driver_sql(
            "ALTER DATABASE corral SET idle_in_transaction_session_timeout = '500ms'"
        )
    engine.dispose()
    options = ServerOptions(
        data_dir=data_dir, gpus=2, db_url=postgres_url, settings=fast_settings(), single_user=True
    )
    manager = build_manager(options)
    find = manager.executor.recover

    def slowly(*args: Any) -> Any:
        time.sleep(1.0)
        return find(*args)

    monkeypatch.setattr(manager.executor, "recover", slowly)
    again = run_server(manager)
    try:
        client = api(again.url, admin_token(data_dir))
        running = job(client, holder)
        assert running["status"] == "RUNNING"
        assert [a["number"] for a in running["attempt_history"]] == [1]
        assert "attempt 1 found running" in [e["message"] for e in running["events"]]
        assert client.post(f"/api/v1/jobs/{holder}/cancel").json()["status"] == "CANCELLED"
    finally:
        stop(again)


BAD_SPECS = [
    ({"name": "x", "gpus": 0, "command": "true"}, "gpus: must be a positive integer"),
    (
        {"name": "x", "gpus": 3, "command": "true"},
        "gpus: asks for 3 GPUs but the cluster has only 2 GPUs",
    ),
    ({"name": "x", "gpus": 1, "command": "true", "colour": "red"}, "colour: unknown field"),
]


def test_a_bad_spec_is_refused_and_postgresql_stores_nothing(
    postgres_url: str, data_dir: Path
) -> None:
    server = start_on(postgres_url, data_dir)
    try:
        client = api(server.url, admin_token(data_dir))
        for body, message in BAD_SPECS:
            response = client.post("/api/v1/jobs", json=body)
            assert response.status_code == 422
            assert response.json()["detail"].startswith(message)
        assert client.get("/api/v1/jobs").json() == []
        assert rows(postgres_url, "SELECT count(*) FROM jobs") == [(0,)]
        assert rows(postgres_url, "SELECT count(*) FROM events WHERE job_id IS NOT NULL") == [(0,)]
        assert submit(client, **python_job("ok", "pass")) == "1"  # no id was used up
    finally:
        stop(server)


def test_export_trace_reads_the_history_from_postgresql(
    postgres_url: str, data_dir: Path, tmp_path: Path
) -> None:
    server = start_on(postgres_url, data_dir)
    try:
        client = api(server.url, admin_token(data_dir))
        short = submit(client, **python_job("short", "import time; time.sleep(0.3)"))
        wait_for(client, short)
        holder = submit(client, **python_job("holder", HOLD_GPUS, gpus=2, grace_seconds=1))
        wait_for(client, holder, ["RUNNING"])
        never = submit(client, **python_job("never", "pass"))
        assert client.post(f"/api/v1/jobs/{never}/cancel").json()["status"] == "CANCELLED"
        assert client.post(f"/api/v1/jobs/{holder}/cancel").json()["status"] == "CANCELLED"
        wait_for(client, holder)
    finally:
        stop(server)
    out = tmp_path / "history.csv"
    # --db alone: the default data directory has no corral.db and must not be needed
    result = CliRunner().invoke(app, ["export-trace", "--db", postgres_url, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "wrote 2 jobs" in result.output and "(1 that never ran left out)" in result.output
    with out.open() as handle:
        written = {row["job_id"]: row for row in csv.DictReader(handle)}
    assert sorted(written) == [short, holder]
    assert (written[short]["state"], written[short]["gpu_num"]) == ("COMPLETED", "1")
    assert (written[holder]["state"], written[holder]["gpu_num"]) == ("CANCELLED", "2")
    assert 0.25 < float(written[short]["duration"]) < 60  # it slept 0.3 s (slower under load)


def test_a_second_manager_on_the_same_postgresql_database_is_refused(
    postgres_url: str, tmp_path: Path
) -> None:
    from corral.server.boot import BootError

    first = build_manager(
        ServerOptions(data_dir=tmp_path / "one", gpus=1, db_url=postgres_url, single_user=True)
    )
    try:
        # Another data directory, the same database: its jobs would run twice.
        with pytest.raises(BootError, match="another corral manager is using this database"):
            build_manager(
                ServerOptions(
                    data_dir=tmp_path / "two", gpus=1, db_url=postgres_url, single_user=True
                )
            )
    finally:
        first.stop()
    second = build_manager(
        ServerOptions(data_dir=tmp_path / "two", gpus=1, db_url=postgres_url, single_user=True)
    )
    second.stop()  # the advisory lock went with the first manager's connection
