"""The manager's side of the progress protocol: tail a worker's progress file.

    tail = ProgressTail(path)
    for r in tail.read(now):       # the reports appended since the last call
        ...                        # r.time, r.step, r.loss, r.samples

Pure: no threads, no clock (a report without "time" gets the `now` passed in), at most one open
and one bounded read per call: a file not there yet, or the same file at the size already read,
costs one look at its name (no open, no exception), as most calls find it. The file lives where the job's account can write, so the job may put
anything there; the reader assumes nothing of it:

- it never follows a symlink at the last component (O_NOFOLLOW) and never blocks on a FIFO
  (O_NONBLOCK, then fstat: anything but a regular file is treated as missing, `last_error`
  saying so);
- it reads at most `max_read_bytes` per call (the rest on later calls), and keeps at most
  `max_line_bytes` of a line that has no "\\n" yet: a longer line is skipped whole, however many
  calls it spans;
- a line it cannot use (too long, not UTF-8, not JSON, NaN or Infinity, not an object, `step`
  missing, not a finite number >= 0 or a bool, `time`, `loss` or `samples` not a finite number,
  `samples` < 0, `total_steps` not a finite number > 0) is skipped and counted in `malformed`,
  `last_error` naming its line number;
- a file that shrank, or was replaced (another inode), is read again from its start.

Steps going backwards are reports like any other (a restart from a checkpoint): the reader does
not judge. Metrics other than time, step, loss, samples and total_steps are ignored.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from corral.progress import MAX_LINE_BYTES

__all__ = ["ProgressTail", "Report", "parse_line"]


@dataclass(frozen=True, slots=True)
class Report:
    """One progress line: wall-clock seconds, the job's step count, its latest training loss,
    the samples it processed so far and the steps its whole run will make (None where the line
    had none)."""

    time: float
    step: float
    loss: float | None = None
    samples: float | None = None
    total_steps: float | None = None


class MalformedLine(ValueError):
    """Why a line is not a report (one line, without the line number)."""


class ProgressTail:
    """The reports appended to `path` since the last `read`, incrementally by file offset."""

    def __init__(
        self, path: Path, *, max_line_bytes: int = MAX_LINE_BYTES, max_read_bytes: int = 1 << 20
    ) -> None:
        if max_line_bytes < 1 or max_read_bytes < 1:
            raise ValueError(
                f"ProgressTail: max_line_bytes and max_read_bytes must be positive "
                f"(got {max_line_bytes}, {max_read_bytes})"
            )
        self.path = Path(path)
        self._name = os.fspath(self.path)
        self.max_line_bytes = max_line_bytes
        self.max_read_bytes = max_read_bytes
        #: Lines skipped because they were not reports, over the tail's life.
        self.malformed = 0
        #: The latest problem, on one line ("" until there is one).
        self.last_error = ""
        #: How far the file has been read (the bytes of `_partial` included).
        self.offset = 0
        self._identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the file read
        self._partial = b""  # the start of a line whose "\n" has not been read yet
        self._skipping = False  # inside a line longer than max_line_bytes
        self._line = 0  # complete lines read so far from the file's start

    def read(self, now: float) -> list[Report]:
        """The reports appended since the last call, oldest first; [] while the file is missing
        (or is not a regular file: `last_error` says so)."""
        if self._unchanged():
            return []
        fd = self._open()
        if fd is None:
            return []
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                self.last_error = f"{self.path}: not a regular file, not read"
                return []
            identity = (st.st_dev, st.st_ino)
            if identity != self._identity or st.st_size < self.offset:
                self._restart(identity)
            wanted = min(self.max_read_bytes, st.st_size - self.offset)
            if wanted <= 0:
                return []
            chunk = os.pread(fd, wanted, self.offset)
        except OSError as error:
            self.last_error = f"{self.path}: {error.strerror or error}"
            return []
        finally:
            os.close(fd)
        self.offset += len(chunk)
        return self._parse(chunk, now)

    def skip_to_end(self) -> None:
        """Take what the file holds now as read: only later reports are returned (a manager
        that restarted does not count again what it measured before). Up to the last complete
        line: a partial one is read when it ends."""
        fd = self._open()
        if fd is None:
            return
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return
            self._restart((st.st_dev, st.st_ino))
            size = st.st_size
            # Back from the end to just after the last "\n" (at most one line's length).
            start = max(0, size - self.max_line_bytes - 1)
            tail = os.pread(fd, size - start, start)
        except OSError:
            return
        finally:
            os.close(fd)
        newline = tail.rfind(b"\n")
        self.offset = start + newline + 1 if newline >= 0 else size
        self._skipping = newline < 0 and size > 0

    def _unchanged(self) -> bool:
        """Nothing to read, seen without opening the file: it is not there (yet), or it is the
        file read so far, a regular file of the size already read. Anything else (a new file,
        more bytes, a link, a FIFO) is left to the descriptor's checks."""
        if self._identity is None:
            return not os.access(self._name, os.F_OK, follow_symlinks=False)
        try:
            st = os.lstat(self._name)
        except OSError:
            return False  # gone, or unreadable: `_open` says what it finds
        return (
            stat.S_ISREG(st.st_mode)
            and (st.st_dev, st.st_ino) == self._identity
            and st.st_size == self.offset
        )

    def _open(self) -> int | None:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
        try:
            return os.open(self._name, flags)
        except FileNotFoundError:
            return None
        except OSError as error:
            if error.errno == errno.ELOOP:
                self.last_error = f"{self.path}: a symlink, not followed"
            else:
                self.last_error = f"{self.path}: {error.strerror or error}"
            return None

    def _restart(self, identity: tuple[int, int]) -> None:
        self._identity = identity
        self.offset = 0
        self._partial = b""
        self._skipping = False
        self._line = 0

    def _parse(self, chunk: bytes, now: float) -> list[Report]:
        data = self._partial + chunk if self._partial else chunk
        reports: list[Report] = []
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            line = data[start:end]
            start = end + 1
            self._line += 1
            if self._skipping:
                self._skipping = False
                self._malformed(f"longer than {self.max_line_bytes} bytes")
            elif len(line) > self.max_line_bytes:
                self._malformed(f"longer than {self.max_line_bytes} bytes")
            elif line.strip():
                try:
                    reports.append(parse_line(line, now))
                except MalformedLine as error:
                    self._malformed(str(error))
        rest = data[start:]
        if self._skipping or len(rest) > self.max_line_bytes:
            self._skipping = True
            rest = b""
        self._partial = rest
        return reports

    def _malformed(self, why: str) -> None:
        self.malformed += 1
        self.last_error = f"{self.path}: line {self._line}: {why}"


