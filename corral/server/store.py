"""The manager's durable state: jobs, their attempts and events, API tokens, and a few settings.

SQLAlchemy Core (no ORM: the control loop writes many small rows and wants plain data back), on a
SQLite file by default or any database SQLAlchemy reaches by URL (PostgreSQL). The SQL is portable:
no SQLite-only statements, JSON kept as TEXT.

Writes are serialized inside the process by one lock; each call commits on its own, unless it runs
inside `with store.batch():` on the same thread, where every call shares one transaction that
commits once at the end (or rolls back entirely on an exception). Reads outside a batch use their
own pooled connection and, thanks to SQLite's WAL, never wait for a writer.
"""

from __future__ import annotations

import enum
import fcntl
import functools
import json
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, RowMapping
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.pool import StaticPool
from sqlalchemy.sql.expression import FunctionElement

from corral.server.names import name_regex

UNFINISHED = ("PENDING", "RUNNING")
FINISHED = ("SUCCEEDED", "FAILED", "CANCELLED", "REFUSED")

#: Job ids are decimal strings everywhere else ("1", "2", ...); the store keeps them as integers.
JobId = int | str
#: The largest job id the jobs.id column holds (INTEGER: 32 bits on PostgreSQL): a larger number
#: names no job, and is never sent to the database.
MAX_JOB_ID = 2**31 - 1

#: The tables as this code uses them. A change here needs a migration, a new revision in
#: corral/server/migrations/versions (docs/server.md, "Upgrades"); tests/server/test_migrations.py
#: fails until the migrations make exactly these tables.
metadata = sa.MetaData()

jobs_table = sa.Table(
    "jobs",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("name", sa.String, nullable=False),
    sa.Column("user", sa.String, nullable=False, index=True),
    sa.Column("vc", sa.String, nullable=False, index=True),
    sa.Column("priority", sa.String, nullable=False),
    sa.Column("gpus", sa.Integer, nullable=False),
    sa.Column("spec", sa.Text, nullable=False),
    sa.Column("status", sa.String, nullable=False, index=True),
    sa.Column("reason", sa.Text, nullable=False, default=""),
    sa.Column("submitted_at", sa.Double, nullable=False),
    sa.Column("started_at", sa.Double),
    sa.Column("finished_at", sa.Double),
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
    sa.Column("failures", sa.Integer, nullable=False, default=0),
    sa.Column("preemptions", sa.Integer, nullable=False, default=0),
    sa.Column("attained_gpu_s", sa.Double, nullable=False, default=0.0),
    sa.Column("executed_s", sa.Double, nullable=False, default=0.0),
    sa.Column("exit_code", sa.Integer),
    # The Unix account the job runs as (None: the manager's own, or not yet decided).
    sa.Column("unix_user", sa.String),
    # The spec's `workers`, for listings that must not decode specs (None: stored before this
    # column existed; listings then read it from the spec's JSON in the database).
    sa.Column("workers", sa.Integer),
    # What the job last reported (corral.server.telemetry): its step, the spec's total_steps,
    # its measured steps/s, its latest loss and when it reported (None: nothing reported yet).
    sa.Column("step", sa.Double),
    sa.Column("total_steps", sa.Double),
    sa.Column("steps_per_s", sa.Double),
    sa.Column("loss", sa.Double),
    sa.Column("progress_at", sa.Double),
    # Who holds the pending job back (`corral hold`; None: not held).
    sa.Column("held_by", sa.String),
    # A task of a job array: the array's id (its first task's) and the task's index.
    sa.Column("array_id", sa.Integer),
    sa.Column("array_index", sa.Integer),
    # The submitter's idempotency key (`Idempotency-Key`): a submission retried across a
    # failover is answered with the job it stored the first time (None: no key given).
    sa.Column("submit_key", sa.String, index=True),
)

attempts_table = sa.Table(
    "attempts",
    metadata,
    sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), primary_key=True),
    sa.Column("number", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("gpus", sa.Text, nullable=False),
    sa.Column("started_at", sa.Double, nullable=False),
    sa.Column("ended_at", sa.Double),
    sa.Column("state", sa.String, nullable=False),
    sa.Column("outcome", sa.String),
    sa.Column("exit_code", sa.Integer),
    sa.Column("reason", sa.Text, nullable=False, default=""),
    # The attempt is the job's pre-run (one worker, corral.core.precheck); None: stored before.
    sa.Column("prerun", sa.Boolean),
)

events_table = sa.Table(
    "events",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    # NULL for events of the manager itself (started, recovered) rather than of one job.
    sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), index=True),
    sa.Column("at", sa.Double, nullable=False),
    sa.Column("kind", sa.String, nullable=False),
    sa.Column("message", sa.Text, nullable=False),
)

tokens_table = sa.Table(
    "tokens",
    metadata,
    sa.Column("sha256", sa.String(64), primary_key=True),
    sa.Column("user", sa.String, nullable=False),
    sa.Column("vc", sa.String),
    sa.Column("admin", sa.Boolean, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("name", sa.String),
    # Epoch seconds; None: never expires / not revoked.
    sa.Column("expires_at", sa.Double),
    sa.Column("revoked_at", sa.Double),
    # The Unix account the user's jobs run as; None: the account named like the user.
    sa.Column("unix_user", sa.String),
)

#: A job's progress over time, thinned (a point every few seconds at most): the loss curve that
#: optimus fits and `describe` shows, kept across restarts of the manager.
progress_table = sa.Table(
    "progress",
    metadata,
    sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), primary_key=True),
    sa.Column("attempt", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("at", sa.Double, primary_key=True),
    sa.Column("step", sa.Double, nullable=False),
    sa.Column("loss", sa.Double),
)

