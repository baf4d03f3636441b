"""The store's Alembic migrations on real SQLite and PostgreSQL databases: the previous release's
schema with its rows (tests/server/fixtures, dumped from the pre-Alembic code) upgrades and reads
back; a fresh database is exactly the tables in store.py (so a change to them without a revision
fails here); a database of a newer corral is refused and left as it was; two processes opening one
database at once migrate it once."""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.pool import NullPool

from corral.server import migrations
from corral.server.store import ProfileRow, Store, StoreError, metadata

FIXTURES = Path(__file__).parent / "fixtures"
T0 = 1_700_000_000.0  # the fixtures' clock (make_schema_v1.py)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return Store.sqlite_url(tmp_path)
    return str(request.getfixturevalue("postgres_url"))


def load_fixture(url: str) -> None:
    """The previous release's database, as its dump made it."""
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        if engine.dialect.name == "sqlite":
            connection = sqlite3.connect(engine.url.database)
            try:
                connection.executescript((FIXTURES / "schema-v1.sqlite.sql").read_text())
            finally:
                connection.close()
        else:
            with engine.begin() as connection:
                # no parameters: psycopg sends the dump's statements as one simple query
                connection.exec_driver_sql((FIXTURES / "schema-v1.postgresql.sql").read_text())
    finally:
        engine.dispose()


def differences(url: str) -> list[object]:
    """What separates the database's tables from store.py's (alembic's autogenerate compare)."""
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            return list(compare_metadata(context, metadata))
    finally:
        engine.dispose()


def revision_of(url: str) -> str | None:
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            return migrations.current(connection)
    finally:
        engine.dispose()


def snapshot(url: str) -> dict[str, object]:
    """Every table's columns and rows, to tell that a database was not touched."""
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        found = sa.MetaData()
        found.reflect(engine)
        with engine.connect() as connection:
            return {
                name: (
                    [column.name for column in table.columns],
                    sorted(map(tuple, connection.execute(sa.select(table))), key=repr),
                )
                for name, table in found.tables.items()
            }
    finally:
        engine.dispose()