def parse_line(line: bytes, now: float) -> Report:
    """The report on one line (without its "\\n"); MalformedLine says why it is none."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedLine("not UTF-8") from None
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except MalformedLine:
        raise
    except (ValueError, RecursionError):
        raise MalformedLine("not JSON") from None
    if not isinstance(value, dict):
        raise MalformedLine(f"not a JSON object but {_json_type(value)}")
    if "step" not in value:
        raise MalformedLine('no "step"')
    step = _number(value, "step", minimum=0.0)
    time = _number(value, "time")
    loss = _number(value, "loss")
    samples = _number(value, "samples", minimum=0.0)
    total_steps = _number(value, "total_steps")
    if total_steps is not None and total_steps <= 0:
        raise MalformedLine('"total_steps" is not positive')
    assert step is not None
    return Report(
        time=now if time is None else time,
        step=step,
        loss=loss,
        samples=samples,
        total_steps=total_steps,
    )


def _refuse_constant(name: str) -> object:
    raise MalformedLine(f"{name} is not JSON")


def _number(fields: dict[str, object], name: str, minimum: float | None = None) -> float | None:
    """fields[name] as a float; None if absent or null (step is checked present before)."""
    value = fields.get(name)
    if value is None:
        if name == "step" and name in fields:
            raise MalformedLine('"step" is null')
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MalformedLine(f'"{name}" is {_json_type(value)}, not a number')
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise MalformedLine(f'"{name}" is not finite')
    if minimum is not None and number < minimum:
        raise MalformedLine(f'"{name}" is negative')
    return number


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a bool"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"
