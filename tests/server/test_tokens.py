"""Tokens that expire and can be revoked (at once here, within RECHECK_S from another process on
the same database), the bounded verification cache, and the additive migration that lets a
database made by an earlier version (no such columns yet) keep working."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from corral.server import auth, migrations
from corral.server.auth import (
    Principal,
    create_token,
    ensure_admin_token,
    revoke_token,
    revoke_user,
    token_hash,
    token_id,
    verify,
)
from corral.server.store import JobRow, Store, StoreError, metadata


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store(Store.sqlite_url(tmp_path))
    yield opened
    opened.close()


@pytest.fixture
def recheck(monkeypatch: pytest.MonkeyPatch) -> float:
    """A short re-check interval, so that the tests need not wait a second."""
    monkeypatch.setattr(auth, "RECHECK_S", 0.2)
    return 0.2


class Queries:
    """Counts the statements a store sends."""

    def __init__(self, store: Store) -> None:
        self.statements: list[str] = []
        sa.event.listen(store._engine, "before_cursor_execute", self._seen)

    def _seen(self, *args: Any) -> None:
        self.statements.append(str(args[2]))

    def count(self) -> int:
        return len(self.statements)


# -- revocation and expiry ------------------------------------------------------------------------


def test_a_revoked_users_tokens_are_refused_at_once(store: Store) -> None:
    laptop = create_token(store, "alice", vc="vision", name="laptop")
    ci = create_token(store, "alice", vc="vision")
    bob = create_token(store, "bob")
    assert verify(store, laptop) and verify(store, ci) and verify(store, bob)  # now cached
    revoked = revoke_user(store, "alice")
    assert sorted(row.id for row in revoked) == sorted([token_id(laptop), token_id(ci)])
    assert all(row.revoked_at is not None for row in revoked)
    assert verify(store, laptop) is None and verify(store, ci) is None  # no restart, no wait
    assert verify(store, bob) == Principal("bob", None, False)
    assert revoke_user(store, "alice") == []  # nothing left to revoke
    states = {row.user: auth.token_state(row) for row in store.list_tokens()}
    assert states == {"alice": "revoked", "bob": "active"}


def test_one_token_is_revoked_by_its_id(store: Store) -> None:
    first = create_token(store, "alice")
    second = create_token(store, "alice")
    assert verify(store, first) and verify(store, second)
    row = revoke_token(store, token_id(first))
    assert row is not None and row.id == token_id(first) == token_hash(first)[:12]
    when = row.revoked_at
    assert verify(store, first) is None
    assert verify(store, second) == Principal("alice", None, False)
    again = revoke_token(store, token_id(first))  # already revoked: keeps its time
    assert again is not None and again.revoked_at == when
    for unknown in ("0" * 12, "nope", token_id(first)[:-1], token_id(first).upper(), "%" * 12):
        assert revoke_token(store, unknown) is None
    assert verify(store, second) is not None


def test_revoked_by_another_process_is_refused_within_the_recheck(
    tmp_path: Path, store: Store, recheck: float
) -> None:
    secret = create_token(store, "alice")
    assert verify(store, secret) is not None
    other = Store(Store.sqlite_url(tmp_path))  # `corral` of another manager, or psql
    try:
        revoke_user(other, "alice")
    finally:
        other.close()
    deadline = time.monotonic() + recheck + 0.05
    while verify(store, secret) is not None:
        assert time.monotonic() < deadline, "still accepted after the re-check interval"
        time.sleep(0.01)


def test_an_expired_token_is_refused_without_waiting_for_the_recheck(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(auth, "RECHECK_S", 3600.0)  # the cache alone must notice the expiry
    past = create_token(store, "old", expires_at=time.time() - 1)
    assert verify(store, past) is None
    soon = create_token(store, "brief", expires_at=time.time() + 0.3)
    assert verify(store, soon) == Principal("brief", None, False)
    time.sleep(0.35)
    assert verify(store, soon) is None
    (row,) = [row for row in store.list_tokens() if row.user == "brief"]
    assert auth.token_state(row) == "expired" and row.revoked_at is None


def test_the_principal_carries_the_unix_user(store: Store) -> None:
    secret = create_token(store, "Alice Smith", vc="vision", unix_user="asmith")
    assert verify(store, secret) == Principal("Alice Smith", "vision", False, "asmith")
    assert verify(store, create_token(store, "bob")) == Principal("bob", None, False, None)


# -- the cache: bounded in time, one indexed query ----------------------------------------------


def test_a_verified_token_costs_one_indexed_query_per_recheck(store: Store, recheck: float) -> None:
    secret = create_token(store, "alice")
    queries = Queries(store)
    assert verify(store, secret) is not None
    assert queries.count() == 1
    for _ in range(100):
        assert verify(store, secret) is not None
    assert queries.count() == 1  # cached
    time.sleep(recheck + 0.01)
    assert verify(store, secret) is not None
    assert queries.count() == 2  # looked up again, once
    with store._engine.connect() as connection:
        plan = connection.exec_driver_sql(
            "EXPLAIN QUERY PLAN " + queries.statements[-1], (token_hash(secret),)
        ).all()
    assert any("USING INDEX" in str(step) and "sha256=?" in str(step) for step in plan), plan


def test_a_revocation_racing_a_lookup_does_not_leave_the_token_cached(store: Store) -> None:
    secret = create_token(store, "alice")
    original = store.token_by_hash

    def slow_lookup(digest: str):  # the revocation lands between the lookup and the caching
        row = original(digest)
        revoke_user(store, "alice")
        return row

    store.token_by_hash = slow_lookup  # type: ignore[method-assign]
    assert verify(store, secret) is not None  # it was valid when looked up
    store.token_by_hash = original  # type: ignore[method-assign]
    assert verify(store, secret) is None  # but not cached past the revocation


def test_verification_stays_cheap(store: Store, recheck: float) -> None:
    """Per request: a dictionary lookup, and one indexed query per token and re-check interval
    (the cost itself is measured in the closing note of the change, not asserted here)."""
    secret = create_token(store, "alice")
    verify(store, secret)
    queries = Queries(store)
    for _ in range(10_000):
        verify(store, secret)
    assert queries.count() == 0  # all from the cache
    for _ in range(3):
        auth._forget_verified(store)
        verify(store, secret)
    assert queries.count() == 3
    assert all("tokens" in statement for statement in queries.statements)


# -- the admin's token ----------------------------------------------------------------------------


def test_a_revoked_admin_token_is_replaced_at_the_next_start(tmp_path: Path, store: Store) -> None:
    path = ensure_admin_token(store, tmp_path)
    old = path.read_text().strip()
    assert revoke_token(store, token_id(old)) is not None
    assert verify(store, old) is None
    ensure_admin_token(store, tmp_path)  # what `corral up` does at its start
    new = path.read_text().strip()
    assert new != old and verify(store, new) == Principal("admin", None, True)
    assert ensure_admin_token(store, tmp_path).read_text().strip() == new  # kept from then on


def test_an_expired_admin_token_is_replaced_too(tmp_path: Path, store: Store) -> None:
    path = tmp_path / "admin.token"
    path.write_text(create_token(store, "admin", admin=True, expires_at=time.time() - 1) + "\n")
    ensure_admin_token(store, tmp_path)
    assert verify(store, path.read_text().strip()) == Principal("admin", None, True)


# -- what a token may name ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"user": "al\x00ice"}, "user: must not contain control or invisible characters"),
        ({"user": "alice\nINFO forged"}, "user: must not contain control"),
        ({"user": "x" * 129}, "user: at most 128 characters (got 129)"),
        ({"user": "a", "vc": "v\x00"}, "vc: must not contain control"),
        ({"user": "a", "vc": "v" * 500}, "vc: at most 128 characters (got 500)"),
        ({"user": "a", "unix_user": "Alice"}, "unix_user: 'Alice' is not a portable"),
        ({"user": "a", "unix_user": "1alice"}, "unix_user: '1alice' is not a portable"),
        ({"user": "a", "unix_user": "-alice"}, "unix_user: '-alice' is not a portable"),
        ({"user": "a", "unix_user": "al ice"}, "unix_user: 'al ice' is not a portable"),
        ({"user": "a", "unix_user": "al\x00"}, "unix_user: 'al\\x00' is not a portable"),
        ({"user": "a", "unix_user": "ali$ce"}, "unix_user: 'ali$ce' is not a portable"),
        ({"user": "a", "unix_user": "é"}, "unix_user: 'é' is not a portable"),
        ({"user": "a", "unix_user": "a" * 33}, "unix_user: 33 characters is not a portable"),
        ({"user": "a", "unix_user": ""}, "unix_user: '' is not a portable"),
    ],
)
def test_names_that_cannot_be_stored_are_refused(
    store: Store, fields: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError) as caught:
        create_token(store, **fields)  # type: ignore[arg-type]
    assert str(caught.value).startswith(message), caught.value
    assert "\n" not in str(caught.value)
    assert store.list_tokens() == []


@pytest.mark.parametrize("name", ["alice", "_svc", "a-b_c9", "machine$", "a" * 32])
def test_portable_unix_user_names_are_accepted(store: Store, name: str) -> None:
    assert verify(store, create_token(store, "u", unix_user=name)) == Principal(
        "u", None, False, name
    )


# -- the additive migration -----------------------------------------------------------------------

# The tables as the previous version created them (SQLite's spelling of its DDL).
OLD_JOBS = """CREATE TABLE jobs (
    id INTEGER NOT NULL, name VARCHAR NOT NULL, user VARCHAR NOT NULL, vc VARCHAR NOT NULL,
    priority VARCHAR NOT NULL, gpus INTEGER NOT NULL, spec TEXT NOT NULL,
    status VARCHAR NOT NULL, reason TEXT NOT NULL, submitted_at FLOAT NOT NULL,
    started_at FLOAT, finished_at FLOAT, attempts INTEGER NOT NULL, failures INTEGER NOT NULL,
    preemptions INTEGER NOT NULL, attained_gpu_s FLOAT NOT NULL, executed_s FLOAT NOT NULL,
    exit_code INTEGER, PRIMARY KEY (id))"""
OLD_TOKENS = """CREATE TABLE tokens (
    sha256 VARCHAR(64) NOT NULL, user VARCHAR NOT NULL, vc VARCHAR, admin BOOLEAN NOT NULL,
    created_at FLOAT NOT NULL, name VARCHAR, PRIMARY KEY (sha256))"""
OLD_JOB = (
    "INSERT INTO jobs VALUES (1, 'old', 'alice', 'vision', 'normal', 1, '{\"name\": \"old\"}', "
    "'SUCCEEDED', '', 1.0, 2.0, 3.0, 1, 0, 0, 1.0, 1.0, 0)"
)


def make_old_database(url: str, quote: str = '"') -> str:
    """A database as the previous version left it, with a job and alice's token; returns the
    token's secret."""
    secret = "a token made by the previous version"
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        for statement in (OLD_JOBS, OLD_TOKENS, OLD_JOB):
            # `user` is a reserved word in PostgreSQL: quoted as the old version's SQLAlchemy did
            connection.exec_driver_sql(statement.replace(" user ", f" {quote}user{quote} "))
        connection.exec_driver_sql(
            f"INSERT INTO tokens (sha256, {quote}user{quote}, vc, admin, created_at, name) "
            f"VALUES ('{token_hash(secret)}', 'alice', 'vision', false, 1.0, 'laptop')"
        )
    engine.dispose()
    return secret


