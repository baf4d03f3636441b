"""Bounds on the API's connections, kept before any HTTP is parsed, so that no client (a job
flooding the port among them) can take the API from the others.

Each connection is counted against its *peer* and against the total. A peer is the Unix account
that owns the connecting socket when the kernel can tell (a connection from this machine: on
loopback every client is 127.0.0.1, and a per-address limit would put the admin's CLI and every
tenant's jobs in one bucket), else the client's address. The kernel is asked through
NETLINK_SOCK_DIAG, one exact lookup by the connection's two addresses and ports: a hash lookup
there, however many sockets are open (reading /proc/net/tcp instead costs a scan of every socket
on the machine, per connection).

`GuardedHttpProtocol` (uvicorn's httptools protocol, which `corral up` runs) applies
`ConnectionLimits`:

- a connection over the total or its peer's cap is answered 503 and closed as it is accepted,
  before a byte is read; root's and the manager's own account's connections are held to their
  peer's cap only, so that the admin gets in when many tenants together fill the total;
- a request whose headers are not in within `header_timeout_s` of its first byte (of the
  connection, for its first request), or are longer than `max_header_bytes` (431), is closed;
- a body not in whole within `body_timeout_s` of its headers is closed;
- a kept-alive connection idle for `idle_timeout_s` is closed, and one that has served
  `max_requests` requests is closed after the last one (`Connection: close`).

What was refused is counted by reason (`corral_connections_refused_total` in /metrics) and
logged at most once a minute per peer.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import os
import pwd
import resource
import socket
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("corral.connections")

#: Why a connection was refused: the `reason` label of corral_connections_refused_total.
REFUSALS = {
    "max_connections": "the manager holds its most connections at once",
    "max_per_peer": "its peer holds its most connections at once",
    "header_timeout": "its request's headers were not in within the header timeout",
    "header_too_large": "its request's headers were longer than allowed",
    "body_timeout": "its request's body was not in within the body timeout",
}
#: A peer's refusals are logged at most this often (seconds); the line counts those in between.
LOG_EVERY_S = 60.0


@dataclass(slots=True, frozen=True)
class ConnectionLimits:
    """`corral up --max-connections`, `--max-connections-per-peer`, `--header-timeout-s`,
    `--body-timeout-s`, `--idle-timeout-s`, `--max-requests-per-connection`."""

    #: Connections open at once, in all. `ConnectionGuard` lowers it to half the process's
    #: open-file limit: the rest is for the database, logs and the executor.
    max_connections: int = 4096
    #: Connections open at once from one peer (a Unix account on this machine, else an address).
    max_per_peer: int = 256
    #: A request's line and headers must be in within this many seconds of its first byte.
    header_timeout_s: float = 10.0
    #: A request's body must be in within this many seconds of its headers.
    body_timeout_s: float = 30.0
    #: A kept-alive connection with no request for this many seconds is closed.
    idle_timeout_s: float = 5.0
    #: A connection is closed after this many requests (the last answered `Connection: close`).
    max_requests: int = 1000
    #: A request line and headers longer than this are refused (431).
    max_header_bytes: int = 64 * 1024

    def problem(self) -> str | None:
        """What is wrong with these limits (one line naming the option), or None."""
        for option, value, least in (
            ("--max-connections", self.max_connections, 1),
            ("--max-connections-per-peer", self.max_per_peer, 1),
            ("--max-requests-per-connection", self.max_requests, 1),
            ("--header-timeout-s", self.header_timeout_s, 0.1),
            ("--body-timeout-s", self.body_timeout_s, 0.1),
            ("--idle-timeout-s", self.idle_timeout_s, 0.1),
        ):
            if not value >= least:  # (NaN too)
                return f"{option}: must be at least {least:g}, got {value}"
        return None


# -- who is at the other end --------------------------------------------------------------------

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NLMSG_ERROR = 2
_NLMSG_HEADER = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
_DIAG_REQUEST = struct.Struct("=BBBxI")  # inet_diag_req_v2: family, protocol, ext, states
_DIAG_PORTS = struct.Struct(">HH")  # inet_diag_sockid: source and destination ports
_DIAG_TAIL = struct.Struct("=III")  # inet_diag_sockid: interface, cookie (none: all ones)
_NO_COOKIE = 0xFFFFFFFF
#: inet_diag_msg: family, state, timer, retransmits, sockid (48 bytes), expires, queues; then
#: the owner's uid and the socket's inode.
_DIAG_OWNER = struct.Struct("=II")
_DIAG_OWNER_AT = _NLMSG_HEADER.size + 4 + 48 + 12


class SocketOwners:
    """The uid that owns the client's end of a TCP connection made on this machine."""

    def __init__(self) -> None:
        self._socket = socket.socket(
            socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, _NETLINK_SOCK_DIAG
        )
        self._sequence = 0

    def close(self) -> None:
        self._socket.close()

    def uid(self, client: tuple[str, int], server: tuple[str, int]) -> int | None:
        """The uid of the socket bound to `client` and connected to `server` (each a host and a
        port, as the accepted connection's peer and own address); None when the kernel knows
        no such socket, or none that a process still holds (closed, in TIME_WAIT)."""
        client_host, server_host = _unmapped(client[0]), _unmapped(server[0])
        family = socket.AF_INET6 if ":" in client_host else socket.AF_INET
        try:
            source = socket.inet_pton(family, client_host).ljust(16, b"\0")
            destination = socket.inet_pton(family, server_host).ljust(16, b"\0")
        except OSError:  # (a scoped IPv6 address, or the two of different families)
            return None
        self._sequence = (self._sequence + 1) & 0xFFFFFFFF
        body = b"".join(
            (
                _DIAG_REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0xFFFFFFFF),
                _DIAG_PORTS.pack(client[1], server[1]),
                source,
                destination,
                _DIAG_TAIL.pack(0, _NO_COOKIE, _NO_COOKIE),
            )
        )
        header = _NLMSG_HEADER.pack(
            _NLMSG_HEADER.size + len(body), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, self._sequence, 0
        )
        try:
            self._socket.send(header + body)
            # The kernel answers within the send: nothing to wait for.
            while True:
                answer = self._socket.recv(4096, socket.MSG_DONTWAIT)
                _, kind, _, sequence, _ = _NLMSG_HEADER.unpack_from(answer)
                if sequence == self._sequence:
                    break
        except OSError:
            return None
        if kind == _NLMSG_ERROR or len(answer) < _DIAG_OWNER_AT + _DIAG_OWNER.size:
            return None  # ENOENT: no such socket (it went meanwhile)
        uid, inode = _DIAG_OWNER.unpack_from(answer, _DIAG_OWNER_AT)
        # No inode: the process closed it (TIME_WAIT sockets also say uid 0): nobody to count.
        return uid if inode else None


