"""Who a job runs as: the Unix account behind a corral user.

A manager started as root runs in multi-user mode: each user's jobs run under a Unix account (the
token's `unix_user`, else the account named like the user), never root and never the manager's
own account, and a job's directories belong to that account. A manager started as any other user
runs every job as itself (single-user mode) and says so once at start.

The kernel does the rest: another user's job is another uid, so it cannot open this job's files
(mode 0700/0600), read `/proc/PID/environ` of its processes, or signal them.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

from corral.exec.local import RunAs


class AccountError(ValueError):
    """A Unix account that cannot run jobs; one line, naming the field."""


def multi_user_possible() -> bool:
    return os.geteuid() == 0


def single_user_note(why: str = "with --single-user") -> str:
    """The line that says, once at start, that every job runs as the manager's own account;
    `why` says why a root manager does so (`--single-user`, or the demo's reason)."""
    me = pwd.getpwuid(os.geteuid()).pw_name
    if os.geteuid() == 0:
        return (
            f"single-user mode: corral runs as root {why}, so every job runs as root and can "
            "read and change anything on this machine"
        )
    return (
        f"single-user mode: corral runs as {me}, not root, so every job runs as {me} and can "
        "read what that account can (run `corral up` as root to give each user's jobs their own "
        "Unix account)"
    )


def multi_user_note(
    accounts: str = "a token's --unix-user, else the account named like the user",
) -> str:
    """The line that says, once at start, that each user's jobs run under their own account."""
    return (
        f"multi-user mode: corral runs as root, so each user's jobs run under that user's Unix "
        f"account ({accounts})"
    )


#: Where the system says which uids are its users' (not its services'): shadow's login.defs.
LOGIN_DEFS = Path("/etc/login.defs")
#: login.defs' defaults, where it does not say.
DEFAULT_UID_RANGE = (1000, 60000)


def user_uid_range(login_defs: Path = LOGIN_DEFS) -> tuple[int, int]:
    """(UID_MIN, UID_MAX) of `login_defs`: the uids of people's accounts; system accounts
    (daemons, `nobody`) lie outside. Its defaults, 1000 and 60000, where it does not say."""
    found = dict(zip(("UID_MIN", "UID_MAX"), DEFAULT_UID_RANGE, strict=True))
    try:
        text = login_defs.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] in found:
            try:
                found[words[0]] = int(words[1], 0)
            except ValueError:
                continue
    return found["UID_MIN"], found["UID_MAX"]


def account(name: str, field: str = "unix user", *, named: bool = True) -> RunAs:
    """The account `name` as a RunAs; AccountError if it does not exist or may not run jobs.
    `named`: an admin named it (a token's `unix_user`); otherwise it is the account named like
    the corral user, which must be a person's account (uid in login.defs' UID_MIN..UID_MAX),
    never a system account such as `daemon` that a user merely shares a name with."""
    try:
        entry = pwd.getpwnam(name)
    except (KeyError, ValueError):
        if named:
            raise AccountError(
                f"{field}: no Unix account {name!r} on this machine (the user's token names it; "
                "an admin names one that exists with `corral token create USER --unix-user "
                "ACCOUNT`)"
            ) from None
        raise AccountError(
            f"{field}: no Unix account {name!r} on this machine: as root, corral runs each "
            f"user's jobs under a Unix account of theirs; an admin names one with `corral token "
            f"create {name} --unix-user ACCOUNT` (then submit with that token), or starts `corral "
            "up --single-user` to run every job as root"
        ) from None
    if entry.pw_uid == 0:
        raise AccountError(f"{field}: {name!r} is root; jobs never run as root")
    if entry.pw_uid == os.geteuid():
        raise AccountError(f"{field}: {name!r} is the manager's own account; jobs never run as it")
    if not named:
        low, high = user_uid_range()
        if not low <= entry.pw_uid <= high:
            where = f"below UID_MIN {low}" if entry.pw_uid < low else f"above UID_MAX {high}"
            raise AccountError(
                f"{field}: {name!r} is a system account (uid {entry.pw_uid}, {where} in "
                f"{LOGIN_DEFS}): a user's jobs run as it only if an admin names it, with "
                f"`corral token create {name} --unix-user {name}`"
            )
    return RunAs(user=entry.pw_name, uid=entry.pw_uid, gid=entry.pw_gid, home=entry.pw_dir)


def groups_of(run_as: RunAs) -> set[int]:
    return set(os.getgrouplist(run_as.user, run_as.gid))


#: As the kernel's limit on symbolic links followed in one lookup.
MAX_LINKS = 40


