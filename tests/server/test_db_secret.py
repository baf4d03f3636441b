"""The database's password is never on a command line, and a job cannot use the database.

A job runs on the machine of the database's server, reaches 127.0.0.1 and reads every process's
command line in /proc. The tests here run a real PostgreSQL server whose TCP connections need a
password (scram-sha-256), the manager as a real `corral up` process given its password in a file,
and a job under a real Unix account that looks for the password everywhere it can and then tries
to make itself an admin with `psql`. The small tests check each command's refusal of a URL with
a password, the password file's checks, and libpq's own password file (PGPASSFILE).
"""

from __future__ import annotations

import hashlib
import os
import pwd
import secrets
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from sqlalchemy.pool import NullPool

from corral.cli.main import app
from corral.exec.local import job_environment
from corral.server import migrations
from corral.server.dbsecret import DatabaseSecretError, database_password, read_password_file
from corral.server.store import Store, StoreError
from tests.accounts import useradd, userdel
from tests.server.helpers import (
    Corral,
    admin_token,
    api,
    kill_jobs_of,
    python_job,
    start_server,
    submit,
    wait_for,
)
from tests.server.postgres import PostgresServer, PostgresUnavailable
from tests.server.postgres import start_server as start_postgres

ROLE = "corral"  # the manager's role: owns the database, no superuser


@dataclass(slots=True)
class GuardedPostgres:
    """A PostgreSQL server whose 127.0.0.1 needs a password: the manager's role `corral` (owner
    of database `corral`) has `password`; the superuser `postgres` another, known to nobody."""

    server: PostgresServer
    port: int
    password: str

    @property
    def url(self) -> str:
        """The manager's URL, as the docs give it: no password in it."""
        return f"postgresql+psycopg://{ROLE}@127.0.0.1:{self.port}/{ROLE}"

    def admin(self, database: str = "postgres") -> sa.Engine:
        """The superuser, through the Unix socket (a directory only the server's user and root
        may enter)."""
        assert self.server.admin_url is not None
        url = sa.make_url(self.server.admin_url).set(database=database)
        return sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool)

    def fresh_database(self) -> None:
        engine = self.admin()
        try:
            with engine.connect() as connection:
                connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {ROLE} WITH (FORCE)")
                connection.exec_driver_sql(f"CREATE DATABASE {ROLE} OWNER {ROLE}")
        finally:
            engine.dispose()

    def rows(self, query: str) -> list[tuple[object, ...]]:
        engine = self.admin(ROLE)
        try:
            with engine.connect() as connection:
                return [tuple(row) for row in connection.exec_driver_sql(query)]
        finally:
            engine.dispose()


@pytest.fixture(scope="module")
def guarded() -> Iterator[GuardedPostgres]:
    server = None
    try:
        server = start_postgres(superuser_password=secrets.token_hex(16))
    except PostgresUnavailable as error:
        problem = str(error)
    if server is None:  # never skipped: CI must not pass without having run these
        pytest.fail(problem, pytrace=False)
    try:
        password = secrets.token_hex(16)  # hex: nothing to quote in SQL, a URL or a shell
        engine = sa.create_engine(
            server.admin_url or "", isolation_level="AUTOCOMMIT", poolclass=NullPool
        )
        try:
            with engine.connect() as connection:
                connection.exec_driver_sql(f"CREATE ROLE {ROLE} LOGIN PASSWORD '{password}'")
        finally:
            engine.dispose()
        port = sa.make_url(server.url).port
        assert port is not None
        yield GuardedPostgres(server, port, password)
    finally:
        server.stop()


@pytest.fixture
def database(guarded: GuardedPostgres) -> GuardedPostgres:
    """The guarded server with an empty database `corral` for this test alone."""
    guarded.fresh_database()
    return guarded


@pytest.fixture
def no_libpq_password(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Nothing of libpq's own sources in this process: no PGPASSWORD, an empty PGPASSFILE."""
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "no-such-pgpass"))


def private_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


# -- the attack ------------------------------------------------------------------------------------

