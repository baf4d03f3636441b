"""Leadership of a database that several managers share: one leads by lease, fenced writes.

Managers started with the same PostgreSQL database (`corral up --db`) elect one leader through a
row of the `leases` table (docs/ha.md): the leader renews it every `renew_s`; a standby takes it
once it has not been renewed for `lease_s` (by the database's clock), with one conditional UPDATE
that also adds one to its `epoch`. The epoch is the fencing token: every write transaction of the
leader renews the lease at its epoch just before it commits (`Lease.fence`, through
`Store.fence`), so a transaction of a manager another one replaced changes no row and is rolled
back; and the leader starts, stops or signals nothing unless its lease is sure to be its own
(`FencedExecutor`: renewed less than `lease_s - margin_s` ago, by its own clock).

A manager that finds itself replaced (a paused VM, a network cut, SIGSTOP) steps down by ending
its process at once, status EXIT_DEPOSED, after one line on stderr: it writes nothing more, and
its jobs run on under the new leader, which found them again. A supervisor (systemd's
Restart=always) starts it again, as a standby.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Connection

from corral.exec.local import AttemptEnded, AttemptLaunch
from corral.server.state import Executor
from corral.server.store import LeaseRow, Store, StoreError, StoreUnavailable

log = logging.getLogger("corral.manager")

#: The manager's lease (one row of `leases`).
LEASE_NAME = "manager"
#: A standby takes over once the leader has not renewed its lease for this long.
LEASE_S = 5.0
#: The leader renews its lease this often.
RENEW_S = 1.25
#: A standby tries to take the lease this often (one UPDATE that changes nothing while the
#: leader renews it).
STANDBY_POLL_S = 0.5
#: The leader acts (starts, stops) only while its lease has at least this long left.
MARGIN_S = 1.5
#: The exit status of a manager that another one replaced.
EXIT_DEPOSED = 3


class Deposed(StoreError):
    """Another manager leads now: this one writes nothing more."""


def holder_id() -> str:
    """This manager's name in the lease: host, process and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def exit_deposed(reason: str) -> None:
    """Step down: one line on stderr, then end the process at once (no thread writes again)."""
    try:
        sys.stderr.write(
            f"corral up: deposed: {reason}; this manager stops (exit {EXIT_DEPOSED})\n"
        )
        sys.stderr.flush()
    finally:
        os._exit(EXIT_DEPOSED)


