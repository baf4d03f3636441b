"""The store's schema migrations (Alembic), run by the Store when it opens a database.

The migration environment lives in this package (env.py, versions/), so an installed corral has it;
no alembic.ini: `config()` sets the script location in code. `upgrade_to_head` brings a database
to this code's head revision, under a lock so that two managers starting at once do not both
migrate:

- an empty database is made from nothing (revision 0001 creates the tables);
- a database made before Alembic (corral's tables, no alembic_version) is at "no revision" too:
  0001 finds its tables and adds what an older version lacked (the legacy step), then the later
  revisions run as usual;
- a database at a revision this code does not know (made by a newer corral) is refused with one
  line, and nothing in it is touched.

`python -m corral.server.migrations` runs Alembic's commands on a database (upgrade, current,
history) and writes new revisions (revision -m MESSAGE [--autogenerate]); docs/server.md tells how.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

if TYPE_CHECKING:
    from alembic.config import Config
    from sqlalchemy.engine import Connection, Engine

HERE = Path(__file__).resolve().parent

#: The PostgreSQL advisory lock held, for its transaction, by the one process migrating a
#: database ("corralm" in ASCII); not the manager's OWNER_LOCK_KEY, which a running manager holds.
MIGRATE_LOCK_KEY = 0x636F7272616C6D
#: Seconds a second process waits for SQLite's write lock while another migrates the file.
SQLITE_WAIT_S = 60


class SchemaError(RuntimeError):
    """The database's schema cannot be brought to this code's; the message is one line (the
    Store prefixes the database's URL)."""


def config(connection: Connection | None = None) -> Config:
    """Alembic's configuration of this package, with no file: the migrations of an installed
    corral. With `connection`, env.py migrates on it (inside the caller's transaction)."""
    from alembic.config import Config

    result = Config()
    result.set_main_option("script_location", str(HERE))
    # Revision files named NNNN_slug.py; `revision` numbers them (next_revision_id).
    result.set_main_option("file_template", "%%(rev)s_%%(slug)s")
    if connection is not None:
        result.attributes["connection"] = connection
    return result


def head() -> str:
    """This code's head revision (one head: the history is a line)."""
    from alembic.script import ScriptDirectory

    heads = ScriptDirectory.from_config(config()).get_heads()
    if len(heads) != 1:
        raise SchemaError(f"corral's migrations have {len(heads)} heads ({', '.join(heads)})")
    return heads[0]


def next_revision_id() -> str:
    """The id a new revision gets: the head's number plus one, four digits ("0002")."""
    return f"{int(head()) + 1:04d}"


def current(connection: Connection) -> str | None:
    """The database's revision; None: none recorded (empty, or made before Alembic)."""
    if not sa.inspect(connection).has_table("alembic_version"):
        return None
    versions = [
        row[0] for row in connection.exec_driver_sql("SELECT version_num FROM alembic_version")
    ]
    if len(versions) > 1:
        raise SchemaError(f"alembic_version holds {len(versions)} revisions: {', '.join(versions)}")
    return versions[0] if versions else None


def upgrade_to_head(engine: Engine, url: str, *, shared_connection: bool = False) -> str | None:
    """Bring the database of `engine` to the head revision; returns the revision it was at (None:
    none). Raises SchemaError (one line) for a database this code cannot upgrade.

    The whole upgrade is one transaction, taken before the revision is read: on PostgreSQL with an
    advisory transaction lock, on SQLite with BEGIN IMMEDIATE (the file's write lock) on a
    connection of its own; a second process waits, then finds the database at head. With
    `shared_connection` (an in-memory SQLite, which exists only on the engine's one connection)
    the engine's connection is used as it is: no other process can see that database."""
    if engine.dialect.name == "sqlite" and not shared_connection:
        migrating = sa.create_engine(
            engine.url, poolclass=NullPool, connect_args={"timeout": SQLITE_WAIT_S}
        )
        # pysqlite begins transactions only before DML, and commits before DDL: take over the
        # BEGIN (SQLAlchemy's recipe for SQLite's transactional DDL) and make it IMMEDIATE.
        sa.event.listen(migrating, "connect", _sqlite_autocommit_driver)
        sa.event.listen(migrating, "begin", _sqlite_begin_immediate)
    else:
        migrating = engine
    try:
        with migrating.begin() as connection:
            if connection.dialect.name == "postgresql":
                # A store that fences a leader ends its sessions idle in a transaction for a few
                # seconds (Store's idle_transaction_s); the upgrade's own pauses between
                # statements (Alembic loading its scripts, on a loaded machine) are no such
                # pause: lifted for this transaction alone.
                connection.execute(sa.text("SET LOCAL idle_in_transaction_session_timeout = 0"))
                connection.execute(
                    sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATE_LOCK_KEY}
                )
            return _upgrade(connection, url)
    finally:
        if migrating is not engine:
            migrating.dispose()