#: Measured throughput per VC, model and placement shape (corral.core.profiles): `vc` is the VC
#: whose jobs measured it ("": measured before profiles were kept per VC, read by every VC).
profiles_table = sa.Table(
    "profiles",
    metadata,
    sa.Column("model", sa.String, primary_key=True),
    sa.Column("gpu_type", sa.String, primary_key=True),
    sa.Column("gpus", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("nodes", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("colocated", sa.String, primary_key=True),
    sa.Column("vc", sa.String, primary_key=True, server_default=""),
    sa.Column("steps_per_s", sa.Double, nullable=False),
    sa.Column("samples_per_s", sa.Double),
    sa.Column("seconds", sa.Double, nullable=False),
    sa.Column("runs", sa.Integer, nullable=False),
    sa.Column("updated_at", sa.Double, nullable=False),
)

#: The models an admin marked shared: every VC reads every VC's measurements of them.
shared_models_table = sa.Table(
    "shared_models",
    metadata,
    sa.Column("model", sa.String, primary_key=True),
    sa.Column("marked_by", sa.String, nullable=False),
    sa.Column("marked_at", sa.Double, nullable=False),
)

#: Every change of a node's state, in order (corral.server.nodes): an operator's drain and resume
#: (`state` "draining", "resumed"; `actor` who, `preempt` whether its attempts were preempted) and
#: what the manager saw of the cluster (`state` "joined", "left", "offline", "online"; `actor`
#: "manager"). A restarted manager takes its drains from here; export-trace carries them.
node_changes_table = sa.Table(
    "node_changes",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("at", sa.Double, nullable=False),
    sa.Column("node", sa.String, nullable=False, index=True),
    sa.Column("state", sa.String, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("actor", sa.String, nullable=False),
    sa.Column("preempt", sa.Boolean, nullable=False),
)

#: Reservations (issue 33): GPUs (by name, "node/device") claimed from `start` for `duration`
#: seconds for some users and VCs (JSON lists; none: a maintenance window), made by `actor`.
#: The manager makes each in the core at start and whenever it builds the core anew.
reservations_table = sa.Table(
    "reservations",
    metadata,
    sa.Column("name", sa.String, primary_key=True),
    sa.Column("start", sa.Double, nullable=False),
    sa.Column("duration", sa.Double, nullable=False),
    sa.Column("gpus", sa.Text, nullable=False),
    sa.Column("users", sa.Text, nullable=False),
    sa.Column("vcs", sa.Text, nullable=False),
    sa.Column("actor", sa.String, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
)

#: Leadership of a database shared by several managers (docs/ha.md): one row per lease (the
#: manager's is "manager"), its holder, its epoch (the fencing token every write of the leader
#: checks) and until when it holds (`expires_at`, the database's clock, epoch seconds).
leases_table = sa.Table(
    "leases",
    metadata,
    sa.Column("name", sa.String, primary_key=True),
    sa.Column("holder", sa.String, nullable=False),
    sa.Column("address", sa.String, nullable=False),
    sa.Column("epoch", sa.BigInteger, nullable=False),
    sa.Column("renewed_at", sa.Double, nullable=False),
    sa.Column("expires_at", sa.Double, nullable=False),
)

meta_table = sa.Table(
    "meta",
    metadata,
    sa.Column("key", sa.String, primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)


#: Pooled connections kept open, and more opened for a burst (and closed after it).
POOL_SIZE = 8
POOL_OVERFLOW = 56

#: The PostgreSQL advisory lock a manager holds on its database ("corral" in ASCII).
OWNER_LOCK_KEY = 0x636F7272616C


class StoreError(RuntimeError):
    """The database cannot be opened or used; the message is one line naming it."""


class StoreUnavailable(StoreError):
    """The database failed a call it may take again later: the server is down or restarting, the
    connection was lost, the disk is full. Nothing of the call's transaction was written, so the
    same call may be repeated once the database is back. The message is one line."""


def _unavailable(error: BaseException) -> StoreUnavailable | None:
    """The StoreUnavailable a SQLAlchemy error stands for, or None for an error that is not the
    database's state (a statement the database refuses: a bug, not an outage)."""
    if isinstance(error, sa.exc.DBAPIError):
        if not (
            isinstance(error, sa.exc.OperationalError | sa.exc.InterfaceError)
            or error.connection_invalidated
        ):
            return None
        reason = str(error.orig or error).strip().splitlines()
        return StoreUnavailable(reason[0] if reason else type(error.orig).__name__)
    if isinstance(error, sa.exc.TimeoutError | sa.exc.DisconnectionError):
        return StoreUnavailable(str(error).strip().splitlines()[0])
    return None


@contextmanager
def _outage_is_unavailable() -> Iterator[None]:
    """Raise the database failing as StoreUnavailable (the API answers it with 503)."""
    try:
        yield
    except sa.exc.SQLAlchemyError as error:
        unavailable = _unavailable(error)
        if unavailable is None:
            raise
        raise unavailable from error


@dataclass(slots=True, frozen=True)
class JobProgress:
    """What a job last reported: its step (of `total_steps`, if declared), steps/s measured over
    its latest reports, its latest loss, and when (the manager's clock)."""

    step: float
    at: float
    total_steps: float | None = None
    steps_per_s: float | None = None
    loss: float | None = None

    def eta_s(self, now: float, running_since: float | None) -> float | None:
        """Seconds left at the measured rate, counted from `now` (None: not known).

        `running_since`: when the job's running attempt started (None: it is not running). The
        time since the latest report is counted off only while the attempt that made it runs:
        a job waiting to resume (preempted), or restarting (its new attempt has not reported
        yet), makes no progress, so it shows the time its remaining steps take, not a count
        down to 0."""
        if self.total_steps is None or not self.steps_per_s:
            return None
        left = max(0.0, self.total_steps - self.step) / self.steps_per_s
        if running_since is not None and self.at >= running_since:
            left -= max(0.0, now - self.at)
        return max(0.0, left)


def _progress_of(row: RowMapping) -> JobProgress | None:
    if row["step"] is None or row["progress_at"] is None:
        return None
    return JobProgress(
        step=row["step"],
        at=row["progress_at"],
        total_steps=row["total_steps"],
        steps_per_s=row["steps_per_s"],
        loss=row["loss"],
    )


@dataclass(slots=True)
class JobRow:
    id: str
    name: str
    user: str
    vc: str
    priority: str
    gpus: int
    spec: dict[str, Any]
    status: str
    reason: str
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    attempts: int
    failures: int
    preemptions: int
    attained_gpu_s: float
    executed_s: float
    exit_code: int | None
    unix_user: str | None = None
    progress: JobProgress | None = None
    held_by: str | None = None
    array_id: str | None = None
    array_index: int | None = None
    #: `spec` as the JSON text the store keeps, when the submitter has it already (not compared).
    spec_json: str | None = field(default=None, compare=False, repr=False)
    #: The submitter's idempotency key (stored with the job; not read back into rows).
    submit_key: str | None = field(default=None, compare=False, repr=False)

    @classmethod
    def new(
        cls,
        job_id: JobId,
        *,
        name: str,
        user: str,
        vc: str,
        priority: str,
        gpus: int,
        spec: dict[str, Any],
        submitted_at: float,
        unix_user: str | None = None,
        spec_json: str | None = None,
    ) -> JobRow:
        """The row of a job just submitted (PENDING, nothing run yet); `spec_json`: `spec` as
        JSON text, if the caller has it (else the store writes it)."""
        return cls(
            id=str(job_id),
            name=name,
            user=user,
            vc=vc,
            priority=priority,
            gpus=gpus,
            spec=spec,
            status="PENDING",
            reason="",
            submitted_at=submitted_at,
            started_at=None,
            finished_at=None,
            attempts=0,
            failures=0,
            preemptions=0,
            attained_gpu_s=0.0,
            executed_s=0.0,
            exit_code=None,
            unix_user=unix_user,
            spec_json=spec_json,
        )


@dataclass(slots=True)
class JobListRow:
    """A job as listings show it: every column of JobRow but the spec, which listings never
    read (a spec may be up to the spec's cap, a listing thousands of jobs), and its `workers`."""

    id: str
    name: str
    user: str
    vc: str
    priority: str
    gpus: int
    workers: int
    status: str
    reason: str
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    attempts: int
    failures: int
    preemptions: int
    exit_code: int | None
    progress: JobProgress | None = None
    held_by: str | None = None
    array_id: str | None = None
    array_index: int | None = None


class _SpecNumber(FunctionElement[Any]):
    """A number read by the database from a spec's JSON text (SQLite's json_extract; PostgreSQL's
    ->> on the text cast to json): `field`, as the SQL type `sql_type`."""

    inherit_cache = True
    field: str
    sql_type: str


class _SpecWorkers(_SpecNumber):
    """`workers`, for rows stored before the workers column."""

    type = sa.Integer()
    name = "spec_workers"
    field = "workers"
    inherit_cache = True
    sql_type = "INTEGER"


class _SpecGpus(_SpecNumber):
    """`gpus` (a share of one GPU is below 1)."""

    type = sa.Double()
    name = "spec_gpus"
    field = "gpus"
    inherit_cache = True
    sql_type = "DOUBLE PRECISION"


@compiles(_SpecNumber)
def _spec_number_sqlite(element: _SpecNumber, compiler: Any, **kw: Any) -> str:
    return f"json_extract({compiler.process(element.clauses, **kw)}, '$.{element.field}')"


@compiles(_SpecNumber, "postgresql")
def _spec_number_postgresql(element: _SpecNumber, compiler: Any, **kw: Any) -> str:
    spec = compiler.process(element.clauses, **kw)
    return f"CAST(CAST({spec} AS json) ->> '{element.field}' AS {element.sql_type})"


class _DbNow(FunctionElement[Any]):
    """The database's clock, epoch seconds (a lease's time is the database's: the managers'
    clocks may disagree)."""

    type = sa.Double()
    name = "db_now"
    inherit_cache = True


@compiles(_DbNow)
def _db_now_sqlite(element: _DbNow, compiler: Any, **kw: Any) -> str:
    return "((julianday('now') - 2440587.5) * 86400.0)"


@compiles(_DbNow, "postgresql")
def _db_now_postgresql(element: _DbNow, compiler: Any, **kw: Any) -> str:
    return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"


class LeaseRow(NamedTuple):
    """A lease as stored, and the database's clock when it was read."""

    holder: str
    address: str
    epoch: int
    renewed_at: float
    expires_at: float
    now: float


def _workers_of(spec: dict[str, Any]) -> int:
    workers = spec.get("workers", 1)
    return workers if isinstance(workers, int) and not isinstance(workers, bool) else 1


def _total_steps_of(spec: dict[str, Any]) -> float | None:
    total = spec.get("total_steps")
    return float(total) if isinstance(total, int | float) and not isinstance(total, bool) else None


_LISTED_COLUMNS = [
    column for column in jobs_table.c if column.name not in ("spec", "workers", "unix_user")
]
_LISTED_WORKERS = sa.func.coalesce(jobs_table.c.workers, _SpecWorkers(jobs_table.c.spec), 1)


def _list_row(row: RowMapping) -> JobListRow:
    return JobListRow(
        id=str(row["id"]),
        name=row["name"],
        user=row["user"],
        vc=row["vc"],
        priority=row["priority"],
        gpus=row["gpus"],
        workers=int(row["workers"]),
        status=row["status"],
        reason=row["reason"],
        submitted_at=row["submitted_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        attempts=row["attempts"],
        failures=row["failures"],
        preemptions=row["preemptions"],
        exit_code=row["exit_code"],
        progress=_progress_of(row),
        held_by=row["held_by"],
        array_id=None if row["array_id"] is None else str(row["array_id"]),
        array_index=row["array_index"],
    )


@dataclass(slots=True)
class AttemptRow:
    job_id: str
    number: int
    gpus: list[str | int]  # names ("node/device"); ids in attempts stored before names
    started_at: float
    ended_at: float | None
    state: str  # starting | running | stopping | ended
    #: None until ended: succeeded | failed | preempted | migrated | unpacked | cancelled | lost
    #: | pre-run (a pre-run that passed)
    outcome: str | None
    exit_code: int | None
    reason: str
    prerun: bool = False


@dataclass(slots=True)
class ProgressRow:
    attempt: int
    at: float
    step: float
    loss: float | None


@dataclass(slots=True)
class ProfileRow:
    model: str
    gpu_type: str
    gpus: int
    nodes: int
    colocated: str
    steps_per_s: float
    samples_per_s: float | None
    seconds: float
    runs: int
    updated_at: float
    #: The VC whose jobs measured it ("": none's, read by every VC).
    vc: str = ""


@dataclass(slots=True)
class SharedModelRow:
    """A model an admin marked shared: who, and when."""

    model: str
    marked_by: str
    marked_at: float


@dataclass(slots=True)
class EventRow:
    id: int
    job_id: str | None
    at: float
    kind: str
    message: str


#: A token's public id: this many hex digits of its SHA-256 (the secret's hash, not the secret).
TOKEN_ID_CHARS = 12


@dataclass(frozen=True, slots=True)
class ReservationRow:
    """One reservation (reservations_table)."""

    name: str
    start: float
    duration: float
    gpus: tuple[str, ...]
    users: tuple[str, ...]
    vcs: tuple[str, ...]
    actor: str
    created_at: float


@dataclass(slots=True, frozen=True)
class NodeChangeRow:
    """One change of a node's state (node_changes_table)."""

    id: int
    at: float
    node: str
    state: str
    reason: str
    actor: str
    preempt: bool


@dataclass(slots=True)
class TokenRow:
    sha256: str
    user: str
    vc: str | None
    admin: bool
    created_at: float
    name: str | None
    expires_at: float | None = None
    revoked_at: float | None = None
    unix_user: str | None = None

    @property
    def id(self) -> str:
        """The public id (`corral token ls`, `corral token revoke ID`)."""
        return self.sha256[:TOKEN_ID_CHARS]


def _job_row(row: RowMapping) -> JobRow:
    return JobRow(
        id=str(row["id"]),
        name=row["name"],
        user=row["user"],
        vc=row["vc"],
        priority=row["priority"],
        gpus=row["gpus"],
        spec=json.loads(row["spec"]),
        status=row["status"],
        reason=row["reason"],
        submitted_at=row["submitted_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        attempts=row["attempts"],
        failures=row["failures"],
        preemptions=row["preemptions"],
        attained_gpu_s=row["attained_gpu_s"],
        executed_s=row["executed_s"],
        exit_code=row["exit_code"],
        unix_user=row["unix_user"],
        progress=_progress_of(row),
        held_by=row["held_by"],
        array_id=None if row["array_id"] is None else str(row["array_id"]),
        array_index=row["array_index"],
    )


def _attempt_row(row: RowMapping) -> AttemptRow:
    return AttemptRow(
        job_id=str(row["job_id"]),
        number=row["number"],
        gpus=json.loads(row["gpus"]),
        started_at=row["started_at"],
        ended_at=row["ended_at"],
        state=row["state"],
        outcome=row["outcome"],
        exit_code=row["exit_code"],
        reason=row["reason"],
        prerun=bool(row["prerun"]),
    )


def _token_row(row: RowMapping) -> TokenRow:
    return TokenRow(
        sha256=row["sha256"],
        user=row["user"],
        vc=row["vc"],
        admin=bool(row["admin"]),
        created_at=row["created_at"],
        name=row["name"],
        expires_at=row["expires_at"],
        revoked_at=row["revoked_at"],
        unix_user=row["unix_user"],
    )


def _column_values(
    table: sa.Table, fields: dict[str, Any], json_columns: set[str]
) -> dict[str, Any]:
    """Fields of an update as column values; refuses a name that is not a column."""
    values: dict[str, Any] = {}
    for name, value in fields.items():
        if name not in table.c or table.c[name].primary_key:
            raise ValueError(f"{table.name}: no updatable column {name!r}")
        if isinstance(value, enum.Enum):
            value = value.value
        values[name] = json.dumps(value) if name in json_columns else value
    return values


_INSERT_ATTEMPT = attempts_table.insert()
_INSERT_EVENT = events_table.insert()
_INSERT_PROGRESS = progress_table.insert()
PROFILE_KEY = ("model", "gpu_type", "gpus", "nodes", "colocated", "vc")
_UPDATES: dict[tuple[str, frozenset[str]], Any] = {}


@dataclass(slots=True)
class _Held:
    """Writes of one statement held in a batch, sent as one executemany, in their order."""

    statement: Any
    params: list[dict[str, Any]]
    missing: list[str | None]
    kind: tuple[str, sa.Table] | None  # the statement's `_write_kind`, worked out once


def _write_kind(statement: Any) -> tuple[str, sa.Table] | None:
    """("insert" | "update", its table) of an INSERT or UPDATE; None for anything else."""
    table = getattr(statement, "table", None)
    if not isinstance(table, sa.Table):
        return None
    if getattr(statement, "is_insert", False):
        return "insert", table
    if getattr(statement, "is_update", False):
        return "update", table
    return None


@functools.cache
def _refers_to(table: sa.Table, other: sa.Table) -> bool:
    """Whether rows of `table` may refer to rows of `other` (a foreign key); the tables are
    fixed (`metadata`), so each pair's answer is worked out once."""
    return any(key.references(other) for key in table.foreign_keys)


def _joinable(
    pending: list[_Held], statement: Any, kind: tuple[str, sa.Table] | None
) -> _Held | None:
    """The held writes of `statement` (of `kind`) that a new one may join, or None. Joining
    moves it ahead of the writes held after them: only past writes that it cannot depend on nor
    change the outcome of, those to another table, and, for an insert, none that inserts into a
    table its rows refer to (their referenced row may be that one). Writes of one statement, and
    of one table, keep their order (a row's updates, the events' ids)."""
    if kind is None:
        return None
    action, table = kind
    for held in reversed(pending):
        if held.statement is statement:
            return held
        other = held.kind
        if other is None or other[1] is table:
            return None
        if action == "insert" and other[0] == "insert" and _refers_to(table, other[1]):
            return None
    return None


def _update_statement(table: sa.Table, keys: tuple[str, ...], columns: frozenset[str]) -> Any:
    """One UPDATE statement object per table and set of columns, so that a batch can send the
    same kind of update for many rows as one executemany."""
    cache_key = (table.name, columns)
    statement = _UPDATES.get(cache_key)
    if statement is None:
        where = sa.and_(*(table.c[key] == sa.bindparam(f"k_{key}") for key in keys))
        values = {name: sa.bindparam(f"v_{name}") for name in sorted(columns)}
        statement = _UPDATES[cache_key] = table.update().where(where).values(values)
    return statement


def _set_sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # WAL lets readers run while the control loop writes; NORMAL is durable against a crash of
    # the process (the case that matters: kill -9 the server), only a power cut may lose the
    # last transactions; busy_timeout covers a second process (the CLI) holding the write lock.
    for pragma in (
        "journal_mode=WAL",
        "synchronous=NORMAL",
        "busy_timeout=5000",
        "foreign_keys=ON",
    ):
        cursor.execute(f"PRAGMA {pragma}")
    cursor.close()


class Store:
    def __init__(
        self, url: str, *, password: str | None = None, idle_transaction_s: float | None = None
    ) -> None:
        """`password`: the database's, given in the process (corral.server.dbsecret), never in
        `url` on a command line; None: the URL's, or libpq's own (PGPASSFILE, ~/.pgpass).
        `idle_transaction_s` (PostgreSQL): the server ends a session of this store that stays
        idle inside a transaction this long, releasing its locks (a leader paused mid-write
        must not hold up the standby that replaces it: corral.server.leader)."""
        try:
            parsed = sa.make_url(url)
        except sa.exc.ArgumentError as error:
            raise StoreError(f"{url}: not a database URL ({error})") from None
        self.url = parsed.render_as_string(hide_password=True)
        if password is not None:
            parsed = parsed.set(password=password)
        self._lock = threading.RLock()
        self._local = threading.local()
        #: Called inside every write transaction just before it commits (docs/ha.md): the
        #: leader's fencing check (corral.server.leader), which raises, and so rolls the
        #: transaction back, once another manager leads. None: no check (one manager alone).
        self.fence: Callable[[Connection], None] | None = None
        kwargs: dict[str, Any] = {}
        sqlite = parsed.get_backend_name() == "sqlite"
        # An in-memory SQLite database exists once per connection: share that one connection
        # between threads, and then every read must also take the lock.
        self._in_memory = sqlite and parsed.database in (None, "", ":memory:")
        if self._in_memory:
            kwargs = {"poolclass": StaticPool, "connect_args": {"check_same_thread": False}}
        else:
            # Never wait for a connection: the API's threads (AnyIO's 40) may all read at once,
            # besides the event loop, the control loop, the committer and PostgreSQL's claim.
            # A pooled connection is tried before use: after a database server restarts, the
            # first call reconnects instead of failing on a connection the restart closed.
            kwargs = {
                "pool_size": POOL_SIZE,
                "max_overflow": POOL_OVERFLOW,
                "pool_pre_ping": not sqlite,
            }
            if idle_transaction_s is not None and parsed.get_backend_name() == "postgresql":
                milliseconds = max(1, round(idle_transaction_s * 1000))
                kwargs["connect_args"] = {
                    "options": f"-c idle_in_transaction_session_timeout={milliseconds}"
                }
        try:
            self._engine: Engine = sa.create_engine(parsed, **kwargs)
        except (sa.exc.ArgumentError, ImportError) as error:
            raise StoreError(f"{self.url}: cannot use this database: {error}") from None
        if sqlite:
            sa.event.listen(self._engine, "connect", _set_sqlite_pragmas)
        # The schema: brought to this code's Alembic head (corral/server/migrations).
        from corral.server import migrations

        try:
            with self._lock:
                migrations.upgrade_to_head(
                    self._engine, self.url, shared_connection=self._in_memory
                )
        except migrations.SchemaError as error:
            self._engine.dispose()
            message = str(error)
            raise StoreError(message if self.url in message else f"{self.url}: {message}") from None
        except sa.exc.SQLAlchemyError as error:
            self._engine.dispose()
            reason = str(getattr(error, "orig", None) or error).splitlines()[0]
            raise StoreError(f"{self.url}: cannot open the database: {reason}") from None

    @staticmethod
    def sqlite_url(data_dir: str | Path) -> str:
        return f"sqlite:///{Path(data_dir).resolve() / 'corral.db'}"

    @property
    def shared(self) -> bool:
        """Whether several managers may share this database (PostgreSQL): one leads, by lease
        (corral.server.leader); SQLite has one manager, which `claim` makes sure of."""
        return sa.make_url(self._engine.url).get_backend_name() == "postgresql"

    # -- leadership (corral.server.leader, docs/ha.md) ---------------------------------------------

    def lease(self, name: str) -> LeaseRow | None:
        """The lease `name` as the database holds it now, with the database's clock."""
        table = leases_table
        query = sa.select(table, _DbNow().label("now")).where(table.c.name == name)
        with _outage_is_unavailable(), self._engine.connect() as connection:
            row = connection.execute(query).mappings().first()
        if row is None:
            return None
        return LeaseRow(
            row["holder"],
            row["address"],
            int(row["epoch"]),
            row["renewed_at"],
            row["expires_at"],
            row["now"],
        )

    def take_lease(self, name: str, holder: str, address: str, lease_s: float) -> int | None:
        """Take the lease `name` if it expired (by the database's clock) or is free: its epoch
        grows by one, the fencing token of the new holder, returned; None while another holds
        it. One conditional UPDATE: of two managers trying at once, one wins."""
        table = leases_table
        now = _DbNow()
        statement = (
            table.update()
            .where(table.c.name == name, table.c.expires_at < now)
            .values(
                holder=holder,
                address=address,
                epoch=table.c.epoch + 1,
                renewed_at=now,
                expires_at=now + lease_s,
            )
        )
        with _outage_is_unavailable(), self._engine.begin() as connection:
            if self.shared:  # never wait behind a stopped leader's open transaction
                connection.exec_driver_sql("SET LOCAL lock_timeout = '1s'")
                # A manager that claims the database by its advisory lock (`claim`: one built
                # in-process, or a version before leases) leads it: not while it runs.
                free = connection.execute(
                    sa.text("SELECT pg_try_advisory_xact_lock(:key)"), {"key": OWNER_LOCK_KEY}
                ).scalar()
                if not free:
                    return None
            if connection.execute(statement).rowcount != 1:
                return None
            epoch = connection.execute(
                sa.select(table.c.epoch).where(table.c.name == name, table.c.holder == holder)
            ).scalar()
        return None if epoch is None else int(epoch)

    def renew_lease(
        self,
        name: str,
        holder: str,
        epoch: int,
        lease_s: float,
        connection: Connection | None = None,
    ) -> bool:
        """Extend the lease `name` from now if `holder` still holds it at `epoch` (expired or
        not: as long as nobody took it, nobody acted on it); False once another manager took
        it. `connection`: inside that transaction (a write's fencing check)."""
        table = leases_table
        now = _DbNow()
        statement = (
            table.update()
            .where(table.c.name == name, table.c.holder == holder, table.c.epoch == epoch)
            .values(renewed_at=now, expires_at=now + lease_s)
        )
        if connection is not None:
            return bool(connection.execute(statement).rowcount == 1)
        with _outage_is_unavailable(), self._engine.begin() as own:
            return bool(own.execute(statement).rowcount == 1)

    def release_lease(self, name: str, holder: str, epoch: int) -> None:
        """Give the lease up at once (a clean stop): a standby takes it without waiting for it
        to expire."""
        table = leases_table
        with _outage_is_unavailable(), self._engine.begin() as connection:
            connection.execute(
                table.update()
                .where(table.c.name == name, table.c.holder == holder, table.c.epoch == epoch)
                .values(expires_at=0.0)
            )

    def claim(self) -> None:
        """Become the one manager of this database until `close` (or the process dies): two
        managers on one database would both run its jobs. SQLite: a lock on a file beside the
        database; PostgreSQL: a session advisory lock on a connection held open for it."""
        url = sa.make_url(self._engine.url)
        backend = url.get_backend_name()
        taken = f"{self.url}: another corral manager is using this database"
        if backend == "sqlite" and not self._in_memory:
            fd = os.open(f"{url.database}.owner", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise StoreError(taken) from None
            self._owner = fd
        elif backend == "postgresql":
            connection = self._engine.connect()
            held = connection.execute(
                sa.text("SELECT pg_try_advisory_lock(:key)"), {"key": OWNER_LOCK_KEY}
            ).scalar()
            connection.commit()
            if not held:
                connection.close()
                raise StoreError(taken)
            table = leases_table
            leading = connection.execute(
                sa.select(table.c.holder).where(table.c.holder != "", table.c.expires_at > _DbNow())
            ).first()
            connection.commit()
            if leading is not None:  # a `corral up` leads it by its lease (docs/ha.md)
                connection.close()
                raise StoreError(taken)
            self._owner = connection

    def keep_claim(self) -> None:
        """Make sure this manager still holds its claim on the database (`claim`). PostgreSQL's
        lock lives as long as one connection: a restart of the server or a lost connection
        drops it, and it is taken again here. StoreUnavailable while the server is down;
        StoreError when another manager took the database meanwhile."""
        if sa.make_url(self._engine.url).get_backend_name() != "postgresql":
            return  # SQLite's claim is a lock on a file: it lasts as long as the process
        if self.fence is not None:
            return  # a lease's leader (corral.server.leader): its writes are fenced instead
        owner = getattr(self, "_owner", None)
        if owner is not None:
            try:
                with _outage_is_unavailable():
                    owner.execute(sa.text("SELECT 1"))
                    owner.commit()
                return
            except StoreUnavailable:
                owner.invalidate()  # its session, and the lock with it, is gone
                self._owner = None
        with _outage_is_unavailable():
            self.claim()

    def close(self) -> None:
        owner = getattr(self, "_owner", None)
        if isinstance(owner, int):
            os.close(owner)
        elif owner is not None:
            owner.close()
        self._owner = None
        self._engine.dispose()

    # -- transactions -----------------------------------------------------------------------------

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Every store call inside (on this thread) shares one transaction, committed at the end.

        Nested batches join the outer one. An exception rolls back all of it and propagates.
        """
        if getattr(self._local, "connection", None) is not None:
            yield
            return
        with _outage_is_unavailable(), self._lock, self._engine.begin() as connection:
            self._local.connection = connection
            self._local.pending = []
            try:
                yield
                self._flush(connection)
                if self.fence is not None:
                    self.fence(connection)
            finally:
                self._local.connection = None
                self._local.pending = None

    def _run(self, statement: Any, params: dict[str, Any], missing: str | None = None) -> None:
        """Execute a write; inside a batch, writes are held and each joins the held writes of the
        same statement (`_joinable`), sent together as one executemany at the end: a round's
        starts cost one statement per kind, not three per start. `missing`: the KeyError
        message when the write changes no row."""
        pending: list[_Held] | None = getattr(self._local, "pending", None)
        if pending is not None:
            kind = _write_kind(statement)
            held = _joinable(pending, statement, kind)
            if held is None:
                pending.append(_Held(statement, [params], [missing], kind))
            else:
                held.params.append(params)
                held.missing.append(missing)
            return
        with self._writing() as connection:
            result = connection.execute(statement, params)
            if missing is not None and result.rowcount == 0:
                raise KeyError(missing)

    def _flush(self, connection: Connection) -> None:
        pending: list[_Held] = self._local.pending
        self._local.pending = []
        for held in pending:
            params = held.params
            result = connection.execute(held.statement, params if len(params) > 1 else params[0])
            # (a driver may not count the rows of an executemany: -1)
            if held.missing[0] is not None and 0 <= result.rowcount < len(params):
                if len(params) == 1:
                    raise KeyError(held.missing[0])
                # Which one: each again, alone (updates setting what they set; the batch is
                # rolled back by the KeyError anyway).
                for one, missing in zip(params, held.missing, strict=True):
                    if connection.execute(held.statement, one).rowcount == 0:
                        raise KeyError(missing)

    @contextmanager
    def _writing(self) -> Iterator[Connection]:
        current: Connection | None = getattr(self._local, "connection", None)
        if current is not None:
            yield current
            return
        with _outage_is_unavailable(), self._lock, self._engine.begin() as connection:
            yield connection
            if self.fence is not None:
                self.fence(connection)

    @contextmanager
    def _reading(self) -> Iterator[Connection]:
        current: Connection | None = getattr(self._local, "connection", None)
        if current is not None:
            self._flush(current)
            yield current  # sees the batch's own uncommitted writes
        elif self._in_memory:
            with _outage_is_unavailable(), self._lock, self._engine.connect() as connection:
                yield connection
        else:
            with _outage_is_unavailable(), self._engine.connect() as connection:
                yield connection

    # -- jobs -------------------------------------------------------------------------------------

    def insert_job(
        self,
        job_id: JobId,
        *,
        name: str,
        user: str,
        vc: str,
        priority: str,
        gpus: int,
        spec: dict[str, Any],
        submitted_at: float,
        status: str = "PENDING",
        reason: str = "",
        unix_user: str | None = None,
    ) -> None:
        with self._writing() as connection:
            connection.execute(
                jobs_table.insert(),
                dict(
                    id=int(job_id),
                    name=name,
                    user=user,
                    vc=vc,
                    priority=priority,
                    gpus=gpus,
                    spec=json.dumps(spec),
                    workers=_workers_of(spec),
                    total_steps=_total_steps_of(spec),
                    status=status,
                    reason=reason,
                    submitted_at=submitted_at,
                    unix_user=unix_user,
                ),
            )

    def insert_jobs(self, rows: list[JobRow]) -> None:
        """Insert newly submitted jobs, each with its "submitted" event, in one statement per
        table (the manager commits submissions in groups)."""
        if not rows:
            return
        keyed = any(row.submit_key is not None for row in rows)  # (one column fewer if none)
        with self._writing() as connection:
            connection.execute(
                jobs_table.insert(),
                [
                    dict(
                        id=int(row.id),
                        name=row.name,
                        user=row.user,
                        vc=row.vc,
                        priority=row.priority,
                        gpus=row.gpus,
                        spec=row.spec_json or json.dumps(row.spec),
                        workers=_workers_of(row.spec),
                        total_steps=_total_steps_of(row.spec),
                        status=row.status,
                        reason=row.reason,
                        submitted_at=row.submitted_at,
                        unix_user=row.unix_user,
                        held_by=row.held_by,
                        array_id=None if row.array_id is None else int(row.array_id),
                        array_index=row.array_index,
                        **({"submit_key": row.submit_key} if keyed else {}),
                    )
                    for row in rows
                ],
            )
            connection.execute(
                events_table.insert(),
                [
                    dict(
                        job_id=int(row.id),
                        at=row.submitted_at,
                        kind="submitted",
                        message=f"submitted by {row.user}",
                    )
                    for row in rows
                ],
            )

    def ping(self) -> None:
        """One trivial query (StoreUnavailable when the database does not answer it): /readyz.
        Takes no lock of the store's (a file-backed or remote database)."""
        with self._reading() as connection:
            connection.exec_driver_sql("SELECT 1")

    def max_job_id(self) -> int:
        """The highest job id ever inserted, 0 if none: the next job is this plus one."""
        with self._reading() as connection:
            return int(connection.execute(sa.select(sa.func.max(jobs_table.c.id))).scalar() or 0)

    def jobs_by_submit_keys(
        self, keyed: Iterable[tuple[str, str]]
    ) -> dict[tuple[str, str], JobRow]:
        """The jobs stored with these (user, idempotency key) pairs: each pair's first job."""
        pairs = set(keyed)
        keys = sorted({key for _user, key in pairs})
        query = (
            sa.select(jobs_table)
            .where(jobs_table.c.submit_key.in_(keys))
            .order_by(jobs_table.c.id.desc())
        )
        found: dict[tuple[str, str], JobRow] = {}
        with self._reading() as connection:
            for row in connection.execute(query).mappings():
                pair = (row["user"], row["submit_key"])
                if pair in pairs:
                    found[pair] = _job_row(row)  # (the lowest id last)
        return found

    def get_job(self, job_id: JobId) -> JobRow | None:
        key = _int_or_none(job_id)
        if key is None:
            return None
        with self._reading() as connection:
            row = (
                connection.execute(sa.select(jobs_table).where(jobs_table.c.id == key))
                .mappings()
                .first()
            )
        return None if row is None else _job_row(row)

    def list_jobs(
        self,
        status: str | Iterable[str] | None = None,
        vc: str | None = None,
        user: str | None = None,
        visible_to: tuple[str, str | None] | None = None,
        limit: int | None = None,
        *,
        before_id: int | None = None,
        ids: Iterable[JobId] | None = None,
        name: str | None = None,
    ) -> list[JobListRow]:
        """Jobs newest first, as listings show them (no spec: one short query, whatever the
        specs' size). `visible_to=(user, vc)` keeps that user's jobs and those of the VC;
        `before_id` those with a smaller id (the next page after a listing's last job); `ids`
        only those jobs (ids that name no job are ignored); `name` those it selects: that name,
        the tasks of the array of that name, or a glob of names (`corral.server.names`)."""
        query = sa.select(*_LISTED_COLUMNS, _LISTED_WORKERS.label("workers"))
        query = query.order_by(jobs_table.c.id.desc())
        if ids is not None:
            keys = {key for key in map(_int_or_none, ids) if key is not None}
            query = query.where(jobs_table.c.id.in_(sorted(keys)))
        if before_id is not None:
            query = query.where(jobs_table.c.id < before_id)
        if status is not None:
            statuses = [status] if isinstance(status, str) else list(status)
            query = query.where(jobs_table.c.status.in_(statuses))
        if vc is not None:
            query = query.where(jobs_table.c.vc == vc)
        if user is not None:
            query = query.where(jobs_table.c.user == user)
        if name is not None:
            query = query.where(jobs_table.c.name.regexp_match(name_regex(name)))
        query = _visible(query, visible_to)
        if limit is not None:
            query = query.limit(limit)
        with self._reading() as connection:
            return [_list_row(row) for row in connection.execute(query).mappings()]

    def unfinished_jobs(self) -> list[tuple[JobRow, list[AttemptRow]]]:
        """PENDING and RUNNING jobs, oldest first, each with its attempts in order (two queries,
        not one per job: a manager that takes over reads them all before it serves)."""
        unfinished = jobs_table.c.status.in_(UNFINISHED)
        with self._reading() as connection:
            job_rows = connection.execute(
                sa.select(jobs_table).where(unfinished).order_by(jobs_table.c.id)
            ).mappings()
            found = [_job_row(row) for row in job_rows]
            attempt_rows = connection.execute(
                sa.select(attempts_table)
                .where(attempts_table.c.job_id.in_(sa.select(jobs_table.c.id).where(unfinished)))
                .order_by(attempts_table.c.job_id, attempts_table.c.number)
            ).mappings()
            attempts: dict[str, list[AttemptRow]] = {}
            for row in attempt_rows:
                attempts.setdefault(str(row["job_id"]), []).append(_attempt_row(row))
        return [(job, attempts.get(job.id, [])) for job in found]

    def open_attempts_of_ended_jobs(self) -> list[tuple[str, AttemptRow]]:
        """Attempts not recorded as ended whose jobs have ended (e.g. cancelled while the
        attempt was stopping): (job id, attempt)."""
        ended_jobs = sa.select(jobs_table.c.id).where(jobs_table.c.status.not_in(UNFINISHED))
        query = (
            sa.select(attempts_table)
            .where(attempts_table.c.state != "ended", attempts_table.c.job_id.in_(ended_jobs))
            .order_by(attempts_table.c.job_id, attempts_table.c.number)
        )
        with self._reading() as connection:
            return [
                (str(row["job_id"]), _attempt_row(row))
                for row in connection.execute(query).mappings()
            ]

    def finished_jobs(self) -> list[JobRow]:
        """Jobs that ended (SUCCEEDED, FAILED, CANCELLED, REFUSED), oldest first: the history."""
        query = (
            sa.select(jobs_table).where(jobs_table.c.status.in_(FINISHED)).order_by(jobs_table.c.id)
        )
        with self._reading() as connection:
            return [_job_row(row) for row in connection.execute(query).mappings()]

    def recent_jobs(self, limit: int) -> list[JobRow]:
        """The latest `limit` jobs submitted, whatever their status, oldest first (with specs:
        what FGD's target workload is learnt from live)."""
        query = sa.select(jobs_table).order_by(jobs_table.c.id.desc()).limit(limit)
        with self._reading() as connection:
            rows = [_job_row(row) for row in connection.execute(query).mappings()]
        return rows[::-1]

    def job_counts(self) -> dict[str, int]:
        """How many jobs are in each status."""
        query = sa.select(jobs_table.c.status, sa.func.count()).group_by(jobs_table.c.status)
        with self._reading() as connection:
            return {status: count for status, count in connection.execute(query)}

    def update_job(self, job_id: JobId, /, **fields: Any) -> None:
        """Set columns of one job (e.g. status="RUNNING", started_at=...); KeyError if unknown."""
        if not fields:
            return
        values = _column_values(jobs_table, fields, {"spec"})
        statement = _update_statement(jobs_table, ("id",), frozenset(values))
        params = {f"v_{name}": value for name, value in values.items()} | {"k_id": int(job_id)}
        self._run(statement, params, missing=f"job {job_id} not found")

    # -- attempts ---------------------------------------------------------------------------------

    def add_attempt(
        self,
        job_id: JobId,
        number: int,
        gpus: Iterable[str],
        started_at: float,
        state: str,
        *,
        prerun: bool = False,
    ) -> None:
        """`gpus` by name ("node/device"): ids change when the cluster's nodes do."""
        row = dict(
            job_id=int(job_id),
            number=number,
            gpus=json.dumps([str(gpu) for gpu in gpus]),
            started_at=started_at,
            state=state,
            prerun=prerun,
        )
        self._run(_INSERT_ATTEMPT, row)

    def update_attempt(self, job_id: JobId, number: int, /, **fields: Any) -> None:
        """Set columns of one attempt (state, ended_at, outcome, exit_code, reason, gpus)."""
        if not fields:
            return
        values = _column_values(attempts_table, fields, {"gpus"})
        statement = _update_statement(attempts_table, ("job_id", "number"), frozenset(values))
        params = {f"v_{name}": value for name, value in values.items()}
        params |= {"k_job_id": int(job_id), "k_number": number}
        self._run(statement, params, missing=f"job {job_id} has no attempt {number}")

    def attempts(self, job_id: JobId) -> list[AttemptRow]:
        key = _int_or_none(job_id)
        if key is None:
            return []
        query = (
            sa.select(attempts_table)
            .where(attempts_table.c.job_id == key)
            .order_by(attempts_table.c.number)
        )
        with self._reading() as connection:
            return [_attempt_row(row) for row in connection.execute(query).mappings()]

    # -- events -----------------------------------------------------------------------------------

    def add_event(self, job_id: JobId | None, at: float, kind: str, message: str) -> None:
        """Record what happened; job_id None for an event of the manager itself."""
        key = None if job_id is None else int(job_id)
        self._run(_INSERT_EVENT, dict(job_id=key, at=at, kind=kind, message=message))

    def events(self, job_id: JobId | None, limit: int | None = None) -> list[EventRow]:
        """A job's events (or the manager's, for None) in order; with `limit`, the latest ones."""
        which: sa.ColumnElement[bool]
        if job_id is None:
            which = events_table.c.job_id.is_(None)
        else:
            key = _int_or_none(job_id)
            if key is None:
                return []
            which = events_table.c.job_id == key
        query = sa.select(events_table).where(which).order_by(events_table.c.id.desc())
        if limit is not None:
            query = query.limit(limit)
        with self._reading() as connection:
            rows = list(connection.execute(query).mappings())
        return [
            EventRow(
                id=row["id"],
                job_id=None if row["job_id"] is None else str(row["job_id"]),
                at=row["at"],
                kind=row["kind"],
                message=row["message"],
            )
            for row in reversed(rows)
        ]

    # -- progress and profiles --------------------------------------------------------------------

    def add_progress(
        self, job_id: JobId, attempt: int, at: float, step: float, loss: float | None
    ) -> None:
        """One point of a job's progress (the telemetry thins them before they get here)."""
        row = dict(job_id=int(job_id), attempt=attempt, at=at, step=step, loss=loss)
        self._run(_INSERT_PROGRESS, row)

    def progress(self, job_id: JobId, limit: int | None = None) -> list[ProgressRow]:
        """A job's stored progress points in order; with `limit`, the latest ones."""
        key = _int_or_none(job_id)
        if key is None:
            return []
        query = (
            sa.select(progress_table)
            .where(progress_table.c.job_id == key)
            .order_by(progress_table.c.at.desc(), progress_table.c.attempt.desc())
        )
        if limit is not None:
            query = query.limit(limit)
        with self._reading() as connection:
            rows = list(connection.execute(query).mappings())
        return [
            ProgressRow(row["attempt"], row["at"], row["step"], row["loss"])
            for row in reversed(rows)
        ]

    def profiles(self) -> list[ProfileRow]:
        query = sa.select(profiles_table).order_by(
            *(profiles_table.c[name] for name in PROFILE_KEY)
        )
        with self._reading() as connection:
            return [
                ProfileRow(**{name: row[name] for name in ProfileRow.__slots__})
                for row in connection.execute(query).mappings()
            ]

    def save_profile(self, row: ProfileRow) -> None:
        """Insert or replace one shape's measurement."""
        values = {name: getattr(row, name) for name in ProfileRow.__slots__}
        key = {name: values.pop(name) for name in PROFILE_KEY}
        where = sa.and_(*(profiles_table.c[name] == value for name, value in key.items()))
        with self._writing() as connection:
            result = connection.execute(profiles_table.update().where(where).values(values))
            if result.rowcount == 0:
                connection.execute(profiles_table.insert(), key | values)

    def delete_profile(self, row: ProfileRow) -> None:
        """Forget one shape's measurement (all it held was taken back)."""
        where = sa.and_(*(profiles_table.c[name] == getattr(row, name) for name in PROFILE_KEY))
        with self._writing() as connection:
            connection.execute(profiles_table.delete().where(where))

    def shared_models(self) -> list[SharedModelRow]:
        """The models marked shared, by name."""
        query = sa.select(shared_models_table).order_by(shared_models_table.c.model)
        with self._reading() as connection:
            return [
                SharedModelRow(row["model"], row["marked_by"], row["marked_at"])
                for row in connection.execute(query).mappings()
            ]

    def set_shared(self, model: str, shared: bool, by: str, at: float) -> bool:
        """Mark `model` shared (or not); returns whether that changed the store."""
        table = shared_models_table
        with self._writing() as connection:
            found = connection.execute(
                sa.select(table.c.model).where(table.c.model == model)
            ).first()
            if shared and found is None:
                connection.execute(
                    table.insert(), {"model": model, "marked_by": by, "marked_at": at}
                )
                return True
            if not shared and found is not None:
                connection.execute(table.delete().where(table.c.model == model))
                return True
            return False

    # -- node changes -----------------------------------------------------------------------------

    def add_node_change(
        self,
        at: float,
        node: str,
        state: str,
        reason: str,
        actor: str,
        *,
        preempt: bool = False,
    ) -> None:
        """Record a change of a node's state (see node_changes_table)."""
        self._run(
            node_changes_table.insert(),
            dict(at=at, node=node, state=state, reason=reason, actor=actor, preempt=preempt),
        )

    def node_changes(self, states: Iterable[str] | None = None) -> list[NodeChangeRow]:
        """Every recorded change of node state in order (only those of `states`, if given)."""
        query = sa.select(node_changes_table).order_by(node_changes_table.c.id)
        if states is not None:
            query = query.where(node_changes_table.c.state.in_(list(states)))
        with self._reading() as connection:
            rows = list(connection.execute(query).mappings())
        return [
            NodeChangeRow(
                id=row["id"],
                at=row["at"],
                node=row["node"],
                state=row["state"],
                reason=row["reason"],
                actor=row["actor"],
                preempt=bool(row["preempt"]),
            )
            for row in rows
        ]

    # -- reservations ---------------------------------------------------------------------------

    def add_reservation(self, row: ReservationRow) -> None:
        self._run(
            reservations_table.insert(),
            dict(
                name=row.name,
                start=row.start,
                duration=row.duration,
                gpus=json.dumps(list(row.gpus)),
                users=json.dumps(list(row.users)),
                vcs=json.dumps(list(row.vcs)),
                actor=row.actor,
                created_at=row.created_at,
            ),
        )

    def delete_reservation(self, name: str) -> bool:
        """Forget a reservation; False if there was none of that name."""
        with self._writing() as connection:
            result = connection.execute(
                reservations_table.delete().where(reservations_table.c.name == name)
            )
        return bool(result.rowcount)

    def reservations(self) -> list[ReservationRow]:
        """Every reservation, by start, then name."""
        query = sa.select(reservations_table).order_by(
            reservations_table.c.start, reservations_table.c.name
        )
        with self._reading() as connection:
            rows = list(connection.execute(query).mappings())
        return [
            ReservationRow(
                name=row["name"],
                start=row["start"],
                duration=row["duration"],
                gpus=tuple(json.loads(row["gpus"])),
                users=tuple(json.loads(row["users"])),
                vcs=tuple(json.loads(row["vcs"])),
                actor=row["actor"],
                created_at=row["created_at"],
            )
            for row in rows
        ]

    # -- settings ---------------------------------------------------------------------------------

    def get_meta(self, key: str) -> str | None:
        with self._reading() as connection:
            value = connection.execute(
                sa.select(meta_table.c.value).where(meta_table.c.key == key)
            ).scalar()
        return None if value is None else str(value)

    def set_meta(self, key: str, value: str) -> None:
        with self._writing() as connection:
            # Update-then-insert is portable (no dialect-specific upsert); the write lock makes it
            # safe within the process, the only writer of these keys.
            result = connection.execute(
                meta_table.update().where(meta_table.c.key == key).values(value=value)
            )
            if result.rowcount == 0:
                connection.execute(meta_table.insert(), dict(key=key, value=value))

    # -- tokens -----------------------------------------------------------------------------------

    def insert_token(
        self,
        sha256: str,
        user: str,
        vc: str | None,
        admin: bool,
        created_at: float,
        name: str | None = None,
        *,
        expires_at: float | None = None,
        unix_user: str | None = None,
    ) -> None:
        with self._writing() as connection:
            connection.execute(
                tokens_table.insert(),
                dict(
                    sha256=sha256,
                    user=user,
                    vc=vc,
                    admin=admin,
                    created_at=created_at,
                    name=name,
                    expires_at=expires_at,
                    unix_user=unix_user,
                ),
            )

    def token_by_hash(self, sha256: str) -> TokenRow | None:
        with self._reading() as connection:
            row = (
                connection.execute(sa.select(tokens_table).where(tokens_table.c.sha256 == sha256))
                .mappings()
                .first()
            )
        return None if row is None else _token_row(row)

    def list_tokens(self) -> list[TokenRow]:
        query = sa.select(tokens_table).order_by(tokens_table.c.created_at, tokens_table.c.sha256)
        with self._reading() as connection:
            return [_token_row(row) for row in connection.execute(query).mappings()]

    def token_by_id(self, token_id: str) -> TokenRow | None:
        """The token whose public id (`TokenRow.id`) this is; None if none, or (improbably)
        several, have it."""
        if len(token_id) != TOKEN_ID_CHARS:
            return None
        query = (
            sa.select(tokens_table)
            .where(tokens_table.c.sha256.startswith(token_id, autoescape=True))
            .limit(2)
        )
        with self._reading() as connection:
            rows = list(connection.execute(query).mappings())
        return _token_row(rows[0]) if len(rows) == 1 else None

    def revoke_tokens(
        self, at: float, *, user: str | None = None, sha256: str | None = None
    ) -> list[TokenRow]:
        """Mark the not yet revoked tokens of `user`, or the one token `sha256`, revoked at `at`;
        returns those it revoked now (a token revoked before keeps its time)."""
        if (user is None) == (sha256 is None):
            raise ValueError("revoke_tokens: give either user or sha256")
        which = tokens_table.c.user == user if sha256 is None else tokens_table.c.sha256 == sha256
        live = sa.and_(which, tokens_table.c.revoked_at.is_(None))
        with self._writing() as connection:
            rows = [
                _token_row(row)
                for row in connection.execute(sa.select(tokens_table).where(live)).mappings()
            ]
            if rows:
                connection.execute(
                    tokens_table.update()
                    .where(live, tokens_table.c.sha256.in_([row.sha256 for row in rows]))
                    .values(revoked_at=at)
                )
        for row in rows:
            row.revoked_at = at
        return rows

    # -- usage (corral usage) ---------------------------------------------------------------------

    def usage_attempts(
        self, since: float, until: float, visible_to: tuple[str, str | None] | None = None
    ) -> list[UsageAttempt]:
        """The attempts that ran some of [since, until), with their job's user, VC and share of
        a GPU; `end` is when the attempt ended, else when its job did, else None (running).
        `visible_to=(user, vc)` as in list_jobs."""
        a, j = attempts_table.c, jobs_table.c
        end = sa.func.coalesce(a.ended_at, j.finished_at)
        query = (
            sa.select(j.user, j.vc, a.gpus, _SpecGpus(j.spec).label("share"), a.started_at, end)
            .join_from(attempts_table, jobs_table, a.job_id == j.id)
            .where(a.started_at < until, sa.or_(end.is_(None), end > since))
        )
        query = _visible(query, visible_to)
        with self._reading() as connection:
            return [
                UsageAttempt(user, vc, len(json.loads(gpus)), share, started, ended)
                for user, vc, gpus, share, started, ended in connection.execute(query)
            ]

    def usage_jobs(
        self, since: float, until: float, visible_to: tuple[str, str | None] | None = None
    ) -> list[UsageJob]:
        """The jobs submitted, first started or finished in [since, until)."""
        j = jobs_table.c

        def inside(column: Any) -> Any:
            return sa.and_(column >= since, column < until)

        query = sa.select(
            j.user, j.vc, j.status, j.submitted_at, j.started_at, j.finished_at
        ).where(sa.or_(inside(j.submitted_at), inside(j.started_at), inside(j.finished_at)))
        query = _visible(query, visible_to)
        with self._reading() as connection:
            return [UsageJob(*row) for row in connection.execute(query)]


def _int_or_none(job_id: JobId) -> int | None:
    """A job id from a URL or the CLI may be anything: a non-number names no job."""
    if isinstance(job_id, int):
        return job_id if 0 <= job_id <= MAX_JOB_ID else None
    text = job_id.strip()
    # A longer number cannot be a stored id (and would overflow the column's integer).
    digits = text.lstrip("0") or "0"
    if not (text.isascii() and text.isdecimal()) or len(digits) > len(str(MAX_JOB_ID)):
        return None
    key = int(digits)
    return key if key <= MAX_JOB_ID else None


class UsageAttempt(NamedTuple):
    user: str
    vc: str
    gpus: int  # GPUs the attempt held
    share: float | None  # the spec's `gpus` (below 1: a share of one GPU)
    started_at: float
    ended_at: float | None  # None: still running


class UsageJob(NamedTuple):
    user: str
    vc: str
    status: str
    submitted_at: float
    started_at: float | None
    finished_at: float | None


def _visible(query: Any, visible_to: tuple[str, str | None] | None) -> Any:
    if visible_to is None:
        return query
    viewer, viewer_vc = visible_to
    own = jobs_table.c.user == viewer
    return query.where(own if viewer_vc is None else sa.or_(own, jobs_table.c.vc == viewer_vc))