def _searchable(info: os.stat_result, run_as: RunAs, groups: set[int]) -> bool:
    if info.st_uid == run_as.uid:
        return bool(info.st_mode & stat.S_IXUSR)
    if info.st_gid in groups:
        return bool(info.st_mode & stat.S_IXGRP)
    return bool(info.st_mode & stat.S_IXOTH)


def _closed(path: str, info: os.stat_result) -> str:
    mode = stat.S_IMODE(info.st_mode)
    return f"{path} (owner {_user_name(info.st_uid)}, mode {mode:04o})"


def workdir_problem_as(path: str, run_as: RunAs) -> str | None:
    """Why the account may not make `path` its working directory, as that account would find
    out itself (one line), or None. The path is looked up one component at a time as the kernel
    would for it: a directory it may not search stops the walk there (`account X cannot enter
    DIR (owner, mode)`), and nothing beyond it is looked at, so the answer never tells whether
    something exists where the account cannot look; a symbolic link is followed (its target is
    readable to whoever may search its directory). Only then: missing, or not a directory. The
    owner, group and other bits decide (ACLs are not read); the kernel checks again when the
    job starts, as the account."""
    if not os.path.isabs(path):
        return f"must be an absolute path on the manager's machine (got {path!r})"
    groups = groups_of(run_as)
    todo = [part for part in path.split("/") if part]
    current = "/"
    links = 0
    while True:
        try:
            info = os.stat(current)
        except OSError as error:  # a directory of the walk went away meanwhile
            return f"{current}: {error.strerror}"
        if not _searchable(info, run_as, groups):
            return f"account {run_as.user} cannot enter {_closed(current, info)}"
        if not todo:
            return None
        part = todo.pop(0)
        if part == ".":
            continue
        if part == "..":
            current = os.path.dirname(current)
            continue
        child = os.path.join(current, part)
        try:
            found = os.lstat(child)
        except FileNotFoundError:
            return f"{child} does not exist on the manager's machine"
        except OSError as error:
            return f"{child}: {error.strerror}"
        if stat.S_ISLNK(found.st_mode):
            links += 1
            if links > MAX_LINKS:
                return f"{child}: too many levels of symbolic links"
            target = os.readlink(child)
            todo[:0] = [part for part in target.split("/") if part]
            if target.startswith("/"):
                current = "/"
            continue
        if not stat.S_ISDIR(found.st_mode):
            return f"{child} is not a directory (on the manager's machine)"
        current = child


def may_enter(path: Path, run_as: RunAs) -> str | None:
    """None if the account may reach `path` and enter it (search permission on every directory
    from the root down, by the usual owner / group / other bits); else the first place it may
    not, as a short phrase. Symbolic links are followed as the kernel would."""
    groups = groups_of(run_as)
    resolved = Path(os.path.realpath(path))
    for current in (*reversed(resolved.parents), resolved):
        try:
            info = os.stat(current)
        except OSError as error:
            return f"{current}: {error.strerror}"
        if not stat.S_ISDIR(info.st_mode):
            return f"{current}: not a directory"
        if info.st_uid == run_as.uid:
            allowed = info.st_mode & stat.S_IXUSR
        elif info.st_gid in groups:
            allowed = info.st_mode & stat.S_IXGRP
        else:
            allowed = info.st_mode & stat.S_IXOTH
        if not allowed:
            owner = _user_name(info.st_uid)
            return f"{current} (owner {owner}, mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def may_use(path: Path, run_as: RunAs, execute: bool = False) -> str | None:
    """None if the account may read (and, with `execute`, run) the file `path`; else why not."""
    resolved = Path(os.path.realpath(path))
    blocked = may_enter(resolved.parent, run_as)
    if blocked is not None:
        return blocked
    try:
        info = os.stat(resolved)
    except OSError as error:
        return f"{resolved}: {error.strerror}"
    if info.st_uid == run_as.uid:
        bits = info.st_mode >> 6
    elif info.st_gid in groups_of(run_as):
        bits = info.st_mode >> 3
    else:
        bits = info.st_mode
    needed = 0o5 if execute else 0o4
    if bits & needed != needed:
        return f"{resolved} (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def check_reachable(directory: Path) -> str | None:
    """In multi-user mode jobs must reach their directories under the data dir: None if every
    directory above `directory` lets others search it, else the first that does not."""
    resolved = Path(os.path.realpath(directory))
    for parent in reversed(resolved.parents):
        info = os.stat(parent)
        if not info.st_mode & stat.S_IXOTH:
            return f"{parent} (mode {stat.S_IMODE(info.st_mode):04o})"
    return None
