"""Opening what the manager (maybe root) reads without trusting what others could have put there.

A file that root reads and acts on (an attempt's `launch.json` above all: its `run_as` says whose
account the workers run as, and `null` means root's own) must be one that nobody else could have
written or swapped. That holds when every directory from `/` down to the file, and the file
itself, belongs to root or to the manager's own account (`trusted_uids`) and is writable by no
one else, so that no one else can create, rename or remove an entry on the way:

* a directory's owner is trusted, and its mode lets neither its group nor others write; except
  that a directory others may write but that has the sticky bit (`/tmp`, 1777) may be passed
  through: there, others cannot rename or remove an entry they do not own, so the entry below it
  is as safe as its own owner (which the walk checks next: the data directory below `/tmp` must
  be root's, not one another user made first);
* the last directory (the one whose files are read) never has the sticky-bit exception;
* a file is a regular file (not a FIFO, a device, a link), owned by a trusted account, writable
  by no one else.

The walk opens each directory relative to its parent's descriptor with `O_NOFOLLOW`, so a link
swapped in on the way is refused rather than followed, and the files are opened relative to the
last directory's descriptor (`O_NOFOLLOW | O_NONBLOCK`: a FIFO in place of a file does not hang
the reader). A check that fails raises `UnsafePath`, one line naming the path and why.

Only the standard library is used: the shim imports this module.
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
#: The mode bits that let someone other than the owner write.
OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


class UnsafePath(ValueError):
    """A path root must not use: one line naming it and why."""


def trusted_uids() -> frozenset[int]:
    """The owners whose files the manager and its supervisors trust: root and themselves."""
    return frozenset({0, os.geteuid()})


def owner_name(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _trusted_names(trusted: Iterable[int]) -> str:
    return " or ".join(owner_name(uid).split(" ")[0] for uid in sorted(trusted))


def dir_problem(
    info: os.stat_result, path: str | Path, trusted: frozenset[int], *, passed: bool
) -> str | None:
    """Why the directory `path` (its `lstat`) is not one to trust, or None. `passed`: only passed
    through on the way to another (a sticky directory others may write is then acceptable)."""
    if not stat.S_ISDIR(info.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a directory"
        return f"{path} is {kind}"
    if info.st_uid not in trusted:
        return (
            f"{path} belongs to {owner_name(info.st_uid)}, not to {_trusted_names(trusted)}: "
            "its owner could change what the manager reads there"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & OTHERS_WRITE and not (passed and mode & stat.S_ISVTX):
        who = "others" if mode & stat.S_IWOTH else "its group"
        sticky = " and has no sticky bit" if passed else ""
        return f"{path} is writable by {who} (mode {mode:04o}){sticky}: they could swap its entries"
    return None


def file_problem(info: os.stat_result, path: str | Path, trusted: frozenset[int]) -> str | None:
    """Why the file `path` (its `fstat`) is not one to trust, or None."""
    if not stat.S_ISREG(info.st_mode):
        return f"{path} is not a regular file"
    if info.st_uid not in trusted:
        return f"{path} belongs to {owner_name(info.st_uid)}, not to {_trusted_names(trusted)}"
    mode = stat.S_IMODE(info.st_mode)
    if mode & OTHERS_WRITE:
        return f"{path} is writable by others than its owner (mode {mode:04o})"
    return None


def _open_dir_at(name: str, dir_fd: int | None, shown: str) -> int:
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            try:
                info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                raise error from None
            kind = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a directory"
            raise UnsafePath(f"{shown} is {kind}: not followed") from None
        raise OSError(error.errno, error.strerror, shown) from None


def open_trusted_dir(path: str | Path, trusted: frozenset[int] | None = None) -> int:
    """A descriptor of the directory `path` (absolute, no `..`), reached from `/` one component at
    a time without following links, each directory checked (`dir_problem`). Raises UnsafePath
    when one fails its check, OSError when one is missing."""
    trusted = trusted_uids() if trusted is None else trusted
    text = os.fspath(path)
    if not os.path.isabs(text):
        raise UnsafePath(f"{text}: not an absolute path")
    parts = [part for part in text.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise UnsafePath(f"{text}: has '..' in it")
    fd = os.open("/", DIR_FLAGS)
    shown = "/"
    try:
        for index in range(len(parts) + 1):
            problem = dir_problem(os.fstat(fd), shown, trusted, passed=index < len(parts))
            if problem is not None:
                raise UnsafePath(problem)
            if index == len(parts):
                return fd
            shown = "/" + "/".join(parts[: index + 1])
            child = _open_dir_at(parts[index], fd, shown)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    raise AssertionError("unreachable")


def check_trusted_dir(path: str | Path, trusted: frozenset[int] | None = None) -> str | None:
    """`open_trusted_dir`'s verdict as a line (None: trusted); a missing part is a problem too."""
    try:
        os.close(open_trusted_dir(path, trusted))
    except UnsafePath as error:
        return str(error)
    except OSError as error:
        return f"{error.filename or path}: {error.strerror or error}"
    return None


def make_dir_at(
    parent_fd: int, name: str, mode: int, shown: str, trusted: frozenset[int] | None = None
) -> int:
    """A descriptor of the directory `name` in `parent_fd`, made with `mode` when missing; one that
    exists already must pass `dir_problem` (a directory someone else made first is refused, never
    silently taken). Its mode is set to `mode` (the umask may differ)."""
    trusted = trusted_uids() if trusted is None else trusted
    try:
        os.mkdir(name, mode, dir_fd=parent_fd)
    except FileExistsError:
        pass
    fd = _open_dir_at(name, parent_fd, shown)
    try:
        problem = dir_problem(os.fstat(fd), shown, trusted, passed=False)
        if problem is not None:
            raise UnsafePath(problem)
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_trusted_file(
    dir_fd: int, name: str, shown: str | Path, trusted: frozenset[int] | None = None
) -> int:
    """A read descriptor of the file `name` in the (checked) directory `dir_fd`: not through a
    link, not blocking on a FIFO, and checked (`file_problem`). FileNotFoundError when missing,
    UnsafePath when it fails its check."""
    trusted = trusted_uids() if trusted is None else trusted
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise UnsafePath(f"{shown} is a symbolic link: not followed") from None
        raise
    try:
        problem = file_problem(os.fstat(fd), shown, trusted)
        if problem is not None:
            raise UnsafePath(problem)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_trusted_json(
    dir_fd: int, name: str, shown: str | Path, trusted: frozenset[int] | None = None
) -> Any:
    """The JSON document in the file `name` of the directory `dir_fd`, opened as
    `open_trusted_file` does. FileNotFoundError, UnsafePath, or ValueError for bad JSON."""
    fd = open_trusted_file(dir_fd, name, shown, trusted)
    with open(fd, encoding="utf-8", closefd=True) as document:
        return json.load(document)


def read_json_in(directory: str | Path, name: str) -> dict[str, Any] | None:
    """The JSON object in `directory/name`, where the directory (from `/` down) and the file pass
    their checks; None when either is missing, unsafe or the file is not a JSON object."""
    try:
        dir_fd = open_trusted_dir(directory)
    except (OSError, UnsafePath):
        return None
    try:
        data = read_trusted_json(dir_fd, name, Path(directory) / name)
    except (OSError, ValueError):  # UnsafePath is a ValueError
        return None
    finally:
        os.close(dir_fd)
    return data if isinstance(data, dict) else None
