"""Real Unix accounts for the tests that run jobs, or attacks, as other users (root only)."""

from __future__ import annotations

import pwd
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from corral.exec.local import RunAs


def useradd(name: str) -> RunAs:
    """A system account without a home or a login shell, as the tests' jobs run under."""
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        check=True,
        capture_output=True,
    )
    entry = pwd.getpwnam(name)
    return RunAs(name, entry.pw_uid, entry.pw_gid, entry.pw_dir)


def userdel(name: str) -> None:
    """End every process of the account, then remove it (whatever remains of it)."""
    subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
    subprocess.run(["userdel", name], capture_output=True)


@contextmanager
def unix_account(prefix: str) -> Iterator[RunAs]:
    """A new account named `prefix-XXXXXX`, removed with its processes afterwards."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    run_as = useradd(name)
    try:
        yield run_as
    finally:
        userdel(name)
