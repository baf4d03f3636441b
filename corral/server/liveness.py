"""Liveness and readiness probes: `GET /healthz` and `GET /readyz`, for a supervisor (systemd, a
load balancer, Kubernetes) that sends no token.

`/healthz`: the process answers HTTP (always 200 while it does: no store, no lock, no token).
`/readyz`: the manager can do its work: 200 when the store answers a trivial query within
`PING_S`, the state is the store's (not being rebuilt after a failed write), and a scheduling
round ran within `ManagerSettings.ready_round_s` (the loop runs one at least every
`round_every_s`, also when idle), and, for a manager sharing its database with standbys, its lease
is valid (its body then says `"role": "leader"`; a standby answers 503 with `"role": "standby"`
and the leader's address: corral.server.standby); else 503 with the first reason that fails, in one line. Neither
takes the manager's lock: a control loop stuck holding it is what /readyz must report.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from corral.server.spec import one_line

if TYPE_CHECKING:
    from corral.server.manager import Manager

#: The longest /readyz waits for the store's answer.
PING_S = 2.0


class Readiness:
    """Asks the store one question at a time: a probe that comes while the last one's query is
    still out waits on that query, so a hung database ties up one thread, not one per probe."""

    def __init__(self, manager: Manager) -> None:
        self.manager = manager
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="corral-readyz")
        self._lock = threading.Lock()
        self._inflight: Future[None] | None = None

    def _ping(self) -> Future[None]:
        with self._lock:
            if self._inflight is None or self._inflight.done():
                self._inflight = self._pool.submit(self.manager.store.ping)
            return self._inflight

    def problem(self) -> str | None:
        """Why the manager is not ready (None: it is)."""
        manager = self.manager
        lease = manager.lease
        if lease is not None and not lease.valid():
            age = lease.age_s()
            return f"lease: not renewed for {age or 0:.0f} s: this manager may not lead"
        try:
            self._ping().result(timeout=PING_S)
        except FutureTimeout:
            return f"store: no answer to a trivial query within {PING_S:g} s"
        except Exception as error:  # the database refused, or is gone
            return f"store: unreachable: {one_line(str(error), 200)}"
        degraded = manager.degraded
        if degraded is not None:
            return f"store: the state is being rebuilt after a failed write ({degraded})"
        limit = manager.settings.ready_round_s
        last = manager.last_round_at
        if last is None:
            return "control loop: no scheduling round yet"
        age = manager.clock() - last
        if age > limit:
            return f"control loop: no scheduling round for {age:.0f} s (limit {limit:g} s)"
        return None


def add_liveness_routes(app: FastAPI, manager: Manager) -> None:
    readiness = Readiness(manager)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        """The process is up (it answers HTTP)."""
        return {"status": "ok"}

    @app.get("/readyz", include_in_schema=False)
    def readyz() -> JSONResponse:
        """200 {"status": "ready"}, or 503 {"status": "not ready", "reason": ONE LINE}."""
        problem = readiness.problem()
        role = role_fields(manager)
        if problem is None:
            return JSONResponse({"status": "ready", **role})
        return JSONResponse({"status": "not ready", "reason": problem, **role}, status_code=503)


def role_fields(manager: Manager) -> dict[str, object]:
    """What /readyz says of the manager's role: nothing for a manager alone (SQLite); the
    leader's lease for one that shares its database with standbys (docs/ha.md)."""
    lease = manager.lease
    if lease is None:
        return {}
    return {"role": "leader", "leader": lease.address, "epoch": lease.epoch}
