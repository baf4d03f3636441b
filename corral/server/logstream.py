"""A job's log streamed as it grows (GET /api/v1/jobs/{id}/logs/stream), for `corral logs -f`
and the client's follow_logs.

The body is the log file's bytes from the offset asked, exactly: nothing added, so a client that
counts the bytes it received knows the offset to read on from when the stream breaks (a restart
of the manager). The server looks at the file every POLL_S seconds and sends what was added; it
asks the store whether the attempt's log is final (its processes have ended) at most every
OVER_EVERY_S seconds while the file does not grow, and once it is, sends what is left and ends
the stream. A stream also ends after WINDOW_S seconds (the client opens another: a connection a
client forgot is never held for long), and where the log cap cut the file (the marker line that
says so is the plain read's: the client reads it there). A client that goes away ends it at once
(Starlette cancels the body's iteration on the disconnect). A user has at most MAX_PER_USER
streams open at a time; beyond, 429.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from starlette.concurrency import run_in_threadpool

from corral.server.logread import read_log

POLL_S = 0.2
OVER_EVERY_S = 1.0
WINDOW_S = 60.0
MAX_PER_USER = 8
CHUNK = 1 << 20


class Streams:
    """How many log streams each user has open (the API's event loop alone changes it)."""

    def __init__(self) -> None:
        self.open: dict[str, int] = {}

    def count(self, user: str) -> int:
        return self.open.get(user, 0)

    def total(self) -> int:
        return sum(self.open.values())

    def opened(self, user: str) -> None:
        self.open[user] = self.open.get(user, 0) + 1

    def closed(self, user: str) -> None:
        left = self.open.get(user, 0) - 1
        if left > 0:
            self.open[user] = left
        else:
            self.open.pop(user, None)


async def follow(
    streams: Streams,
    user: str,
    path: Path | None,
    offset: int,
    over: Callable[[], Awaitable[bool]],
    window_s: float | None = None,
) -> AsyncIterator[bytes]:
    """The bytes of the log at `path` from `offset` as they are written, until `over()` (the
    attempt's log is final: then what is left, and the end) or `window_s` (default WINDOW_S) passed. `path` None:
    the job has no attempt yet; the stream ends when `over()` says one began (or the job
    ended), or at the window's end."""
    streams.opened(user)
    try:
        deadline = time.monotonic() + (WINDOW_S if window_s is None else window_s)
        checked = float("-inf")
        final = False
        while True:
            if path is not None:
                read = await run_in_threadpool(read_log, path, offset, CHUNK)
                if len(read.text) != read.data_bytes:
                    return  # a marker first (the cap cut the file): the plain read says so
                if read.data_bytes:
                    offset = read.next_offset
                    yield read.text
                    continue
            if final:
                return  # all of it was sent after it became final
            now = time.monotonic()
            if now >= deadline:
                return
            if now - checked >= OVER_EVERY_S:
                checked = now
                final = await over()
                if final:
                    continue  # read once more: what it wrote before it ended
            await asyncio.sleep(POLL_S)
    finally:
        streams.closed(user)
