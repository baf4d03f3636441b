"""Reading a secret from a file (a database password, the metrics token) that only the
manager's user may read.

The checks are made on the file opened, never on its name, so nothing can be swapped between
the check and the read: a regular file (a FIFO is refused without blocking the reader), owned
by the manager's user or root, that neither group nor others may read or write (libpq's rule for
`.pgpass`), and no larger than a secret is."""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

#: A secret file longer than this is not one (a key, a log named by mistake): refused unread.
MAX_SECRET_BYTES = 4096


def read_private_file(
    path: str | Path, flag: str, *, follow_links: bool, error: type[ValueError] = ValueError
) -> str:
    """The text of the secret file `path`, checked as the module says; `error`, one line naming
    `flag` and the file (never its contents), otherwise. `follow_links`: whether a symbolic link
    may lead to the file (Kubernetes mounts its secrets so); the file it leads to is checked."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(path, flags if follow_links else flags | os.O_NOFOLLOW)
    except OSError as failure:
        raise error(f"{flag} {path}: cannot open it ({failure.strerror or failure})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise error(f"{flag} {path}: not a regular file")
        if info.st_uid not in (os.geteuid(), 0):
            owners = "root" if os.geteuid() == 0 else f"{_user_name(os.geteuid())} or root"
            raise error(
                f"{flag} {path}: owned by {_user_name(info.st_uid)}, not by {owners}: someone "
                "else could change it; chown it"
            )
        if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise error(
                f"{flag} {path}: group or others may open it (mode "
                f"{stat.S_IMODE(info.st_mode):04o}): chmod 600 it"
            )
        if info.st_size > MAX_SECRET_BYTES:
            raise error(
                f"{flag} {path}: {info.st_size} bytes, not a secret (at most {MAX_SECRET_BYTES})"
            )
        data = os.read(fd, MAX_SECRET_BYTES + 1)
    finally:
        os.close(fd)
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise error(f"{flag} {path}: not UTF-8 text") from None


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
