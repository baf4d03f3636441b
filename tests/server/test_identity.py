"""Who a job runs as: the account checks, the permission walk, and what `corral up` says."""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.cli.common import UserError
from corral.cli.up import parse_size
from corral.server import identity
from corral.server.boot import BootError, ServerOptions, build_manager

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="multi-user mode needs root")


def test_single_user_mode_says_whose_account_every_job_runs_as(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nobody = pwd.getpwnam("nobody")
    monkeypatch.setattr(os, "geteuid", lambda: nobody.pw_uid)
    note = identity.single_user_note()
    assert note.startswith("single-user mode: corral runs as nobody, not root, so every job")
    assert not identity.multi_user_possible()


def test_accounts_that_may_not_run_jobs_are_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(identity.AccountError, match="^unix user: no Unix account 'no-such-x'"):
        identity.account("no-such-x")
    with pytest.raises(identity.AccountError, match="'root' is root; jobs never run as root"):
        identity.account("root")
    nobody = pwd.getpwnam("nobody")
    monkeypatch.setattr(os, "geteuid", lambda: nobody.pw_uid)  # as if the manager ran as nobody
    with pytest.raises(identity.AccountError, match="the manager's own account"):
        identity.account("nobody")
    monkeypatch.undo()
    run_as = identity.account("nobody")
    assert (run_as.uid, run_as.gid) == (nobody.pw_uid, nobody.pw_gid)


@pytest.fixture
def open_base() -> Iterator[Path]:
    """A directory under /tmp that every account may pass through (pytest's tmp_path is not)."""
    base = Path(tempfile.mkdtemp(prefix="corral-identity-"))
    try:
        base.chmod(0o711)
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_permission_walk_finds_the_first_directory_an_account_cannot_enter(
    open_base: Path, tmp_path: Path
) -> None:
    nobody = identity.account("nobody")
    assert identity.check_reachable(open_base / "x") is None
    (open_base / "open" / "deeper").mkdir(parents=True)
    (open_base / "closed" / "inner").mkdir(parents=True)
    (open_base / "open").chmod(0o711)
    (open_base / "open" / "deeper").chmod(0o755)
    (open_base / "closed").chmod(0o700)
    assert identity.may_enter(open_base / "open" / "deeper", nobody) is None
    closed = f"{open_base / 'closed'} (owner root, mode 0700)"
    assert identity.may_enter(open_base / "closed" / "inner", nobody) == closed
    assert identity.may_enter(open_base / "missing", nobody) == (
        f"{open_base / 'missing'}: No such file or directory"
    )
    # A link into the closed directory is followed, as the kernel would.
    (open_base / "open" / "link").symlink_to(open_base / "closed" / "inner")
    assert identity.may_enter(open_base / "open" / "link", nobody) == closed
    # pytest's base directory is root's, 0700: a data dir under it is out of reach.
    assert identity.check_reachable(tmp_path) is not None
    script = open_base / "open" / "deeper" / "run.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o700)
    assert identity.may_use(script, nobody) == f"{script} (mode 0700)"
    script.chmod(0o755)
    assert identity.may_use(script, nobody, execute=True) is None


def test_sizes_for_the_log_cap() -> None:
    assert parse_size("--log-cap", "1G") == 1 << 30
    assert parse_size("--log-cap", "200M") == 200 << 20
    assert parse_size("--log-cap", "1.5KiB") == 1536
    assert parse_size("--log-cap", "0") == 0
    for bad in ("lots", "-1G", "9E"):
        with pytest.raises(UserError, match="^--log-cap: "):
            parse_size("--log-cap", bad)


@needs_root
def test_root_refuses_a_data_dir_the_jobs_accounts_cannot_reach(tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    closed.chmod(0o700)
    with pytest.raises(BootError) as refused:
        build_manager(ServerOptions(data_dir=closed / "state", gpus=1))
    message = str(refused.value)
    assert message.startswith(f"--data-dir {closed / 'state'}: jobs run under their users'")
    assert "is closed to others" in message and "--single-user" in message
    # Nothing is left holding the directory: a single-user manager may start there at once.
    build_manager(ServerOptions(data_dir=closed / "state", gpus=1, single_user=True)).stop()


def test_people_s_uids_come_from_login_defs(tmp_path: Path) -> None:
    defs = tmp_path / "login.defs"
    defs.write_text("# UID_MIN 10\nUID_MIN\t\t 500\nUID_MAX   0x7530\nSYS_UID_MIN 100\n")
    assert identity.user_uid_range(defs) == (500, 30000)
    defs.write_text("UID_MIN lots\n")
    assert identity.user_uid_range(defs) == identity.DEFAULT_UID_RANGE
    assert identity.user_uid_range(tmp_path / "missing") == (1000, 60000)


def test_an_account_named_like_the_user_must_be_a_person_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    daemon = pwd.getpwnam("daemon")
    with pytest.raises(identity.AccountError) as refused:
        identity.account("daemon", named=False)
    assert str(refused.value).startswith(
        f"unix user: 'daemon' is a system account (uid {daemon.pw_uid}, below UID_MIN"
    )
    assert str(refused.value).endswith("`corral token create daemon --unix-user daemon`")
    assert identity.account("daemon").uid == daemon.pw_uid  # an admin named it
    nobody = pwd.getpwnam("nobody")
    if nobody.pw_uid > identity.user_uid_range()[1]:
        with pytest.raises(identity.AccountError, match=r"\(uid \d+, above UID_MAX \d+ in"):
            identity.account("nobody", named=False)
    # A missing account named like the user: the two ways out, in one line.
    with pytest.raises(identity.AccountError) as missing:
        identity.account("admin-without-account", named=False)
    message = str(missing.value)
    assert "`corral token create admin-without-account --unix-user ACCOUNT`" in message
    assert "`corral up --single-user`" in message and "\n" not in message


def test_the_workdir_walk_stops_where_the_account_cannot_search(open_base: Path) -> None:
    nobody = identity.account("nobody")
    (open_base / "closed" / "inner").mkdir(parents=True)
    (open_base / "closed").chmod(0o700)
    (open_base / "open").mkdir(mode=0o755)
    (open_base / "open").chmod(0o755)
    (open_base / "open" / "up").symlink_to("../closed/inner")
    (open_base / "open" / "loop").symlink_to("loop")
    closed = f"account nobody cannot enter {open_base / 'closed'} (owner root, mode 0700)"
    for path in ("closed/inner", "closed/none/deeper", "open/up", "open/../closed"):
        assert identity.workdir_problem_as(f"{open_base}/{path}", nobody) == closed
    assert identity.workdir_problem_as(str(open_base / "open"), nobody) is None
    assert identity.workdir_problem_as(f"{open_base}/open/./none", nobody) == (
        f"{open_base}/open/none does not exist on the manager's machine"
    )
    assert identity.workdir_problem_as(f"{open_base}/open/loop", nobody) == (
        f"{open_base}/open/loop: too many levels of symbolic links"
    )
    assert identity.workdir_problem_as("relative", nobody) == (
        "must be an absolute path on the manager's machine (got 'relative')"
    )