def check_old_database_works(url: str, secret: str) -> None:
    store = Store(url)
    try:
        columns = {
            table: {column["name"] for column in sa.inspect(store._engine).get_columns(table)}
            for table in ("jobs", "tokens")
        }
        assert {"unix_user"} <= columns["jobs"]
        assert {"expires_at", "revoked_at", "unix_user"} <= columns["tokens"]
        assert verify(store, secret) == Principal("alice", "vision", False, None)
        old = store.get_job(1)
        assert old is not None and (old.name, old.status, old.unix_user) == (
            "old",
            "SUCCEEDED",
            None,
        )
        row = JobRow.new(
            2,
            name="new",
            user="alice",
            vc="vision",
            priority="normal",
            gpus=1,
            spec={},
            submitted_at=5.0,
            unix_user="alice",
        )
        store.insert_jobs([row])
        store.insert_job(
            3, name="n", user="bob", vc="v", priority="p", gpus=1, spec={}, submitted_at=6.0
        )
        stored = [store.get_job(job_id) for job_id in (1, 2, 3)]
        assert [job and job.unix_user for job in stored] == [None, "alice", None]
        assert [row.user for row in revoke_user(store, "alice")] == ["alice"]
        assert verify(store, secret) is None
    finally:
        store.close()
    before = columns_of(url)
    again = Store(url)  # a second start finds nothing to add: the database is at head
    try:
        with again._engine.connect() as connection:
            assert migrations.current(connection) == migrations.head()
    finally:
        again.close()
    assert columns_of(url) == before