#: The job: read every command line and environment it can, take every password and password file
#: it finds, and with each (and with none) ask PostgreSQL, over 127.0.0.1 and over its Unix
#: socket, as the manager's role and as the superuser, to insert an admin token of its own.
ATTACK = r"""
echo "uid $(id -u)"
seen="$PWD/seen"; : > "$seen"; : > read
for f in /proc/[0-9]*/cmdline /proc/[0-9]*/environ; do
  { tr '\0' '\n' < "$f" >> "$seen" && echo "$f" >> read; } 2>/dev/null
done
echo "cmdlines read: $(grep -c cmdline read), environs read: $(grep -c environ read)"
grep -E -o '[a-z][a-z0-9+]*://[^[:space:]]+' "$seen" | sort -u > urls
while IFS= read -r url; do echo "url: $url"; done < urls
: > candidates
sed -n 's|^[a-z][a-z0-9+]*://[^:/@]*:\([^@]*\)@.*|\1|p' urls >> candidates
sed -n 's/^PGPASSWORD=//p' "$seen" >> candidates
for file in $(grep -A1 -x -e '--db-password-file' "$seen" | grep -v -e '^--'); do
  if head -n 1 "$file" >> candidates 2>/dev/null; then echo "password file $file: READ"
  else echo "password file $file: denied"; fi
done
echo >> candidates
sort -u candidates | while IFS= read -r candidate; do
  echo "candidate: [$candidate]"
  for host in 127.0.0.1 __SOCKET__; do
    for role in corral postgres; do
      out=$(PGPASSWORD="$candidate" PGCONNECT_TIMEOUT=20 psql -X -w -h "$host" -p __PORT__ \
        -U "$role" -d corral -v ON_ERROR_STOP=1 -c "INSERT INTO tokens \
        (sha256, \"user\", admin, created_at, unix_user) \
        VALUES ('__HASH__', 'mallory', true, 0, 'root')" 2>&1 | tr '\n' ' ')
      echo "psql $role@$host: $out"
    done
  done
done
echo attack-done
"""


