"""The progress protocol: a job appends one JSON object per line to `$CORRAL_PROGRESS_FILE`.

    from corral.progress import report
    report(step, loss=loss, samples=samples_so_far)

corral gives every worker of a job its own file (the variable names it); the manager reads rank
0's. Any language can speak the protocol (docs/progress.md); this module is the Python helper.
Outside corral the variable is unset and `report` does nothing, so a script runs unchanged.

Importing this module imports nothing heavy (the standard library only, and nothing else of
corral): a training script may import it before torch. The manager's side is
`corral.progress.reader`; the framework callbacks are `corral.progress.lightning` and
`corral.progress.huggingface`, each importing its framework when it is imported itself.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import threading
import time
import warnings

__all__ = ["ENV_VAR", "MAX_LINE_BYTES", "MAX_STRING_CHARS", "rank_zero", "report"]

#: The variable that names a worker's progress file.
ENV_VAR = "CORRAL_PROGRESS_FILE"
#: The longest line `report` writes, its "\n" included (the reader's default limit).
MAX_LINE_BYTES = 4096
#: The longest string a metric may hold.
MAX_STRING_CHARS = 256
#: The longest metric name.
MAX_NAME_CHARS = 64


def rank_zero() -> bool:
    """Whether this process is the job's global rank 0: `$RANK` (set by corral for each worker,
    and by torchrun) is unset, empty or 0.

    `report` writes on every rank (each worker has its own file) and the manager reads rank 0's,
    so `if rank_zero(): report(...)` only saves the other ranks the write."""
    value = os.environ.get("RANK", "").strip()
    if not value:
        return True
    try:
        return int(value) == 0
    except ValueError:
        return False


def report(
    step: float,
    loss: float | None = None,
    samples: float | None = None,
    *,
    total_steps: float | None = None,
    **metrics: object,
) -> bool:
    """Append one progress line to `$CORRAL_PROGRESS_FILE`.

    step: the job's own step count (a finite number >= 0); loss: the latest training loss;
    samples: the samples processed so far (cumulative, >= 0); total_steps: the steps the whole
    run will make (a finite number > 0; the manager's ETA needs it, from here or from the job's
    spec); `time` (wall-clock seconds) is `time.time()` unless given; any other keyword is a
    metric whose value must be a JSON scalar (a finite number, a bool, None, or a string of at
    most 256 characters).

    Returns True when the line was written; False when the variable is unset or empty (outside
    corral), or when the file could not be written (a RuntimeWarning says why: progress
    reporting never stops a training run). Raises ValueError, with a one-line message, for a
    value the protocol does not allow, inside corral or not, so a script fails the same way
    everywhere. Thread-safe; each line is one `os.write` to a file opened with O_APPEND, so the
    lines of concurrent writers (threads, forked workers, torchrun's processes) never mix.
    """
    line = encode(step, loss, samples, metrics, total_steps=total_steps)
    path = os.environ.get(ENV_VAR, "")
    if not path:
        return False
    try:
        _append(path, line)
    except OSError as error:
        warnings.warn(
            f"corral.progress: could not write to {path}: {error}", RuntimeWarning, stacklevel=2
        )
        return False
    return True


def encode(
    step: float,
    loss: float | None = None,
    samples: float | None = None,
    metrics: dict[str, object] | None = None,
    *,
    total_steps: float | None = None,
) -> bytes:
    """The line `report` writes (its "\\n" included), validated; ValueError otherwise."""
    fields: dict[str, object] = {"step": _number("step", step, minimum=0.0)}
    extra = dict(metrics or {})
    total: object = extra.pop("total_steps", None) if total_steps is None else total_steps
    given_time = extra.pop("time", None)
    fields["time"] = time.time() if given_time is None else _number("time", given_time)
    if loss is not None:
        fields["loss"] = _number("loss", loss)
    if samples is not None:
        fields["samples"] = _number("samples", samples, minimum=0.0)
    if total is not None:
        steps = _number("total_steps", total)
        if steps <= 0:
            raise ValueError(f"progress total_steps: must be > 0, got {_show(total)}")
        fields["total_steps"] = steps
    for name, value in extra.items():
        if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS:
            raise ValueError(
                f"progress metric name {_show(name)}: must be a non-empty string of at most "
                f"{MAX_NAME_CHARS} characters"
            )
        fields[name] = _scalar(name, value)
    line = (json.dumps(fields, separators=(",", ":"), allow_nan=False) + "\n").encode()
    if len(line) > MAX_LINE_BYTES:
        raise ValueError(
            f"progress report: {len(line)} bytes long, the limit is {MAX_LINE_BYTES} "
            "(fewer or shorter metrics)"
        )
    return line


def _number(name: str, value: object, minimum: float | None = None) -> int | float:
    """A finite real number (int stays int; numpy's scalars become Python's); not a bool."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"progress {name}: must be a finite number, got {_show(value)}")
    try:
        as_float = float(value)
    except (OverflowError, ValueError, TypeError):
        raise ValueError(f"progress {name}: must be a finite number, got {_show(value)}") from None
    if not math.isfinite(as_float):
        raise ValueError(f"progress {name}: must be a finite number, got {_show(value)}")
    if minimum is not None and as_float < minimum:
        raise ValueError(f"progress {name}: must be >= {minimum:g}, got {_show(value)}")
    return int(value) if isinstance(value, numbers.Integral) else as_float


def _scalar(name: str, value: object) -> object:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        if len(value) > MAX_STRING_CHARS:
            raise ValueError(
                f"progress {name}: a string of at most {MAX_STRING_CHARS} characters, "
                f"got {len(value)}"
            )
        return value
    if isinstance(value, numbers.Real):
        return _number(name, value)
    raise ValueError(
        f"progress {name}: must be a JSON scalar (a finite number, a bool, None or a short "
        f"string), got {_show(value)}"
    )


def _show(value: object) -> str:
    """`value` for a one-line message: its repr on one line, cut to 40 characters."""
    try:
        text = " ".join(repr(value).split())
    except Exception:  # a repr that fails says nothing useful
        text = f"a {type(value).__name__}"
    return text if len(text) <= 40 else text[:37] + "..."


class _Open:
    """The file `report` keeps open: its path and identity (to notice its removal)."""

    __slots__ = ("path", "fd", "identity")

    def __init__(self, path: str, fd: int, identity: tuple[int, int]) -> None:
        self.path = path
        self.fd = fd
        self.identity = identity


_lock = threading.Lock()
_open: _Open | None = None


def _append(path: str, line: bytes) -> None:
    with _lock:
        fd = _fd_for(path)
        view = memoryview(line)
        while view:  # one write for a regular file; the loop only finishes an interrupted one
            view = view[os.write(fd, view) :]


def _fd_for(path: str) -> int:
    """An fd appending to `path`: the one kept open, unless the variable now names another file
    or the file was removed or replaced since (then the line goes to the new one)."""
    global _open
    if _open is not None:
        if _open.path == path:
            try:
                st = os.stat(path)
            except OSError:
                pass
            else:
                if (st.st_dev, st.st_ino) == _open.identity:
                    return _open.fd
        _close()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    st = os.fstat(fd)
    _open = _Open(path, fd, (st.st_dev, st.st_ino))
    return fd


def _close() -> None:
    global _open
    if _open is not None:
        try:
            os.close(_open.fd)
        except OSError:
            pass
        _open = None


def _after_fork_in_child() -> None:
    # The parent's lock may have been held by another thread at the fork; the fd stays valid.
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
