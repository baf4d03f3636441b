"""The store on a real SQLite file and a real PostgreSQL server: round trips, filters, batches,
reopening."""

from __future__ import annotations

import socket
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from corral.core.job import JobStatus
from corral.server.store import (
    AttemptRow,
    EventRow,
    JobRow,
    Store,
    StoreError,
    TokenRow,
)

SPEC = {"name": "train", "gpus": 2, "command": "python train.py", "env": {"A": "1"}}


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Every test that takes `store` or `database_url` runs on a SQLite file and on a real
    PostgreSQL server (an empty database each time: tests/server/postgres.py)."""
    if request.param == "sqlite":
        return Store.sqlite_url(tmp_path)
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def store(database_url: str) -> Iterator[Store]:
    opened = Store(database_url)
    yield opened
    opened.close()


def add_job(store: Store, job_id: int, user: str = "alice", vc: str = "vision", **extra: object):
    fields: dict[str, object] = {
        "name": f"job{job_id}",
        "user": user,
        "vc": vc,
        "priority": "guaranteed",
        "gpus": 2,
        "spec": SPEC,
        "submitted_at": 1000.0 + job_id,
    }
    fields.update(extra)
    store.insert_job(job_id, **fields)  # type: ignore[arg-type]


def ids(rows: list[JobRow]) -> list[str]:
    return [row.id for row in rows]


def test_the_url_points_at_corral_db_in_the_data_dir(tmp_path: Path) -> None:
    assert Store.sqlite_url(tmp_path) == f"sqlite:///{tmp_path.resolve()}/corral.db"


def test_a_job_round_trips_with_every_field(store: Store) -> None:
    add_job(store, 1, reason="waiting for GPUs")
    assert store.get_job("1") == JobRow(
        id="1",
        name="job1",
        user="alice",
        vc="vision",
        priority="guaranteed",
        gpus=2,
        spec=SPEC,
        status="PENDING",
        reason="waiting for GPUs",
        submitted_at=1001.0,
        started_at=None,
        finished_at=None,
        attempts=0,
        failures=0,
        preemptions=0,
        attained_gpu_s=0.0,
        executed_s=0.0,
        exit_code=None,
    )
    assert store.get_job(1) == store.get_job(" 1 ")
    for unknown in (2, "2", "abc", "", "-1", "1.0", "9" * 40):
        assert store.get_job(unknown) is None


def test_a_duplicate_id_is_refused(store: Store) -> None:
    add_job(store, 1)
    with pytest.raises(sa.exc.IntegrityError):
        add_job(store, 1)


def test_max_job_id_is_the_highest_ever_inserted(store: Store) -> None:
    assert store.max_job_id() == 0
    add_job(store, 5)
    add_job(store, 2)
    assert store.max_job_id() == 5


def test_list_jobs_newest_first_with_filters(store: Store) -> None:
    add_job(store, 1, user="alice", vc="vision")
    add_job(store, 2, user="bob", vc="vision", status="RUNNING")
    add_job(store, 3, user="carol", vc="nlp")
    add_job(store, 4, user="alice", vc="nlp", status="SUCCEEDED")
    assert ids(store.list_jobs()) == ["4", "3", "2", "1"]
    assert ids(store.list_jobs(status="PENDING")) == ["3", "1"]
    assert ids(store.list_jobs(status=["RUNNING", "SUCCEEDED"])) == ["4", "2"]
    assert ids(store.list_jobs(vc="nlp")) == ["4", "3"]
    assert ids(store.list_jobs(user="alice")) == ["4", "1"]
    assert ids(store.list_jobs(user="alice", vc="vision")) == ["1"]
    assert ids(store.list_jobs(limit=2)) == ["4", "3"]
    assert ids(store.list_jobs(status="FAILED")) == []


def test_visibility_is_own_jobs_plus_the_vc(store: Store) -> None:
    add_job(store, 1, user="alice", vc="vision")
    add_job(store, 2, user="bob", vc="vision")
    add_job(store, 3, user="carol", vc="nlp")
    add_job(store, 4, user="alice", vc="nlp")
    # alice of vision: her two jobs, and bob's because it is in vision; not carol's.
    assert ids(store.list_jobs(visible_to=("alice", "vision"))) == ["4", "2", "1"]
    # bob with no VC: only his own.
    assert ids(store.list_jobs(visible_to=("bob", None))) == ["2"]
    # dave of nlp owns nothing but reads nlp's jobs; combined with a filter and a limit.
    assert ids(store.list_jobs(visible_to=("dave", "nlp"))) == ["4", "3"]
    assert ids(store.list_jobs(visible_to=("dave", "nlp"), user="carol")) == ["3"]
    assert ids(store.list_jobs(visible_to=("dave", "nlp"), limit=1)) == ["4"]


def test_update_job_sets_columns_and_refuses_bad_ones(store: Store) -> None:
    add_job(store, 1)
    store.update_job(
        "1",
        status=JobStatus.RUNNING,  # an enum is stored as its value
        started_at=1010.0,
        attempts=1,
        reason="",
        spec={**SPEC, "workdir": "/w"},
    )
    row = store.get_job(1)
    assert row is not None
    assert (row.status, row.started_at, row.attempts) == ("RUNNING", 1010.0, 1)
    assert row.spec["workdir"] == "/w"
    store.update_job(1, status="FAILED", exit_code=3, executed_s=12.5, attained_gpu_s=25.0)
    row = store.get_job(1)
    assert row is not None and (row.exit_code, row.executed_s, row.attained_gpu_s) == (
        3,
        12.5,
        25.0,
    )
    with pytest.raises(ValueError, match="no updatable column 'colour'"):
        store.update_job(1, colour="red")
    with pytest.raises(ValueError, match="no updatable column 'id'"):
        store.update_job(1, id=7)
    with pytest.raises(ValueError, match="no updatable column 'job_id'"):
        store.update_job(1, job_id=7)
    with pytest.raises(KeyError, match="job 9 not found"):
        store.update_job(9, status="RUNNING")
    store.update_job(1)  # nothing to set: no error, no change
    assert store.job_counts() == {"FAILED": 1}


def test_attempts_round_trip_in_order(store: Store) -> None:
    add_job(store, 1)
    store.add_attempt(1, 1, ["n/0", "n/3"], 1010.0, "starting")
    store.add_attempt("1", 2, ("n/5", "n/6"), 1020.0, "starting")
    store.update_attempt(1, 1, state="ended", outcome="preempted", ended_at=1015.0, reason="x")
    store.update_attempt(1, 2, state="running", gpus=["n/6", "n/7"])
    assert store.attempts("1") == [
        AttemptRow("1", 1, ["n/0", "n/3"], 1010.0, 1015.0, "ended", "preempted", None, "x"),
        AttemptRow("1", 2, ["n/6", "n/7"], 1020.0, None, "running", None, None, ""),
    ]
    assert store.attempts(2) == [] and store.attempts("nope") == []
    with pytest.raises(KeyError, match="job 1 has no attempt 3"):
        store.update_attempt(1, 3, state="ended")
    with pytest.raises(ValueError, match="no updatable column 'number'"):
        store.update_attempt(1, 2, number=4)


def test_foreign_keys_are_enforced(store: Store) -> None:
    with pytest.raises(sa.exc.IntegrityError):
        store.add_attempt(42, 1, ["n/0"], 1.0, "starting")
    with pytest.raises(sa.exc.IntegrityError):
        store.add_event(42, 1.0, "submitted", "no such job")


def test_unfinished_jobs_come_oldest_first_with_their_attempts(store: Store) -> None:
    add_job(store, 1, status="RUNNING")
    add_job(store, 2)  # pending, never started
    add_job(store, 3, status="SUCCEEDED")
    add_job(store, 4, status="PENDING")  # preempted: has an ended attempt
    store.add_attempt(1, 2, ["n/1"], 20.0, "running")  # (stored out of order)
    store.add_attempt(1, 1, ["n/0"], 10.0, "ended")
    store.add_attempt(3, 1, ["n/2"], 30.0, "ended")
    store.add_attempt(4, 1, ["n/3"], 40.0, "ended")
    found = store.unfinished_jobs()
    assert [(job.id, [(a.number, a.gpus) for a in attempts]) for job, attempts in found] == [
        ("1", [(1, ["n/0"]), (2, ["n/1"])]),
        ("2", []),
        ("4", [(1, ["n/3"])]),
    ]
    assert [attempts for _, attempts in found] == [store.attempts(j) for j in (1, 2, 4)]


def test_finished_jobs_and_counts(store: Store) -> None:
    add_job(store, 1, status="SUCCEEDED")
    add_job(store, 2, status="RUNNING")
    add_job(store, 3, status="FAILED")
    add_job(store, 4, status="CANCELLED")
    add_job(store, 5)
    store.update_job(1, started_at=1005.0, finished_at=1100.0, executed_s=95.0)
    history = store.finished_jobs()
    assert ids(history) == ["1", "3", "4"]
    first = history[0]
    assert (first.submitted_at, first.started_at, first.finished_at) == (1001.0, 1005.0, 1100.0)
    assert (first.executed_s, first.gpus, first.user, first.vc) == (95.0, 2, "alice", "vision")
    assert store.job_counts() == {
        "SUCCEEDED": 1,
        "RUNNING": 1,
        "FAILED": 1,
        "CANCELLED": 1,
        "PENDING": 1,
    }


def test_events_in_order_and_the_latest_with_a_limit(store: Store) -> None:
    add_job(store, 1)
    add_job(store, 2)
    for number, kind in enumerate(["submitted", "started", "preempted", "started"]):
        store.add_event(1, 100.0 + number, kind, f"event {number}")
    store.add_event(2, 50.0, "submitted", "other job")
    store.add_event(None, 1.0, "manager", "started with 8 GPUs")
    assert [(e.kind, e.message) for e in store.events(1)] == [
        ("submitted", "event 0"),
        ("started", "event 1"),
        ("preempted", "event 2"),
        ("started", "event 3"),
    ]
    latest = store.events("1", limit=2)
    assert [e.message for e in latest] == ["event 2", "event 3"]
    assert all(isinstance(e, EventRow) and e.job_id == "1" for e in latest)
    assert [e.message for e in store.events(None)] == ["started with 8 GPUs"]
    assert store.events(3) == [] and store.events("x") == []


def test_meta_get_and_set(store: Store) -> None:
    assert store.get_meta("schema_version") is None  # Alembic's alembic_version replaced it
    assert store.get_meta("missing") is None
    store.set_meta("cluster", "8 GPUs")
    store.set_meta("cluster", "4 GPUs")
    assert store.get_meta("cluster") == "4 GPUs"


def test_tokens_round_trip(store: Store) -> None:
    store.insert_token("a" * 64, "alice", "vision", False, 5.0, "laptop")
    store.insert_token("b" * 64, "root", None, True, 6.0)
    assert store.token_by_hash("a" * 64) == TokenRow(
        "a" * 64, "alice", "vision", False, 5.0, "laptop"
    )
    assert store.token_by_hash("c" * 64) is None
    assert [(t.user, t.admin, t.vc, t.name) for t in store.list_tokens()] == [
        ("alice", False, "vision", "laptop"),
        ("root", True, None, None),
    ]


def test_a_batch_commits_once_and_reads_its_own_writes(store: Store) -> None:
    seen_from_other_thread: list[object] = []
    with store.batch():
        add_job(store, 1)
        store.update_job(1, status="RUNNING")
        store.add_attempt(1, 1, ["n/0", "n/1"], 5.0, "starting")
        with store.batch():  # a nested batch joins the outer one
            store.add_event(1, 5.0, "started", "on gpu 0, 1")
        row = store.get_job(1)
        assert row is not None and row.status == "RUNNING"  # visible inside the batch
        reader = threading.Thread(target=lambda: seen_from_other_thread.append(store.get_job(1)))
        reader.start()
        reader.join()
    assert seen_from_other_thread == [None]  # not committed while the batch was open
    assert len(store.attempts(1)) == 1 and len(store.events(1)) == 1


def test_a_batch_sends_each_kind_of_write_once_and_keeps_each_rows_order(store: Store) -> None:
    """A round's starts (an attempt, the job's new status, an event each) go out as one
    executemany per statement, not three statements per start; a row's updates, and the
    events, keep their order."""
    for job_id in (1, 2, 3):
        add_job(store, job_id)
    sent: list[tuple[str, bool]] = []

    def count(conn, cursor, statement, parameters, context, executemany) -> None:  # noqa: ANN001
        sent.append((statement.split()[0].upper(), executemany))

    sa.event.listen(store._engine, "before_cursor_execute", count)
    try:
        with store.batch():
            for job_id in (1, 2, 3):
                store.add_attempt(job_id, 1, [f"n/{job_id}"], 5.0, "running")
                store.update_job(job_id, status="RUNNING", attempts=1)
                store.add_event(job_id, 5.0, "started", f"attempt 1 of {job_id}")
            store.update_job(3, status="PENDING", reason="requeued")  # another kind of update
            store.add_event(3, 6.0, "requeued", "again")
            store.update_job(3, status="RUNNING", attempts=1)  # after it: not joined before it
    finally:
        sa.event.remove(store._engine, "before_cursor_execute", count)
    writes = [(verb, many) for verb, many in sent if verb in ("INSERT", "UPDATE")]
    assert writes == [
        ("INSERT", True),  # the three attempts
        ("UPDATE", True),  # the three jobs' status
        ("INSERT", True),  # the four events, in order
        ("UPDATE", False),  # job 3 requeued
        ("UPDATE", False),  # job 3 running again: after it
    ]
    assert [row.status for row in map(store.get_job, (1, 2, 3))] == ["RUNNING"] * 3  # type: ignore[union-attr]
    assert [event.message for event in store.events(3)] == ["attempt 1 of 3", "again"]
    with pytest.raises(KeyError, match="^.job 9 not found.$"):
        with store.batch():
            store.update_job(1, status="RUNNING")
            store.update_job(9, status="RUNNING")


def test_a_failing_batch_rolls_back_everything(store: Store) -> None:
    add_job(store, 1)
    with pytest.raises(RuntimeError, match="boom"):
        with store.batch():
            add_job(store, 2)
            store.update_job(1, status="RUNNING")
            store.add_attempt(1, 1, ["n/0"], 5.0, "starting")
            store.add_event(1, 5.0, "started", "x")
            store.set_meta("round", "7")
            raise RuntimeError("boom")
    assert ids(store.list_jobs()) == ["1"]
    row = store.get_job(1)
    assert row is not None and row.status == "PENDING"
    assert store.attempts(1) == [] and store.events(1) == []
    assert store.get_meta("round") is None
    add_job(store, 2)  # the store is usable after the rollback
    assert store.max_job_id() == 2


def test_a_writer_on_another_thread_waits_for_the_batch(store: Store) -> None:
    order: list[str] = []
    started = threading.Event()

    def write_from_elsewhere() -> None:
        started.set()
        add_job(store, 2)
        order.append("other thread wrote")

    with store.batch():
        add_job(store, 1)
        writer = threading.Thread(target=write_from_elsewhere)
        writer.start()
        started.wait()
        writer.join(timeout=0.2)  # it cannot finish: the batch holds the write lock
        order.append("batch ends")
    writer.join()
    assert order == ["batch ends", "other thread wrote"]
    assert ids(store.list_jobs()) == ["2", "1"]


def test_reopening_the_database_keeps_everything(database_url: str) -> None:
    first = Store(database_url)
    add_job(first, 1, status="RUNNING")
    first.add_attempt(1, 1, ["n/2", "n/3"], 5.0, "running")
    first.add_event(1, 5.0, "started", "on gpu 2, 3")
    first.insert_token("d" * 64, "alice", None, False, 1.0)
    first.set_meta("k", "v")
    first.close()
    second = Store(database_url)
    job, (attempt,) = second.unfinished_jobs()[0]
    assert (job.id, job.status, job.spec) == ("1", "RUNNING", SPEC)
    assert attempt.gpus == ["n/2", "n/3"]
    assert [e.message for e in second.events(1)] == ["on gpu 2, 3"]
    assert second.token_by_hash("d" * 64) is not None
    assert (second.get_meta("k"), second.max_job_id()) == ("v", 1)
    second.close()


def test_the_file_is_in_wal_mode(tmp_path: Path) -> None:
    store = Store(Store.sqlite_url(tmp_path))
    add_job(store, 1)
    store.close()
    with sqlite3.connect(tmp_path / "corral.db") as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        tables = {
            name for (name,) in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        indexes = {
            name for (name,) in raw.execute("SELECT name FROM sqlite_master WHERE type='index'")
        }
    assert {"jobs", "attempts", "events", "tokens", "meta"} <= tables
    assert {"ix_jobs_status", "ix_jobs_vc", "ix_events_job_id"} <= indexes


def test_an_in_memory_store_works_across_threads() -> None:
    memory = Store("sqlite://")
    add_job(memory, 1)
    found: list[object] = []
    reader = threading.Thread(target=lambda: found.append(memory.get_job(1)))
    reader.start()
    reader.join()
    assert isinstance(found[0], JobRow)
    memory.close()


def test_a_database_that_cannot_be_opened_is_one_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/no/such/dir/corral.db"
    with pytest.raises(StoreError) as caught:
        Store(url)
    assert str(caught.value) == f"{url}: cannot open the database: unable to open database file"
    with pytest.raises(StoreError, match="not a database URL"):
        Store("not a url")


def test_a_postgresql_database_that_cannot_be_opened_is_one_line(postgres_url: str) -> None:
    # the server is up, the database is not there; the password must not be printed
    missing = sa.make_url(postgres_url).set(database="no_such_db", password="s3cret")
    with pytest.raises(StoreError) as caught:
        Store(missing.render_as_string(hide_password=False))
    message = str(caught.value)
    assert message.startswith(
        f"{missing.render_as_string(hide_password=True)}: cannot open the database: "
    )
    assert 'database "no_such_db" does not exist' in message
    assert "\n" not in message and "s3cret" not in message
    # nothing listens on this port
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    refused = sa.make_url(postgres_url).set(port=port).render_as_string(hide_password=False)
    with pytest.raises(StoreError, match=r"cannot open the database: .*Connection refused$"):
        Store(refused)


def test_list_jobs_by_name_selects_an_arrays_tasks_and_a_glob(store: Store) -> None:
    # Array tasks are stored named NAME[INDEX]; other names are [A-Za-z0-9._-].
    names = ["sweep[0]", "sweep[1]", "sweep[12]", "sweep", "sweep-x", "sweeper", "a.b", "axb"]
    for job_id, name in enumerate(names, start=1):
        add_job(store, job_id, name=name)

    def named(pattern: str) -> list[str]:
        return sorted(ids(store.list_jobs(name=pattern)), key=int)

    # By hand, on both databases alike (SQLite's REGEXP, PostgreSQL's ~):
    assert named("sweep") == ["1", "2", "3", "4"]  # the name, and the array's tasks
    assert named("sweep[1]") == ["2"]  # one task by its own name (not a character class)
    assert named("sweep*") == ["1", "2", "3", "4", "5", "6"]
    assert named("sweep?x") == ["5"]
    assert named("sweep[!-]*") == ["1", "2", "3", "6"]  # brackets as a glob's class
    assert named("a.b") == ["7"]  # '.' is itself
    assert named("a?b") == ["7", "8"]
    assert named("SWEEP") == [] and named("swee") == []  # case-sensitive, whole names
    assert named("sweep[") == []  # an unclosed bracket is a character, and no name has it
