"""Reading a worker's log file for the API: capped files (corral.exec.logcap), tails, and files a
job's own account may have tampered with.

In multi-user mode a job's account owns its log files, so the job may have put anything at that
path: the file is opened without following a symbolic link (O_NOFOLLOW) and without blocking on a
FIFO (O_NONBLOCK), and read only when fstat says it is a regular file.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from corral.exec import logcap


class UnreadableLog(Exception):
    """The log's path holds something other than a regular file; the message is one line."""


@dataclass(slots=True, frozen=True)
class LogRead:
    #: What to send: the log's bytes, after a marker line when the cap dropped some.
    text: bytes
    #: The byte offset in the file where the next read starts (markers do not count).
    next_offset: int
    #: How many of the file's bytes `text` holds (less than asked: the end of the file).
    data_bytes: int


def dropped_marker(count: int) -> bytes:
    return f"[corral: {count} earlier bytes of this log were dropped (log cap)]\n".encode()


def restart_marker(offset: int) -> bytes:
    return (
        f"[corral: this log is shorter than offset {offset}: it was cut back (log cap); "
        "reading it again from its start]\n"
    ).encode()


def read_log(path: Path, offset: int, max_bytes: int, tail: int | None = None) -> LogRead:
    """Up to `max_bytes` of the log at `path` from byte `offset`, or, with `tail`, from the
    start of its last `tail` lines. A missing file reads as empty (not written yet). An offset
    past the end of the file means that the file was truncated under the reader (the cap on a
    filesystem without holes): it reads again from the start, after a marker line."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return LogRead(b"", offset if tail is None else 0, 0)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise UnreadableLog(f"{path.name} is a symbolic link: not followed") from None
        if error.errno == errno.ENAMETOOLONG:
            return LogRead(b"", offset if tail is None else 0, 0)
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnreadableLog(f"{path.name} is not a regular file: not read")
        marker = b""
        if tail is not None:
            start = logcap.tail_offset(fd, tail)
            dropped = logcap.data_start(fd)
            if 0 < dropped and start <= dropped:  # the lines asked for reach into the dropped part
                marker = dropped_marker(dropped)
            chunk = logcap.read_range(fd, start, max_bytes)
        else:
            chunk = logcap.read_range(fd, offset, max_bytes)
            if chunk.next_offset - len(chunk.data) - chunk.skipped != offset:
                marker = restart_marker(offset)  # read_range started again from 0
            if chunk.skipped:
                marker += dropped_marker(chunk.skipped)
        return LogRead(marker + chunk.data, chunk.next_offset, len(chunk.data))
    finally:
        os.close(fd)
