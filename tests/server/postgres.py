"""A real, throwaway PostgreSQL server for the tests that run the store and the manager on it.

`postgres_server` (once per session) starts one with the system's binaries: initdb into a temporary
directory, pg_ctl on 127.0.0.1 and a free port, fsync off (nothing here has to survive a power
cut). initdb refuses to run as root, so under root both run as the `postgres` user the Debian
package creates. `postgres_url` (per test) hands each test an empty database `corral` on it.

With CORRAL_TEST_POSTGRES_URL set, that server is used instead and each test starts by dropping
every table of its database. The tests run in a network namespace of their own (tests/netns.py),
where the machine's 127.0.0.1 is not this run's: reach a server on this machine through its Unix
socket (`postgresql+psycopg://USER@/DB?host=/var/run/postgresql`). Without either, the tests that need PostgreSQL fail (they are never
skipped: CI must not pass without having run them) with a line saying how to install it.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

URL_VARIABLE = "CORRAL_TEST_POSTGRES_URL"
DATABASE = "corral"
INSTALL_HINT = (
    "install it with `apt-get install -y postgresql` "
    f"(or set {URL_VARIABLE} to an existing server's database URL)"
)
STARTS = 3  # another process may take the free port between the probe and the server's bind
#: Seconds pg_ctl waits for the server to come up (or down): a loaded 2-core machine is slow.
PG_CTL_WAIT_S = 120


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server for the tests; the message is one line."""


def find_binaries() -> tuple[Path, Path]:
    """initdb and pg_ctl of the newest PostgreSQL installed (Debian keeps them off PATH)."""

    def version(initdb: Path) -> int:
        return int(initdb.parts[-3]) if initdb.parts[-3].isdigit() else 0

    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=version)
    if candidates:
        initdb = candidates[-1]
        return initdb, initdb.with_name("pg_ctl")
    on_path = shutil.which("initdb"), shutil.which("pg_ctl")
    if on_path[0] and on_path[1]:
        return Path(on_path[0]), Path(on_path[1])
    raise PostgresUnavailable(
        f"PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb): {INSTALL_HINT}"
    )


def server_user() -> str | None:
    """The user to run initdb and the server as: `postgres` under root (which initdb refuses)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise PostgresUnavailable(
            "the tests run as root, which initdb refuses, and there is no `postgres` user to run "
            f"it as: {INSTALL_HINT}"
        ) from None
    return "postgres"


def run(command: list[str], user: str | None, directory: Path) -> subprocess.CompletedProcess[str]:
    """One of PostgreSQL's programs, as `user` (the same switch `runuser -u` makes)."""
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=PG_CTL_WAIT_S + 60,
        cwd=directory,
        user=user,
        group=user,
        extra_groups=[] if user else None,
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


@dataclass(slots=True)
class PostgresServer:
    """A server the tests may use; `owned` when this session started it (and must stop it)."""

    url: str  # the SQLAlchemy URL of the tests' database
    owned: bool
    pg_ctl: Path | None = None
    directory: Path | None = None
    user: str | None = None
    options: str = ""  # the server's own (`pg_ctl -o`): its port among them
    #: A superuser's URL on database `postgres`, for the tests' own administration; None: `url`
    #: on database `postgres` (a server whose TCP connections need no password).
    admin_url: str | None = None

    def halt(self) -> None:
        """Stop the server as an outage would (its clients' connections cut); `resume` starts it
        again on the same port and data."""
        assert self.owned and self.pg_ctl is not None and self.directory is not None
        data = str(self.directory / "data")
        done = run(
            [str(self.pg_ctl), "-D", data, "-m", "fast", "-w", "-t", str(PG_CTL_WAIT_S), "stop"],
            self.user,
            self.directory,
        )
        assert done.returncode == 0, done.stderr

    def resume(self) -> None:
        assert self.owned and self.pg_ctl is not None and self.directory is not None
        data, log = self.directory / "data", self.directory / "server.log"
        wait = ["-w", "-t", str(PG_CTL_WAIT_S)]
        done = run(
            [str(self.pg_ctl), "-D", str(data), "-l", str(log), *wait, "-o", self.options, "start"],
            self.user,
            self.directory,
        )
        assert done.returncode == 0, log.read_text() if log.is_file() else done.stderr

    def fresh_database(self) -> str:
        """Empty the tests' database (a previous test may have left tables, rows, connections)."""
        if self.owned:
            # Re-create it rather than drop tables: sequences, indexes and everything else go too.
            admin = sa.make_url(self.admin_url or self.url).set(database="postgres")
            engine = sa.create_engine(admin, isolation_level="AUTOCOMMIT", poolclass=NullPool)
            with engine.connect() as connection:
                # FORCE ends the connections a stopped manager's pool may still hold.
                connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
                connection.exec_driver_sql(f"CREATE DATABASE {DATABASE}")
            engine.dispose()
        else:
            engine = sa.create_engine(self.url, poolclass=NullPool)
            existing = sa.MetaData()
            existing.reflect(engine)
            existing.drop_all(engine)
            engine.dispose()
        return self.url

    def stop(self) -> None:
        if not self.owned or self.pg_ctl is None or self.directory is None:
            return
        try:
            data = str(self.directory / "data")
            # immediate: nothing in it has to be kept, and it is the quickest way down
            run(
                [str(self.pg_ctl), "-D", data, "-m", "immediate", "-w", "stop"],
                self.user,
                self.directory,
            )
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)