def _sqlite_autocommit_driver(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.isolation_level = None


def _sqlite_begin_immediate(connection: Connection) -> None:
    connection.exec_driver_sql("BEGIN IMMEDIATE")


def _upgrade(connection: Connection, url: str) -> str | None:
    from alembic import command
    from alembic.script import ScriptDirectory

    settings = config(connection)
    script = ScriptDirectory.from_config(settings)
    target = head()
    was = current(connection)
    if was is not None and was not in {revision.revision for revision in script.walk_revisions()}:
        raise SchemaError(
            f"the database at {url} is at schema revision {was}, newer than this corral "
            f"(head {target}): upgrade corral"
        )
    if was != target:
        command.upgrade(settings, target)
    return was


def main(argv: list[str] | None = None) -> int:
    """python -m corral.server.migrations: Alembic's commands on corral's migrations."""
    import argparse
    import sys

    from alembic import command

    parser = argparse.ArgumentParser(
        prog="python -m corral.server.migrations",
        description="corral's schema migrations (Alembic, configured in code)",
    )
    parser.add_argument(
        "--db",
        help="the database URL, without its password; `revision --autogenerate` compares the "
        "tables with it (at head)",
    )
    parser.add_argument(
        "--db-password-file",
        metavar="FILE",
        help="--db's password, on the first line of this file (yours, mode 0600); "
        "default: libpq's (PGPASSFILE, ~/.pgpass)",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("upgrade", help="bring the database to head (as `corral up` does)")
    commands.add_parser("current", help="print the database's revision")
    commands.add_parser("history", help="list the revisions")
    revision = commands.add_parser("revision", help="write a new revision file in versions/")
    revision.add_argument("-m", "--message", required=True)
    revision.add_argument(
        "--autogenerate",
        action="store_true",
        help="fill it with the differences between --db (at head) and the tables in store.py",
    )
    options = parser.parse_args(argv)
    from corral.server.dbsecret import DatabaseSecretError, database_password

    try:  # before anything else: a password on the command line is refused, whatever the command
        password = database_password(options.db, options.db_password_file)
    except DatabaseSecretError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    if options.command == "history":
        command.history(config(), verbose=False)
        return 0
    if options.command == "revision" and not options.autogenerate:
        command.revision(config(), message=options.message, rev_id=next_revision_id())
        return 0
    if not options.db:
        parser.error("give the database: --db URL")
    from corral.server.store import Store, StoreError

    if options.command == "upgrade":
        try:
            Store(options.db, password=password).close()  # opening it upgrades it
        except StoreError as error:
            print(error)
            return 1
        return 0
    url = sa.make_url(options.db)
    engine = sa.create_engine(
        url if password is None else url.set(password=password), poolclass=NullPool
    )
    try:
        with engine.connect() as connection:
            if options.command == "current":
                print(current(connection) or "(no revision)")
                return 0
            settings = config(connection)
            command.revision(
                settings, message=options.message, autogenerate=True, rev_id=next_revision_id()
            )
    finally:
        engine.dispose()
    return 0
