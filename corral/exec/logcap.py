"""Cap a job's log files without moving a byte of them, and read them back.

A worker writes its stdout and stderr straight into files (O_APPEND), and its supervisor (the
shim locally, the guard on a Ray node) calls `cap_file` every fraction of a second. Past the cap,
the oldest part of the file is given back to the filesystem as a hole (fallocate's
PUNCH_HOLE): the file keeps its length, so every byte offset a reader or a follower holds stays
valid, but only the newest `cap` bytes (at most) take disk space. A reader (`read_range`) that
lands in the hole is moved to the first byte still there and told how many it skipped, and the
API writes one marker line for them.

Where the filesystem cannot punch holes (some network filesystems), the file is truncated to
nothing instead: its writers go on at offset 0, and a reader past the end starts again from 0.

Only the standard library: the shim imports this module and must start fast.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from dataclasses import dataclass

#: A log stream's default cap, in bytes (per worker and stream).
DEFAULT_CAP_BYTES = 1 << 30
#: Holes are punched in whole blocks of this size.
BLOCK = 4096

_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02

_libc: ctypes.CDLL | None = None


def _fallocate() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        if name is None:
            return None
        _libc = ctypes.CDLL(name, use_errno=True)
    function = _libc.fallocate
    function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    function.restype = ctypes.c_int
    return function


def data_start(fd: int) -> int:
    """The offset of the first byte not yet dropped (the file's size when it is all hole)."""
    try:
        return os.lseek(fd, 0, os.SEEK_DATA)
    except OSError as error:
        if error.errno == errno.ENXIO:  # no data at all past offset 0
            return os.fstat(fd).st_size
        return 0  # the filesystem does not know SEEK_DATA: nothing was dropped by a hole


def cap_file(fd: int, cap_bytes: int) -> int:
    """Keep at most about `cap_bytes` of the file behind `fd` (open for writing); returns how
    many more bytes were dropped now (0 when under the cap).

    Drops down to half the cap at once, so a steady writer costs one punch per half-cap written.
    """
    if cap_bytes <= 0:
        return 0
    size = os.fstat(fd).st_size
    start = data_start(fd)
    if size - start <= cap_bytes:
        return 0
    end = (size - cap_bytes // 2) // BLOCK * BLOCK
    if end <= start:
        return 0
    fallocate = _fallocate()
    if fallocate is not None:
        result = fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, start, end - start)
        if result == 0:
            return end - start
    os.ftruncate(fd, 0)  # no holes here: start over (the writers use O_APPEND)
    return size


@dataclass(slots=True, frozen=True)
class LogChunk:
    data: bytes
    #: Where the next read should start.
    next_offset: int
    #: Bytes between the offset asked for and `data` that were dropped by the cap.
    skipped: int


def read_range(fd: int, offset: int, max_bytes: int) -> LogChunk:
    """Up to `max_bytes` from `offset`, skipping over what the cap dropped."""
    size = os.fstat(fd).st_size
    if offset > size:  # the file was truncated (no holes here): start again from its beginning
        offset = 0
    start = offset
    try:
        start = os.lseek(fd, offset, os.SEEK_DATA)
    except OSError as error:
        if error.errno == errno.ENXIO:  # only hole (or nothing) from offset on
            start = size
    data = os.pread(fd, max_bytes, start) if start < size else b""
    return LogChunk(data, start + len(data), start - offset)


def tail_offset(fd: int, lines: int, max_scan: int = 64 << 20) -> int:
    """The offset where the last `lines` lines of the file begin (a line ends with a newline;
    a last line without one counts). Reads backwards at most `max_scan` bytes."""
    size = os.fstat(fd).st_size
    floor = max(data_start(fd), size - max_scan, 0)
    if lines <= 0:
        return size
    position = size
    # A final newline ends the last line: it does not start a new one.
    wanted = lines + 1 if size > floor and os.pread(fd, 1, size - 1) == b"\n" else lines
    found = 0
    while position > floor:
        step = min(1 << 16, position - floor)
        block = os.pread(fd, step, position - step)
        for index in range(len(block) - 1, -1, -1):
            if block[index] == 0x0A:
                found += 1
                if found == wanted:
                    return position - step + index + 1
        position -= step
    return floor