def columns_of(url: str) -> dict[str, set[str]]:
    engine = sa.create_engine(url)
    try:
        inspector = sa.inspect(engine)
        return {
            table: {column["name"] for column in inspector.get_columns(table)}
            for table in inspector.get_table_names()
        }
    finally:
        engine.dispose()


def test_a_sqlite_database_of_the_previous_version_is_migrated(tmp_path: Path) -> None:
    url = Store.sqlite_url(tmp_path)
    secret = make_old_database(url)
    check_old_database_works(url, secret)


def test_a_postgresql_database_of_the_previous_version_is_migrated(postgres_url: str) -> None:
    secret = make_old_database(postgres_url)
    check_old_database_works(postgres_url, secret)


def test_the_migration_adds_only_what_is_missing(tmp_path: Path) -> None:
    url = Store.sqlite_url(tmp_path)
    make_old_database(url)
    before = columns_of(url)
    Store(url).close()
    after = columns_of(url)
    added = {f"{table}.{column}" for table in before for column in after[table] - before[table]}
    assert added == {
        "jobs.unix_user",
        "jobs.workers",
        "jobs.step",
        "jobs.total_steps",
        "jobs.steps_per_s",
        "jobs.loss",
        "jobs.progress_at",
        "tokens.expires_at",
        "tokens.revoked_at",
        "tokens.unix_user",
        # migration 0002: holds and job arrays
        "jobs.held_by",
        "jobs.array_id",
        "jobs.array_index",
        # migration 0006: a submission's idempotency key
        "jobs.submit_key",
    }
    # the tables it lacked are made whole, alembic's own besides
    assert set(after) - set(before) == set(metadata.tables) - {"jobs", "tokens"} | {
        "alembic_version"
    }


def test_a_missing_not_null_column_is_a_one_line_error(tmp_path: Path) -> None:
    url = Store.sqlite_url(tmp_path)
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        connection.exec_driver_sql("CREATE TABLE meta (key VARCHAR NOT NULL PRIMARY KEY)")
    engine.dispose()
    with pytest.raises(StoreError) as caught:
        Store(url)
    assert str(caught.value) == f"{url}: table meta lacks column value (NOT NULL)"
    assert "value" in metadata.tables["meta"].c
    # the upgrade is one transaction: the tables it made before the error are gone again
    assert columns_of(url) == {"meta": {"key"}}