def _unmapped(host: str) -> str:
    """An IPv4 client of a dual-stack socket appears as ::ffff:a.b.c.d; its own socket is IPv4."""
    return host[7:] if host.startswith("::ffff:") and "." in host else host


def is_local(client_host: str, server_host: str) -> bool:
    """Whether a connection comes from this machine: from loopback, or to the address it
    came from (a process here that connected to one of the machine's addresses)."""
    client_host = _unmapped(client_host)
    if client_host == _unmapped(server_host):
        return True
    try:
        return ipaddress.ip_address(client_host).is_loopback
    except ValueError:
        return False


def peer_name(peer: str) -> str:
    """`uid 1001 (alice)` for an account, the address for others."""
    if peer.startswith("uid "):
        try:
            return f"{peer} ({pwd.getpwuid(int(peer[4:])).pw_name})"
        except (KeyError, ValueError):
            return peer
    return peer


# -- the open-file limit ------------------------------------------------------------------------


def raise_open_file_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit; the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:  # the kernel caps descriptors at fs.nr_open still
        try:
            with open("/proc/sys/fs/nr_open") as nr_open:
                target = int(nr_open.read())
        except (OSError, ValueError):
            target = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            return soft
        return target
    return target if soft == resource.RLIM_INFINITY else soft


# -- the guard: counts per peer and in all ------------------------------------------------------