def _every_process_text() -> bytes:
    """Every command line and environment on this machine, as root reads them."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            for name in ("cmdline", "environ"):
                try:
                    found.append(Path(f"/proc/{entry}/{name}").read_bytes())
                except OSError:  # gone meanwhile
                    continue
    return b"\n".join(found)


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None or shutil.which("psql") is None,
    reason="needs root, useradd and psql: the job runs under an account the test creates",
)
def test_a_job_finds_no_database_password_and_cannot_make_itself_admin(
    database: GuardedPostgres,
) -> None:
    account = f"crl-mallory-{uuid.uuid4().hex[:6]}"
    base = Path(tempfile.mkdtemp(prefix="corral-dbsecret-"))
    created = False
    corral: Corral | None = None
    try:
        base.chmod(0o711)  # the jobs' account passes through to its own directories
        useradd(account)
        created = True
        password_file = private_file(base / "db.password", database.password + "\n")
        # The manager's environment has no password either (libpq would read PGPASSWORD).
        env = {k: v for k, v in os.environ.items() if k not in ("PGPASSWORD", "PGPASSFILE")}
        corral = Corral(
            base / "state",
            "--gpus",
            "2",
            "--db",
            database.url,
            "--db-password-file",
            str(password_file),
            "--multi-user",
            env=env,
        )
        admin = corral.start()
        response = admin.post(
            "/api/v1/tokens", json={"user": "mallory", "vc": "default", "unix_user": account}
        )
        assert response.status_code == 201, response.text
        mallory = api(corral.url, response.json()["token"])
        forged = secrets.token_urlsafe(32)
        forged_hash = hashlib.sha256(forged.encode()).hexdigest()
        assert database.server.directory is not None
        script = (
            ATTACK.replace("__PORT__", str(database.port))
            .replace("__SOCKET__", str(database.server.directory))
            .replace("__HASH__", forged_hash)
        )
        attack = submit(mallory, name="attack", vc="default", gpus=1, command=script)
        done = wait_for(mallory, attack, timeout=240)
        log = mallory.get(f"/api/v1/jobs/{attack}/logs").text
        errors = mallory.get(f"/api/v1/jobs/{attack}/logs", params={"stream": "stderr"}).text
        assert done["status"] == "SUCCEEDED" and "attack-done" in log, (done, log, errors)
        # It ran as mallory's account and read the process list, the manager's line included.
        assert f"uid {pwd.getpwnam(account).pw_uid}\n" in log, log
        assert int(log.split("cmdlines read: ")[1].split(",")[0]) > 10, log
        assert f"url: {database.url}" in log, log
        assert f"password file {password_file}: denied" in log, log
        # ... and found no password: every try was refused, over TCP and over the socket.
        assert database.password not in log + errors
        tries = [line for line in log.splitlines() if line.startswith("psql ")]
        assert len(tries) >= 4, log
        for line in tries:
            assert "INSERT 0 1" not in line, log
            if "@127.0.0.1:" in line:
                assert "password authentication failed" in line or "no password supplied" in line, (
                    line
                )
            else:
                assert "Permission denied" in line, line
        # Nothing was written, and the forged token is nobody's.
        assert database.rows(f"SELECT count(*) FROM tokens WHERE sha256 = '{forged_hash}'") == [
            (0,)
        ]
        assert database.rows("SELECT count(*) FROM tokens WHERE admin") == [(1,)]
        assert api(corral.url, forged).get("/api/v1/whoami").status_code == 401
        # Root's view: the password is in no command line and no environment on this machine,
        # while the manager runs and holds its connections.
        everything = _every_process_text()
        assert b"--db-password-file" in everything  # the manager's own line is among them
        assert database.password.encode() not in everything
    finally:
        if corral is not None:
            corral.stop()
            kill_jobs_of(corral.data_dir)
        if created:
            userdel(account)
        shutil.rmtree(base, ignore_errors=True)


# -- refused in one line ---------------------------------------------------------------------------

WITH_PASSWORD = [
    "postgresql+psycopg://corral:hunter2@127.0.0.1:1/corral",
    "postgresql+psycopg://corral@127.0.0.1:1/corral?password=hunter2",
    "postgresql+psycopg://corral@127.0.0.1:1/corral?sslpassword=hunter2",
]


@pytest.mark.parametrize("url", WITH_PASSWORD)
@pytest.mark.parametrize(
    "command",
    [
        ["up", "--gpus", "1"],
        ["export-trace", "--out", "history.csv"],
    ],
)
def test_corral_refuses_a_password_in_the_database_url(
    tmp_path: Path, command: list[str], url: str
) -> None:
    result = CliRunner().invoke(app, [*command, "--data-dir", str(tmp_path / "d"), "--db", url])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert "--db: the URL holds a password" in lines[0]
    assert "--db-password-file FILE" in lines[0] and "PGPASSFILE" in lines[0]
    assert "hunter2" not in result.output
    assert not (tmp_path / "d").exists()  # refused before anything was made


@pytest.mark.parametrize("url", WITH_PASSWORD)
@pytest.mark.parametrize("command", [["upgrade"], ["current"], ["history"]])
def test_the_migrations_command_refuses_a_password_in_the_url(
    capsys: pytest.CaptureFixture[str], url: str, command: list[str]
) -> None:
    assert migrations.main(["--db", url, *command]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert "error: --db: the URL holds a password" in err and "hunter2" not in err


def test_a_password_file_needs_a_database_url(tmp_path: Path) -> None:
    password_file = private_file(tmp_path / "pw", "x\n")
    result = CliRunner().invoke(
        app,
        ["up", "--gpus", "1", "--data-dir", str(tmp_path / "d")]
        + ["--db-password-file", str(password_file)],
    )
    assert result.exit_code == 2
    assert "--db-password-file: needs --db URL (SQLite has no password)" in result.output


# -- the password file -----------------------------------------------------------------------------


def test_the_password_file_gives_its_first_line(tmp_path: Path) -> None:
    assert read_password_file(private_file(tmp_path / "a", "s3cret\n")) == "s3cret"
    assert read_password_file(private_file(tmp_path / "b", " spaced out \r\n\n")) == " spaced out "
    assert read_password_file(private_file(tmp_path / "c", "no newline")) == "no newline"
    # A link to a private file (a Kubernetes secret's volume is links): the file itself counts.
    (tmp_path / "link").symlink_to(tmp_path / "a")
    assert read_password_file(tmp_path / "link") == "s3cret"
    assert database_password("postgresql+psycopg://u@h/d", tmp_path / "a") == "s3cret"
    assert database_password("postgresql+psycopg://u@h/d", None) is None
    assert database_password(None, None) is None


def test_a_password_file_others_could_read_or_swap_is_refused(tmp_path: Path) -> None:
    def refused(path: Path) -> str:
        with pytest.raises(DatabaseSecretError) as caught:
            read_password_file(path)
        message = str(caught.value)
        assert "\n" not in message and "s3cret" not in message
        assert message.startswith(f"--db-password-file {path}: ")
        return message

    for mode in (0o640, 0o604, 0o620, 0o602, 0o610):
        message = refused(private_file(tmp_path / f"mode-{mode:o}", "s3cret\n", mode))
        assert message.endswith(f"group or others may open it (mode {mode:04o}): chmod 600 it")
    (tmp_path / "loose").symlink_to(tmp_path / "mode-640")
    assert "mode 0640" in refused(tmp_path / "loose")  # the file behind the link is checked
    assert refused(tmp_path / "missing").endswith("cannot open it (No such file or directory)")
    directory = tmp_path / "dir"
    directory.mkdir(mode=0o700)
    assert refused(directory).endswith("not a regular file")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    assert refused(fifo).endswith("not a regular file")  # and did not wait for a writer
    assert refused(private_file(tmp_path / "empty", "")).endswith(
        "empty; write the password on its first line"
    )
    assert refused(private_file(tmp_path / "blank", "\nsecond\n")).endswith(
        "empty; write the password on its first line"
    )
    assert refused(private_file(tmp_path / "two", "s3cret\nmore\n")).endswith(
        "holds more than one line; write the password alone"
    )
    assert "5000 bytes, not a secret" in refused(private_file(tmp_path / "big", "x" * 5000))
    if os.geteuid() == 0:  # only root gives a file away
        theirs = private_file(tmp_path / "theirs", "s3cret\n")
        os.chown(theirs, 65534, 65534)
        assert refused(theirs).endswith(
            f"owned by {pwd.getpwuid(65534).pw_name}, not by root: someone else could change it; "
            "chown it"
        )


def test_corral_up_refuses_a_loose_password_file_in_one_line(tmp_path: Path) -> None:
    loose = private_file(tmp_path / "pw", "s3cret\n", 0o644)
    result = CliRunner().invoke(
        app,
        ["up", "--gpus", "1", "--data-dir", str(tmp_path / "d")]
        + ["--db", "postgresql+psycopg://corral@127.0.0.1:1/corral"]
        + ["--db-password-file", str(loose)],
    )
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"error: --db-password-file {loose}: group or others may open it (mode 0644): chmod 600 it"
    )


# -- where the password does come from -------------------------------------------------------------


@pytest.mark.usefixtures("no_libpq_password")
def test_without_a_password_the_database_refuses_and_says_so_in_one_line(
    database: GuardedPostgres,
) -> None:
    with pytest.raises(StoreError) as caught:
        Store(database.url)
    message = str(caught.value)
    assert message.startswith(f"{database.url}: cannot open the database: ")
    assert "no password supplied" in message and "\n" not in message


def test_a_url_without_password_connects_through_pgpassfile(
    database: GuardedPostgres, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("PGPASSWORD", raising=False)
    pgpass = private_file(
        tmp_path / "pgpass", f"127.0.0.1:{database.port}:{ROLE}:{ROLE}:{database.password}\n"
    )
    monkeypatch.setenv("PGPASSFILE", str(pgpass))
    store = Store(database.url)  # libpq finds the password itself
    try:
        store.claim()
        assert store.url == database.url
    finally:
        store.close()
    assert database.rows("SELECT count(*) FROM alembic_version") == [(1,)]


@pytest.mark.usefixtures("no_libpq_password")
def test_the_password_file_opens_the_database_for_each_command(
    database: GuardedPostgres, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    password_file = private_file(tmp_path / "pw", database.password + "\n")
    flags = ["--db", database.url, "--db-password-file", str(password_file)]
    assert migrations.main([*flags, "upgrade"]) == 0
    assert migrations.main([*flags, "current"]) == 0
    assert capsys.readouterr().out.strip() == migrations.head()
    store = Store(database.url, password=read_password_file(password_file))
    try:
        assert store.url == database.url  # what is shown and logged holds no password
        assert database.password not in repr(store.url)
    finally:
        store.close()
    result = CliRunner().invoke(
        app, ["export-trace", *flags, "--out", str(tmp_path / "history.csv")]
    )
    assert result.exit_code == 0, result.output
    assert "wrote 0 jobs" in result.output
    wrong = private_file(tmp_path / "wrong", "not-it\n")
    result = CliRunner().invoke(
        app,
        ["export-trace", "--db", database.url, "--db-password-file", str(wrong)]
        + ["--out", str(tmp_path / "again.csv")],
    )
    assert result.exit_code == 2
    assert f'password authentication failed for user "{ROLE}"' in result.output
    assert "not-it" not in result.output


def test_jobs_never_inherit_the_managers_database_password(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """libpq reads PGPASSWORD, so a manager may be started with it; its jobs (and their
    supervisor) must not get it, nor the Ray cluster's token."""
    monkeypatch.setenv("PGPASSWORD", "managers-db-password")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "managers-ray-token")
    server = start_server(data_dir)
    try:
        client = api(server.url, admin_token(data_dir))
        code = (
            "import os; print(os.environ.get('PGPASSWORD', 'none'), "
            "os.environ.get('RAY_AUTH_TOKEN', 'none'))"
        )
        job_id = submit(client, **python_job("env", code))
        assert wait_for(client, job_id)["status"] == "SUCCEEDED"
        log = client.get(f"/api/v1/jobs/{job_id}/logs").text
        assert log == "none none\n"
    finally:
        server.stop()
    assert not {"PGPASSWORD", "RAY_AUTH_TOKEN"} & set(job_environment())  # the supervisor's too


def test_a_database_error_never_shows_the_password(
    database: GuardedPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refusal by the server names the URL as given, without the password handed to it."""
    monkeypatch.delenv("PGPASSWORD", raising=False)
    with pytest.raises(StoreError) as caught:
        Store(database.url.rsplit("/", 1)[0] + "/nosuchdb", password=database.password)
    assert database.password not in str(caught.value)
    assert 'database "nosuchdb" does not exist' in str(caught.value)