def sha(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def test_the_previous_release_s_database_upgrades_and_reads_back(database_url: str) -> None:
    load_fixture(database_url)
    assert revision_of(database_url) is None  # made before Alembic
    store = Store(database_url)
    try:
        jobs = {job.id: job for job in store.list_jobs()}
        assert {job_id: job.status for job_id, job in jobs.items()} == {
            "1": "SUCCEEDED",
            "2": "RUNNING",
            "3": "PENDING",
            "4": "FAILED",
            "5": "CANCELLED",
        }
        assert jobs["3"].workers == 2 and jobs["3"].reason == "waiting for 4 GPUs"
        first = store.get_job(1)
        assert first is not None
        assert (first.spec["total_steps"], first.exit_code, first.attained_gpu_s) == (100, 0, 62.0)
        assert first.progress is not None
        assert (first.progress.step, first.progress.total_steps, first.progress.loss) == (
            100.0,
            100.0,
            0.5,
        )
        second = store.get_job("2")
        assert second is not None and (second.unix_user, second.preemptions) == ("bob", 1)
        assert [(a.number, a.outcome, a.gpus) for a in store.attempts(2)] == [
            (1, "preempted", ["node-1/0"]),
            (2, None, ["node-1/1"]),
        ]
        assert [(a.number, a.prerun, a.outcome, a.exit_code) for a in store.attempts(4)] == [
            (1, True, "pre-run", 0),
            (2, False, "failed", 3),
        ]
        unfinished = {job.id: attempts for job, attempts in store.unfinished_jobs()}
        assert set(unfinished) == {"2", "3"}
        assert [a.number for a in unfinished["2"]] == [1, 2]
        assert [(p.at - T0, p.step, p.loss) for p in store.progress(1)] == [
            (20.0, 10.0, 2.5),
            (30.0, 50.0, 1.25),
            (40.0, 100.0, 0.5),
        ]
        assert [event.message for event in store.events(None)] == ["manager started"]
        assert [event.kind for event in store.events(2)] == ["preempted"]
        admin = store.token_by_hash(sha("secret-admin"))
        assert admin is not None and (admin.user, admin.admin) == ("root", True)
        alice = store.token_by_hash(sha("secret-alice"))
        assert alice is not None and alice.expires_at == T0 + 86400 and not alice.admin
        bob = store.token_by_hash(sha("secret-bob"))
        assert bob is not None and bob.revoked_at == T0 + 100
        # by creation time, then hash: secret-bob's 121d..., secret-admin's 3ca2..., alice's 9596...
        assert [token.user for token in store.list_tokens()] == ["bob", "root", "alice"]
        # measured before profiles were kept per VC: no VC's (every VC reads them)
        assert [(p.model, p.gpu_type, p.steps_per_s, p.vc) for p in store.profiles()] == [
            ("bert", "V100", 1.5, ""),
            ("resnet", "A100", 4.0, ""),
        ]
        assert store.get_meta("config") == '{"cluster": "2x4"}'
        # and it takes new rows: the next job id, an event after the old ones (PostgreSQL's
        # sequence was restored by the dump), a profile replaced
        assert store.max_job_id() == 5
        store.insert_job(
            6,
            name="new",
            user="dan",
            vc="vc-a",
            priority="guaranteed",
            gpus=1,
            spec={},
            submitted_at=T0 + 200,
        )
        store.add_event(6, T0 + 200, "submitted", "by dan")
        assert [event.id for event in store.events(6)] == [6]
        store.save_profile(ProfileRow("bert", "V100", 1, 1, "gpt", 2.0, None, 20.0, 2, T0 + 300))
        assert [p.steps_per_s for p in store.profiles()] == [2.0, 4.0]
        # a VC's own measurement of the same shape is a row of its own
        store.save_profile(
            ProfileRow("bert", "V100", 1, 1, "gpt", 3.0, None, 20.0, 1, T0 + 300, vc="vc-a")
        )
        assert [(p.vc, p.steps_per_s) for p in store.profiles()] == [
            ("", 2.0),
            ("vc-a", 3.0),
            ("", 4.0),
        ]
        assert store.set_shared("bert", True, "root", T0 + 400)
        assert not store.set_shared("bert", True, "root", T0 + 400)
        assert [(m.model, m.marked_by) for m in store.shared_models()] == [("bert", "root")]
    finally:
        store.close()
    assert revision_of(database_url) == migrations.head()
    assert differences(database_url) == []


def test_a_fresh_database_is_exactly_the_tables_of_store_py(database_url: str) -> None:
    Store(database_url).close()
    assert revision_of(database_url) == migrations.head()
    # A change to the tables in store.py without a migration that makes it fails here.
    assert differences(database_url) == []


def test_a_database_of_a_newer_corral_is_refused_and_untouched(database_url: str) -> None:
    Store(database_url).close()
    engine = sa.create_engine(database_url, poolclass=NullPool)
    with engine.begin() as connection:
        connection.exec_driver_sql("UPDATE alembic_version SET version_num = '0099'")
        # what the newer version may have changed: a column this code does not know
        connection.exec_driver_sql("ALTER TABLE jobs ADD COLUMN newer INTEGER")
    engine.dispose()
    before = snapshot(database_url)
    with pytest.raises(StoreError) as caught:
        Store(database_url)
    shown = sa.make_url(database_url).render_as_string(hide_password=True)
    assert str(caught.value) == (
        f"the database at {shown} is at schema revision 0099, newer than this corral "
        f"(head {migrations.head()}): upgrade corral"
    )
    assert snapshot(database_url) == before


def test_two_processes_opening_one_empty_database_migrate_it_once(database_url: str) -> None:
    # Two Stores, each with its own engine and lock, as two managers starting at once would be.
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def open_it() -> None:
        try:
            barrier.wait(timeout=60)
            Store(database_url).close()
        except BaseException as error:  # noqa: BLE001 (reported below)
            errors.append(error)

    threads = [threading.Thread(target=open_it) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == [] and not any(thread.is_alive() for thread in threads)
    engine = sa.create_engine(database_url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            versions = list(connection.exec_driver_sql("SELECT version_num FROM alembic_version"))
    finally:
        engine.dispose()
    assert versions == [(migrations.head(),)]
    assert differences(database_url) == []


def test_the_migration_tool_reports_and_upgrades(tmp_path: Path) -> None:
    url = Store.sqlite_url(tmp_path)

    def tool(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "corral.server.migrations", *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)

    assert tool("--db", url, "current").stdout == "(no revision)\n"
    assert tool("--db", url, "upgrade").returncode == 0
    assert tool("--db", url, "current").stdout == f"{migrations.head()}\n"
    history = tool("history")
    assert history.returncode == 0 and "<base> -> 0001" in history.stdout
    assert f"-> {migrations.head()} (head)" in history.stdout
    missing = tool("current")
    assert missing.returncode == 2 and "give the database: --db URL" in missing.stderr
    engine = sa.create_engine(url, poolclass=NullPool)
    with engine.begin() as connection:
        connection.exec_driver_sql("UPDATE alembic_version SET version_num = '0099'")
    engine.dispose()
    refused = tool("--db", url, "upgrade")
    assert refused.returncode == 1
    assert refused.stdout.strip().endswith(f"(head {migrations.head()}): upgrade corral")
    assert len(refused.stdout.splitlines()) == 1


def test_revisions_are_numbered_after_the_head() -> None:
    head = migrations.head()
    assert len(head) == 4 and head.isdigit() and head >= "0002"
    assert migrations.next_revision_id() == f"{int(head) + 1:04d}"


def test_an_upgrade_that_pauses_is_not_ended_by_the_fencing_idle_timeout(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A manager's store ends its PostgreSQL sessions idle in a transaction for more than
    # idle_transaction_s (a paused leader must not hold the lease's row: docs/ha.md). The
    # schema's upgrade is one transaction whose pauses between statements (Alembic loading its
    # scripts) ran past 4 s on a loaded machine, and the manager could not start ("terminating
    # connection due to idle-in-transaction timeout"). Here the upgrade pauses 1.5 s in its
    # transaction with a 0.5 s limit: it must still reach the head.
    upgrade = migrations._upgrade

    def slow(connection: sa.Connection, url: str) -> str | None:
        connection.execute(sa.text("SELECT 1"))
        time.sleep(1.5)  # the pause under test: idle in the open transaction
        return upgrade(connection, url)

    monkeypatch.setattr(migrations, "_upgrade", slow)
    store = Store(postgres_url, idle_transaction_s=0.5)
    try:
        assert differences(postgres_url) == []
    finally:
        store.close()