class ConnectionGuard:
    """The connections one API server holds, by peer, and what it refused.

    Used from the server's event loop alone (the counts are plain ints and dicts); /metrics
    reads them from another thread, which only reads."""

    def __init__(
        self,
        limits: ConnectionLimits,
        open_files: int,
        owners: SocketOwners | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # Half the open files for connections: the database, logs, the executor's pipes and a
        # connection's transient descriptors keep the other half.
        most = max(1, open_files // 2)
        if limits.max_connections > most:
            log.warning(
                "--max-connections %d: the open-file limit is %d; at most %d connections "
                "(half of it: the rest is for the database, logs and jobs)",
                limits.max_connections,
                open_files,
                most,
            )
            limits = replace(limits, max_connections=most)
        if limits.max_per_peer > limits.max_connections:
            limits = replace(limits, max_per_peer=limits.max_connections)
        self.limits = limits
        self.open_files = open_files
        self.owners = owners
        self.open = 0
        self.by_peer: dict[str, int] = {}
        self.refused = dict.fromkeys(REFUSALS, 0)
        #: Held to their peer's cap only: root and the manager's own account (the admin).
        self.privileged = {"uid 0", f"uid {os.geteuid()}"}
        self.clock = clock  # (for the log's once a minute)
        self._logged_at: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}

    @classmethod
    def start(
        cls, limits: ConnectionLimits, registry: CollectorRegistry | None = None
    ) -> ConnectionGuard:
        """A guard for this process's API server: the open-file limit raised, the kernel asked
        who owns local peers' sockets (where it can say: else every local peer is its address),
        its counts in `registry` (the manager's, for /metrics)."""
        open_files = raise_open_file_limit()
        try:
            owners: SocketOwners | None = SocketOwners()
        except OSError as error:
            log.warning(
                "cannot ask the kernel who owns local connections (%s): connections from this "
                "machine share one per-peer limit",
                error.strerror or error,
            )
            owners = None
        guard = cls(limits, open_files, owners)
        if registry is not None:
            registry.register(_GuardCollector(guard))
        return guard

    def close(self) -> None:
        if self.owners is not None:
            self.owners.close()

    def peer_of(self, client: tuple[str, int] | None, server: tuple[str, int] | None) -> str:
        """`uid N` for a connection from a process of this machine, else the client's address."""
        if client is None or server is None:
            return "unknown"
        if self.owners is not None and is_local(client[0], server[0]):
            uid = self.owners.uid(client, server)
            if uid is not None:
                return f"uid {uid}"
        return _unmapped(client[0])

    def admit(self, peer: str) -> str | None:
        """Count a new connection from `peer`; or the reason (of REFUSALS) it is refused."""
        held = self.by_peer.get(peer, 0)
        if held >= self.limits.max_per_peer:
            return self.refuse(peer, "max_per_peer")
        if self.open >= self.limits.max_connections and peer not in self.privileged:
            return self.refuse(peer, "max_connections")
        self.by_peer[peer] = held + 1
        self.open += 1
        return None

    def release(self, peer: str) -> None:
        held = self.by_peer.get(peer, 0) - 1
        if held > 0:
            self.by_peer[peer] = held
        else:
            self.by_peer.pop(peer, None)
        self.open -= 1

    def refuse(self, peer: str, reason: str) -> str:
        """Count a refusal, and log it unless this peer's last line is under a minute old."""
        self.refused[reason] += 1
        now = self.clock()
        last = self._logged_at.get(peer)
        if last is not None and now - last < LOG_EVERY_S:
            self._unlogged[peer] = self._unlogged.get(peer, 0) + 1
            return reason
        more = self._unlogged.pop(peer, 0)
        for stale in [key for key, at in self._logged_at.items() if now - at >= LOG_EVERY_S]:
            del self._logged_at[stale]  # (a peer is forgotten a minute after its last line)
            self._unlogged.pop(stale, None)
        self._logged_at[peer] = now
        log.warning(
            "closed a connection from %s: %s (%s)%s",
            peer_name(peer),
            REFUSALS[reason],
            self._limit_text(peer, reason),
            f"; {more} more since the last such line" if more else "",
        )
        return reason

    def _limit_text(self, peer: str, reason: str) -> str:
        limits = self.limits
        return {
            "max_connections": f"{self.open} open, at most {limits.max_connections}",
            "max_per_peer": f"{self.by_peer.get(peer, 0)} open, at most {limits.max_per_peer}",
            "header_timeout": f"{limits.header_timeout_s:g} s",
            "header_too_large": f"at most {limits.max_header_bytes} bytes",
            "body_timeout": f"{limits.body_timeout_s:g} s",
        }[reason]

    def refusal_answer(self, peer: str, reason: str) -> bytes:
        """The whole HTTP answer to a connection refused as it was accepted."""
        if reason == "max_per_peer":
            detail = f"too many connections from {peer}: at most {self.limits.max_per_peer} at once"
            status = b"503 Service Unavailable"
        elif reason == "max_connections":
            detail = (
                f"the manager has {self.limits.max_connections} connections open, its most; "
                "try again"
            )
            status = b"503 Service Unavailable"
        else:
            detail = (
                f"the request's headers are too long; at most {self.limits.max_header_bytes} bytes"
            )
            status = b"431 Request Header Fields Too Large"
        body = json.dumps({"detail": detail}).encode()
        return b"".join(
            (
                b"HTTP/1.1 ",
                status,
                b"\r\ncontent-type: application/json\r\ncontent-length: ",
                str(len(body)).encode(),
                b"\r\nconnection: close\r\n",
                b"retry-after: 1\r\n\r\n" if status.startswith(b"503") else b"\r\n",
                body,
            )
        )

    def uvicorn_options(self) -> dict[str, Any]:
        """What uvicorn.Config needs to run its HTTP through this guard."""
        protocol = type("CorralHttpProtocol", (GuardedHttpProtocol,), {"guard": self})
        return {
            "http": protocol,
            # No WebSocket upgrades (the API has none): an upgraded connection would leave the
            # guarded protocol uncounted.
            "ws": "none",
            # uvicorn's own keep-alive timer, beside the guard's (the same length)
            "timeout_keep_alive": max(1, round(self.limits.idle_timeout_s)),
        }


class _GuardCollector(Collector):
    def __init__(self, guard: ConnectionGuard) -> None:
        self.guard = guard

    def collect(self) -> Iterator[Metric]:
        guard = self.guard
        refused = CounterMetricFamily(
            "corral_connections_refused",
            "API connections closed before they were answered, by reason: max_connections, "
            "max_per_peer (refused as accepted), header_timeout, header_too_large, "
            "body_timeout.",
            labels=["reason"],
        )
        for reason, count in list(guard.refused.items()):
            refused.add_metric([reason], count)
        yield refused
        open_now = GaugeMetricFamily("corral_connections_open", "API connections open now.")
        open_now.add_metric([], guard.open)
        yield open_now
        peers = GaugeMetricFamily(
            "corral_connection_peers",
            "Peers (Unix accounts on this machine, else addresses) with API connections open.",
        )
        peers.add_metric([], len(guard.by_peer))
        yield peers


# -- the protocol -------------------------------------------------------------------------------

#: A connection's phase, for its deadline: waiting for a request (none begun: the first of the
#: connection, or kept alive after an answer), reading its headers, reading its body, or
#: answering it (no deadline: the app's time is not the client's).
_IDLE, _FIRST, _HEADERS, _BODY, _ANSWERING = range(5)


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol under a ConnectionGuard (the module's docstring); a
    subclass per server names its guard (`ConnectionGuard.uvicorn_options`)."""

    guard: ConnectionGuard

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.peer: str | None = None
        self.phase = _FIRST
        self.deadline: asyncio.TimerHandle | None = None
        self.requests = 0
        self.header_bytes = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        guard = self.guard
        peer = guard.peer_of(
            transport.get_extra_info("peername"), transport.get_extra_info("sockname")
        )
        refusal = guard.admit(peer)
        if refusal is not None:
            self.transport = transport  # type: ignore[assignment]
            transport.write(guard.refusal_answer(peer, refusal))  # type: ignore[attr-defined]
            transport.close()
            return
        self.peer = peer
        super().connection_made(transport)  # type: ignore[arg-type]
        self._expire_in(guard.limits.header_timeout_s, "header_timeout")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self.peer is not None:
            self.guard.release(self.peer)
            self.peer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        waiting = self.phase in (_IDLE, _FIRST, _HEADERS)
        if waiting:
            self.header_bytes += len(data)
        super().data_received(data)
        if (
            waiting
            and self.phase in (_IDLE, _FIRST, _HEADERS)
            and self.header_bytes > self.guard.limits.max_header_bytes
            and not self.transport.is_closing()
        ):
            self._close_for("header_too_large", answer=True)

    # httptools' callbacks, as the parser meets each part of a request

    def on_message_begin(self) -> None:
        if self.phase != _FIRST:  # (the first request's clock runs from the connection)
            self._expire_in(self.guard.limits.header_timeout_s, "header_timeout")
        self.phase = _HEADERS
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self.header_bytes = 0
        self.requests += 1
        self.phase = _BODY
        self._expire_in(self.guard.limits.body_timeout_s, "body_timeout")
        before = self.cycle
        super().on_headers_complete()
        if self.requests >= self.guard.limits.max_requests and self.cycle is not before:
            self.cycle.keep_alive = False  # this answer says `Connection: close`, then closes

    def on_message_complete(self) -> None:
        if self.cycle is not None and self.cycle.response_complete:
            self._idle()  # answered before its body was in (a refusal): now wait for the next
        else:
            self.phase = _ANSWERING
            self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        pipelined = bool(self.pipeline)  # the next request, read already, starts now
        super().on_response_complete()
        if self.phase == _ANSWERING and not pipelined and not self.transport.is_closing():
            self._idle()

    # deadlines

    def _idle(self) -> None:
        self.phase = _IDLE
        self._expire_in(self.guard.limits.idle_timeout_s, None)

    def _expire_in(self, seconds: float, reason: str | None) -> None:
        self._disarm()
        self.deadline = self.loop.call_later(seconds, self._expired, reason)

    def _disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _expired(self, reason: str | None) -> None:
        self.deadline = None
        if self.transport.is_closing():
            return
        if reason is None:  # idle: an ordinary end of a kept-alive connection
            self.transport.close()
            return
        self._close_for(reason, answer=False)

    def _close_for(self, reason: str, *, answer: bool) -> None:
        guard = self.guard
        guard.refuse(self.peer or "unknown", reason)
        if answer and (self.cycle is None or self.cycle.response_complete):
            self.transport.write(guard.refusal_answer(self.peer or "unknown", reason))
        self.transport.close()