class Lease:
    """This manager's side of the lease: take it, renew it, fence writes with it."""

    def __init__(
        self,
        store: Store,
        address: str,
        *,
        lease_s: float = LEASE_S,
        renew_s: float = RENEW_S,
        margin_s: float = MARGIN_S,
        poll_s: float = STANDBY_POLL_S,
        holder: str | None = None,
        on_deposed: Callable[[str], None] = exit_deposed,
    ) -> None:
        if not 0 < renew_s < lease_s - margin_s:
            raise ValueError(
                f"lease: renew every {renew_s:g} s, within its {lease_s:g} s less the "
                f"{margin_s:g} s margin"
            )
        self.store = store
        self.address = address
        self.lease_s = lease_s
        self.renew_s = renew_s
        self.margin_s = margin_s
        self.poll_s = poll_s
        self.holder = holder or holder_id()
        self.on_deposed = on_deposed
        self.epoch: int | None = None
        #: Until when (time.monotonic) this manager may act on its lease.
        self._valid_until = float("-inf")
        self.renewed_at: float | None = None  # time.time of the latest renewal
        #: The leader this one replaced when it took the lease (None: it was free).
        self.took_over_from: LeaseRow | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._deposed = False

    # -- standby ------------------------------------------------------------------------------

    def current(self) -> LeaseRow | None:
        """The lease as the database holds it (who leads, where, since when)."""
        return self.store.lease(LEASE_NAME)

    def try_take(self) -> bool:
        """Take the lease if it is free or expired; True when this manager leads now."""
        before = self.current()
        began = time.monotonic()
        epoch = self.store.take_lease(LEASE_NAME, self.holder, self.address, self.lease_s)
        if epoch is None:
            return False
        self.epoch = epoch
        self._valid_until = began + self.lease_s - self.margin_s
        self.renewed_at = time.time()
        if before is not None and before.holder:
            self.took_over_from = before
        return True

    def wait_to_lead(self, stopping: threading.Event | None = None) -> bool:
        """Try to take the lease every `poll_s` until it is taken (True) or `stopping` is set
        (False). The database being away is waited out."""
        stopping = stopping or self._stopping
        while not stopping.is_set():
            try:
                if self.try_take():
                    return True
            except StoreUnavailable as error:
                log.warning("standby: the database is unavailable: %s", error)
            stopping.wait(self.poll_s)
        return False

    # -- leading ------------------------------------------------------------------------------

    def start(self) -> None:
        """Fence every write of the store from now on and renew the lease in a thread."""
        if self.epoch is None:
            raise RuntimeError("the lease is not held")
        self.store.fence = self.fence
        self._thread = threading.Thread(target=self._renew_loop, name="corral-lease", daemon=True)
        self._thread.start()

    def stop(self, release: bool = True) -> None:
        """Stop renewing; `release`: give the lease up, so a standby takes over at once."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
        self.store.fence = None
        if release and self.epoch is not None and not self._deposed:
            try:
                self.store.release_lease(LEASE_NAME, self.holder, self.epoch)
            except StoreError as error:  # it expires by itself
                log.warning("could not release the lease: %s", error)
        self._valid_until = float("-inf")

    def valid(self) -> bool:
        """Whether this manager may act: its lease cannot have expired yet, by its own clock."""
        return time.monotonic() < self._valid_until

    def age_s(self) -> float | None:
        """Seconds since this manager last renewed its lease (None: never)."""
        return None if self.renewed_at is None else max(0.0, time.time() - self.renewed_at)

    def renew(self) -> bool:
        """Renew now: True when renewed; False (after stepping down) when another manager
        took the lease; StoreUnavailable while the database is away."""
        assert self.epoch is not None
        began = time.monotonic()
        if self.store.renew_lease(LEASE_NAME, self.holder, self.epoch, self.lease_s):
            self._valid_until = began + self.lease_s - self.margin_s
            self.renewed_at = time.time()
            return True
        self._step_down("another manager took the lease")
        return False

    def ensure(self) -> None:
        """Before acting (a start, a stop, a signal): the lease is valid, renewed now if it is
        not; StoreUnavailable when that cannot be known (nothing is done then)."""
        if self.valid():
            return
        if not self.renew():
            raise Deposed(f"{self.store.url}: another manager leads")

    def fence(self, connection: Connection) -> None:
        """Inside a write transaction, just before it commits: renew the lease at this
        manager's epoch in the same transaction. If another manager took it, nothing of the
        transaction is committed and this one steps down."""
        assert self.epoch is not None
        if not self.store.renew_lease(
            LEASE_NAME, self.holder, self.epoch, self.lease_s, connection=connection
        ):
            self._step_down("another manager took the lease (a write was refused)")
            raise Deposed(f"{self.store.url}: another manager leads")

    def _renew_loop(self) -> None:
        while not self._stopping.wait(self.renew_s):
            try:
                if not self.renew():
                    return
            except StoreUnavailable as error:
                log.warning("cannot renew the lease, the database is unavailable: %s", error)
            except Exception:
                log.exception("renewing the lease failed")

    def _step_down(self, reason: str) -> None:
        self._deposed = True
        self._valid_until = float("-inf")
        now = None
        try:
            now = self.current()
        except StoreError:
            pass
        if now is not None and now.holder != self.holder:
            reason += f" ({now.holder} at {now.address or '?'}, epoch {now.epoch})"
        self.on_deposed(reason)


class FencedExecutor:
    """An executor whose launches, stops and signals wait for nothing but happen only while
    this manager's lease is valid (`Lease.ensure`): a manager replaced while it was paused
    starts and stops nothing when it wakes up. Observing (poll, recover) is not fenced."""

    def __init__(self, inner: Executor, lease: Lease) -> None:
        self.inner = inner
        self.lease = lease

    def __getattr__(self, name: str) -> Any:  # the executor's optional attributes
        return getattr(self.inner, name)

    def launch(self, launch: AttemptLaunch) -> None:
        self.lease.ensure()
        self.inner.launch(launch)

    def stop(self, job_id: str, attempt: int) -> None:
        self.lease.ensure()
        self.inner.stop(job_id, attempt)

    def signal(self, job_id: str, attempt: int, number: int) -> None:
        self.lease.ensure()
        self.inner.signal(job_id, attempt, number)

    def poll(self) -> list[AttemptEnded]:
        return self.inner.poll()

    def recover(self, job_id: str, attempt: int, attempt_dir: Path) -> str | AttemptEnded:
        return self.inner.recover(job_id, attempt, attempt_dir)

    def leftover(self, job_id: str, attempt: int, attempt_dir: Path) -> int:
        return self.inner.leftover(job_id, attempt, attempt_dir)

    def close(self) -> None:
        self.inner.close()
