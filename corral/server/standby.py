"""A standby manager's HTTP answers while another manager leads the database (docs/ha.md).

A standby holds no scheduler state: every API call is answered 503 with the leader's address, in
the `X-Corral-Leader` header and the JSON body's `leader` (clients that list several managers in
CORRAL_URL go there: corral.client); `/healthz` is 200 (the process is up), `/readyz` 503 with
`"role": "standby"` and the leader, `/metrics` says the role. Once this manager takes the lease,
the standby server stops and the manager's own API takes its port.
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from corral.server.leader import Lease
from corral.server.store import StoreError

#: The header naming the leader's address in a standby's answers.
LEADER_HEADER = "X-Corral-Leader"
#: How long a standby keeps the leader's address it read before reading it again.
LEADER_READ_S = 0.5


class LeaderHint:
    """The leader's address as the lease says, read at most every LEADER_READ_S."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self._lock = threading.Lock()
        self._read_at = float("-inf")
        self._address = ""

    def address(self) -> str:
        with self._lock:
            if time.monotonic() - self._read_at >= LEADER_READ_S:
                self._read_at = time.monotonic()
                try:
                    current = self.lease.current()
                except StoreError:
                    current = None
                self._address = current.address if current is not None else ""
            return self._address


def standby_app(lease: Lease) -> Starlette:
    hint = LeaderHint(lease)

    def refused(leader: str) -> dict[str, str]:
        where = f"the leader is {leader}" if leader else "no manager leads right now"
        return {
            "detail": f"standby: this manager does not lead the database; {where}",
            "leader": leader,
            "role": "standby",
        }

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok", "role": "standby"})

    def readyz(request: Request) -> Response:
        leader = hint.address()
        body = refused(leader) | {"status": "not ready"}
        body["reason"] = body.pop("detail")
        return JSONResponse(body, status_code=503, headers={LEADER_HEADER: leader})

    def metrics(request: Request) -> Response:
        return PlainTextResponse(
            "# HELP corral_manager_leader 1 while this manager leads (it schedules and writes), "
            "0 for a standby.\n# TYPE corral_manager_leader gauge\ncorral_manager_leader 0.0\n",
            media_type="text/plain; version=0.0.4; charset=utf-8",
        )

    def anything(request: Request) -> Response:
        leader = hint.address()
        return JSONResponse(refused(leader), status_code=503, headers={LEADER_HEADER: leader})

    methods = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
    return Starlette(
        routes=[
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics),
            Route("/{path:path}", anything, methods=methods),
        ]
    )


class StandbyServer:
    """The standby's answers on the manager's own address, in a thread, until `stop`."""

    def __init__(self, lease: Lease, host: str, port: int) -> None:
        if port == 0:
            with socket.socket() as probe:
                probe.bind((host, 0))
                port = probe.getsockname()[1]
        config = uvicorn.Config(
            standby_app(lease),
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=1,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="corral-standby", daemon=True)

    def start(self) -> StandbyServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started and self.thread.is_alive():
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
