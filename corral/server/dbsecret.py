"""The database's password: never on a command line.

Every process on the machine reads every other's command line (`/proc/PID/cmdline`, `ps`), jobs
included, so a database URL with its password in `--db` hands the database, and with it admin
rights (a row in `tokens`), to any tenant whose job can reach the server. corral's commands refuse
such a URL. The password comes instead from libpq's own sources, which psycopg reads by itself
when the URL has none (`PGPASSFILE`, else the `.pgpass` of the manager's user; `PGPASSWORD`,
which jobs never inherit: corral.exec.local.PRIVATE_VARIABLES), or from the file named by
`--db-password-file`, read here and handed to SQLAlchemy inside the process: it is never in an
argv or in a child's environment.
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from corral.server.privatefile import read_private_file

#: Query parameters of a URL that libpq (and psycopg) take as secrets.
SECRET_PARAMETERS = ("password", "sslpassword")
HOW = (
    "give the URL without it and the password in a file only the manager's user can read: "
    "--db-password-file FILE, or libpq's PGPASSFILE or ~/.pgpass"
)


class DatabaseSecretError(ValueError):
    """A database URL or password file a command refuses; the message is one line naming the
    flag, never the secret."""


def refuse_password_in_url(url: str, flag: str = "--db") -> None:
    """Raise DatabaseSecretError when `url` carries a password (in its user part, or as a
    `password=` / `sslpassword=` parameter). The message never repeats the URL."""
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError:
        raise DatabaseSecretError(
            f"{flag}: not a database URL (e.g. postgresql+psycopg://USER@HOST/DB)"
        ) from None
    where = None
    if parsed.password is not None:
        where = "a password"
    else:
        given = [key for key in parsed.query if key.lower() in SECRET_PARAMETERS]
        if given:
            where = f"a password (?{given[0]}=)"
    if where is not None:
        raise DatabaseSecretError(
            f"{flag}: the URL holds {where}, which every process on this machine can read in "
            f"/proc/PID/cmdline; {HOW}"
        )


def read_password_file(path: str | Path, flag: str = "--db-password-file") -> str:
    """The password in `path`: its first line, without the line's end. Refused (one line) unless
    it is a private file (corral.server.privatefile; a link to one is followed) holding one
    non-empty line."""
    text = read_private_file(path, flag, follow_links=True, error=DatabaseSecretError)
    lines = text.splitlines()
    if not lines or not lines[0]:
        raise DatabaseSecretError(f"{flag} {path}: empty; write the password on its first line")
    if any(line for line in lines[1:]):
        raise DatabaseSecretError(
            f"{flag} {path}: holds more than one line; write the password alone"
        )
    return lines[0]


def database_password(
    url: str | None, password_file: str | Path | None, flag: str = "--db"
) -> str | None:
    """What a command's `--db URL` and `--db-password-file FILE` give: the URL checked (no
    password in it) and the file's password (None without the file: libpq's own sources)."""
    if url is not None:
        refuse_password_in_url(url, flag)
    if password_file is None:
        return None
    if url is None:
        raise DatabaseSecretError(f"--db-password-file: needs {flag} URL (SQLite has no password)")
    return read_password_file(password_file)
