"""A node's data-set cache directories (SiloD live, docs/silod.md#live): what the manager deletes
when its allocation gives a data set less room on a node than the data set's directory may hold.

A job fills its data set's directory as it reads (in multi-user mode the directory belongs to the
job's account). The manager, maybe root, deletes there, and nothing here follows a symbolic link:
the walk opens each directory relative to its parent's descriptor and checks that it is the
directory it listed (`os.fwalk`), files are unlinked relative to their directory's descriptor
(a link is removed, never followed), and a directory is removed whole by `shutil.rmtree`, which
does the same on Linux. So a job cannot make the manager delete anything outside the data set's
directory by swapping a link in while the manager works.

`trim(path, keep_bytes)` does the work on the machine it runs on; `CacheDirs` runs it on this
machine, one directory at a time in a thread of its own; the Ray executor runs it on a Ray node.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import stat
import threading
import uuid
from collections import deque
from pathlib import Path

log = logging.getLogger("corral.cache")

#: What a directory removed whole is renamed to at once (then deleted in the background).
EVICTED_PREFIX = ".evicted-"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]*$")


def node_dir_name(node: str) -> str:
    """A node's directory under the cache root: its name, or a digest of a name that is not a
    plain file name."""
    if _SAFE_NAME.match(node) and len(node) <= 128:
        return node
    return "node-" + hashlib.sha256(node.encode(errors="surrogateescape")).hexdigest()[:16]


def remove(path: str | Path) -> None:
    """Remove a data set's directory: renamed away at once (a later job finds none there and
    starts afresh), then deleted."""
    target = Path(path)
    hidden = evict(target)
    if hidden is not None:
        remove_renamed(hidden)


def evict(path: Path) -> Path | None:
    """Rename the directory `path` to a hidden name beside it (what `remove_renamed` deletes);
    a link or file in its place is unlinked; None when there is nothing left to delete."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(info.st_mode):
        path.unlink(missing_ok=True)
        return None
    hidden = path.with_name(f"{EVICTED_PREFIX}{path.name}-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(path, hidden)
    except FileNotFoundError:
        return None
    return hidden


def remove_renamed(path: Path) -> None:
    try:
        shutil.rmtree(path)  # on Linux: by descriptors, never through a link
    except FileNotFoundError:
        pass


def trim(path: str | Path, keep_bytes: int) -> int:
    """Delete files of the directory `path`, the least recently used first (the later of a file's
    access and modification times), until its regular files hold at most `keep_bytes`; the whole
    directory when `keep_bytes` <= 0. Returns the bytes deleted (0 for a directory removed whole,
    which is not measured). A missing directory is nothing to do."""
    target = Path(path)
    if keep_bytes <= 0:
        remove(target)
        return 0
    try:
        top = os.open(target, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return 0
    except OSError as error:  # ELOOP: a link in its place
        log.warning("cache directory %s: not trimmed: %s", target, error)
        return 0
    try:
        files: list[tuple[float, int, tuple[str, ...], str]] = []
        total = 0
        for root, _, names, root_fd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
            parts = tuple(part for part in root.split(os.sep) if part not in ("", "."))
            for name in names:
                try:
                    info = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                size = info.st_size if stat.S_ISREG(info.st_mode) else 0
                total += size
                files.append((max(info.st_atime, info.st_mtime), size, parts, name))
        if total <= keep_bytes:
            return 0
        files.sort(key=lambda entry: (entry[0], entry[2], entry[3]))
        doomed: dict[tuple[str, ...], list[tuple[str, int]]] = {}
        for _, size, parts, name in files:
            if total <= keep_bytes:
                break
            doomed.setdefault(parts, []).append((name, size))
            total -= size
        deleted = 0
        for parts, entries in doomed.items():
            fd = _open_beneath(top, parts)
            if fd is None:
                continue
            try:
                for name, size in entries:
                    try:
                        os.unlink(name, dir_fd=fd)
                    except (FileNotFoundError, IsADirectoryError, PermissionError):
                        continue
                    deleted += size
            finally:
                os.close(fd)
        return deleted
    finally:
        os.close(top)


def _open_beneath(top: int, parts: tuple[str, ...]) -> int | None:
    """A descriptor of the directory `parts` below `top`, each step opened without following a
    link; None if one was swapped for a link or is gone."""
    fd = os.dup(top)
    for part in parts:
        try:
            child = os.open(
                part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
            )
        except OSError:
            os.close(fd)
            return None
        os.close(fd)
        fd = child
    return fd


class CacheDirs:
    """Trims and removes cache directories on this machine (the local executor's one node), one
    at a time in a thread of its own, so that a large directory does not hold up the control
    loop. A directory removed whole is renamed away at once; one being trimmed is `busy` until it
    is done (the manager starts no reader of it until then)."""

    #: The manager creates the directories itself (the Ray executor's actors make theirs).
    local = True

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: deque[tuple[Path, int]] = deque()
        self._busy: set[Path] = set()
        self._thread: threading.Thread | None = None

    def trim(self, node: str, path: Path, keep_bytes: int) -> None:
        """Bring `path` down to `keep_bytes` (0: remove it) in the background."""
        if keep_bytes <= 0:
            hidden = evict(path)
            if hidden is not None:
                self._enqueue(hidden, 0)
            return
        self._enqueue(path, keep_bytes)

    def _enqueue(self, path: Path, keep_bytes: int) -> None:
        with self._lock:
            self._busy.add(path)
            self._queue.append((path, keep_bytes))
            if self._thread is None:  # the thread ends when the queue is empty
                self._thread = threading.Thread(
                    target=self._work, name="corral-cache-trim", daemon=True
                )
                self._thread.start()

    def busy(self, node: str, path: Path) -> bool:
        with self._lock:
            return path in self._busy

    def clear_evicted(self, node_dir: Path) -> None:
        """Delete what removals left half-done in a node's directory (a restart after a crash)."""
        try:
            names = os.listdir(node_dir)
        except OSError:
            return
        for name in names:
            if name.startswith(EVICTED_PREFIX):
                self._enqueue(node_dir / name, 0)

    def _work(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._thread = None
                    return
                path, keep = self._queue.popleft()
            try:
                if keep <= 0:
                    remove_renamed(path)
                else:
                    trim(path, keep)
            except OSError as error:
                log.warning("cache directory %s: %s", path, error)
            finally:
                with self._lock:
                    self._busy.discard(path)

    def idle(self) -> bool:
        """Nothing queued or running (for tests)."""
        with self._lock:
            return self._thread is None and not self._queue