def _stop_quietly(pg_ctl: Path, data: Path, user: str | None, directory: Path) -> None:
    """Stop a server this session may have started from `data`, if any runs: a start that failed
    half-way leaves none behind."""
    if not (data / "postmaster.pid").exists():
        return
    try:
        run([str(pg_ctl), "-D", str(data), "-m", "immediate", "-w", "stop"], user, directory)
    except (OSError, subprocess.SubprocessError):
        pass


def external_server(url: str) -> PostgresServer:
    try:
        engine = sa.create_engine(url, poolclass=NullPool)
        with engine.connect() as connection:
            connection.exec_driver_sql("SELECT 1")
        engine.dispose()
    except (sa.exc.SQLAlchemyError, ImportError) as error:
        reason = str(getattr(error, "orig", None) or error).strip()
        raise PostgresUnavailable(f"{URL_VARIABLE}={url}: cannot connect: {reason}") from None
    return PostgresServer(url=url, owned=False)


def start_server(*, superuser_password: str | None = None) -> PostgresServer:
    """initdb + pg_ctl start in a new temporary directory; raises PostgresUnavailable.

    Every connection is trusted, unless `superuser_password` is given: then a connection over
    TCP (127.0.0.1, which every process of the machine reaches) needs its role's password
    (scram-sha-256), and only the Unix socket, in a directory that only the server's user (and
    root) may enter, is trusted: `admin_url` goes through it."""
    initdb, pg_ctl = find_binaries()
    user = server_user()
    # Under /tmp, not a private temporary directory of root's the server's user cannot enter.
    directory = Path(tempfile.mkdtemp(prefix="corral-pg-", dir="/tmp" if user else None))
    data, log = directory / "data", directory / "server.log"
    try:
        if user is not None:
            shutil.chown(directory, user, user)
        authentication = ["-A", "trust"]
        if superuser_password is not None:
            password_file = directory / "superuser.password"
            password_file.write_text(superuser_password + "\n")
            password_file.chmod(0o600)
            if user is not None:
                shutil.chown(password_file, user, user)
            authentication = ["--auth-local=trust", "--auth-host=scram-sha-256"]
            authentication.append(f"--pwfile={password_file}")
        created = run(
            [str(initdb), "-D", str(data), "-U", "postgres", *authentication, "-E", "UTF8"]
            + ["--no-locale", "--no-sync"],
            user,
            directory,
        )
        if superuser_password is not None:
            password_file.unlink()
        if created.returncode != 0:
            raise PostgresUnavailable(f"{initdb} failed: {last_line(created.stderr)}")
        for _ in range(STARTS):
            port = free_port()
            options = (
                f"-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={directory}"
                " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            )
            wait = ["-w", "-t", str(PG_CTL_WAIT_S)]
            started = run(
                [str(pg_ctl), "-D", str(data), "-l", str(log), *wait, "-o", options, "start"],
                user,
                directory,
            )
            if started.returncode == 0:
                break
            # A server that did come up (late) would hold the data directory: stop it first.
            _stop_quietly(pg_ctl, data, user, directory)
        else:
            reason = log.read_text() if log.is_file() else started.stderr
            raise PostgresUnavailable(f"{pg_ctl} start failed: {last_line(reason)}")
    except (OSError, subprocess.SubprocessError) as error:
        _stop_quietly(pg_ctl, data, user, directory)
        shutil.rmtree(directory, ignore_errors=True)
        raise PostgresUnavailable(f"cannot start PostgreSQL: {error}; {INSTALL_HINT}") from None
    except BaseException:  # PostgresUnavailable, or an interrupt half-way through the start
        _stop_quietly(pg_ctl, data, user, directory)
        shutil.rmtree(directory, ignore_errors=True)
        raise
    url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/{DATABASE}"
    admin_url = None
    if superuser_password is not None:
        admin_url = f"postgresql+psycopg://postgres@/postgres?host={directory}&port={port}"
    return PostgresServer(
        url=url,
        owned=True,
        pg_ctl=pg_ctl,
        directory=directory,
        user=user,
        options=options,
        admin_url=admin_url,
    )


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the whole session (pytest remembers a failure: tried once)."""
    configured = os.environ.get(URL_VARIABLE)
    server: PostgresServer | None = None
    try:
        server = external_server(configured) if configured else start_server()
    except PostgresUnavailable as error:
        problem = re.sub(r"\s+", " ", str(error))
    if server is None:  # failed outside the except, so the report is that one line, unchained
        pytest.fail(problem, pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """The SQLAlchemy URL of an empty PostgreSQL database for this test alone."""
    return postgres_server.fresh_database()


@pytest.fixture
def postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server of this test's own, to stop and start again (a store outage)."""
    try:
        server = start_server()
    except PostgresUnavailable as error:
        pytest.fail(str(error), pytrace=False)
    try:
        server.fresh_database()
        yield server
    finally:
        server.stop()
