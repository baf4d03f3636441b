"""The API's connections (corral.server.connections): who a peer is (the kernel's owner of the
connecting socket), the caps per peer and in all, and the header, body and keep-alive timeouts,
on a live server (HTTP on 127.0.0.1) and real sockets. The flood itself, with a real job under a
real account, is tests/server/test_connection_flood.py."""

from __future__ import annotations

import logging
import os
import resource
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.server.boot import RunningServer
from corral.server.connections import ConnectionGuard, ConnectionLimits, SocketOwners
from tests.server.helpers import admin_token, wait_until
from tests.server.inert import start_inert

#: Short timeouts, so that a test sees them pass; long enough that a loaded machine does not
#: trip them where a test expects an answer.
TIMEOUT_S = 1.0
LIMITS = ConnectionLimits(
    max_per_peer=4,
    header_timeout_s=TIMEOUT_S,
    body_timeout_s=TIMEOUT_S,
    idle_timeout_s=TIMEOUT_S,
    max_requests=3,
)
#: The least a timeout may seem to take: the server's event loop (uvloop, on libuv) counts its
#: timers in whole milliseconds from a time it caches, so a timer may fire up to a millisecond
#: before its delay is up by `time.monotonic` (seen: a 1 s header timeout closed after 0.9999 s).
AT_LEAST_S = TIMEOUT_S - 0.005
#: How long a test waits for the server to close a connection (a loaded 2-core machine).
CLOSE_BUDGET_S = 30.0
#: A uid with no account: what a tenant's process would be (root's tests only).
OTHER_UID = 65534
ROOT = os.geteuid() == 0
#: The system's Python, which every account may run (the venv's lives under root's home).
SYSTEM_PYTHON = "/usr/bin/python3"

#: Connects to HOST:PORT and prints its own port; given a request, sends it and prints the first
#: line of the answer (the server closes after it); holds until stdin ends.
CONNECT = """
import socket, sys
connection = socket.create_connection((sys.argv[1], int(sys.argv[2])))
print(connection.getsockname()[1], flush=True)
if sys.argv[3]:
    connection.sendall(sys.argv[3].encode())
    answer = b""
    while chunk := connection.recv(65536):
        answer += chunk
    print(answer.split(b"\\r\\n")[0].decode(), flush=True)
sys.stdin.read()
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_inert(tmp_path_factory.mktemp("connections") / "corral", connections=LIMITS)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def address(server: RunningServer) -> Iterator[tuple[str, int]]:
    """The server's address; after the test, every connection the test opened is gone from the
    server's counts (they do not carry over to the next test's caps)."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    yield host, int(port)
    wait_until(lambda: server.guard.open == 0, "the test's connections to close", 30)


def connect(address: tuple[str, int], data: bytes = b"") -> socket.socket:
    connection = socket.create_connection(address, timeout=CLOSE_BUDGET_S)
    if data:
        connection.sendall(data)
    return connection


def closed_after(connection: socket.socket, since: float) -> tuple[bytes, float]:
    """Everything the server sent until it closed the connection, and the seconds from `since`
    to the close; fails after CLOSE_BUDGET_S (the server never closed it)."""
    received = b""
    deadline = time.monotonic() + CLOSE_BUDGET_S
    while True:
        connection.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            chunk = connection.recv(65536)
        except TimeoutError:
            raise AssertionError(f"still open after {CLOSE_BUDGET_S} s: {received!r}") from None
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            return received, time.monotonic() - since
        received += chunk


def read_answer(connection: socket.socket) -> bytes:
    """One whole answer (head and a Content-Length body) from a kept-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = connection.recv(65536)
        assert chunk, f"closed mid-answer: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += connection.recv(65536)
    return head + b"\r\n\r\n" + body


def refused(server: RunningServer, reason: str) -> int:
    return server.guard.refused[reason]


class Holder:
    """A process of another uid that holds a connection to the server (root's tests only)."""

    def __init__(self, address: tuple[str, int], uid: int, data: str = "") -> None:
        self.process = subprocess.Popen(
            [SYSTEM_PYTHON, "-c", CONNECT, address[0], str(address[1]), data],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            user=uid,
            text=True,
        )
        assert self.process.stdout is not None
        self.port = int(self.process.stdout.readline())

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


# -- who a peer is --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("listen", "connect_to"),
    [("127.0.0.1", "127.0.0.1"), ("::1", "::1"), ("::", "127.0.0.1")],
    ids=["ipv4", "ipv6", "ipv4-on-dual-stack"],
)
def test_a_socket_is_attributed_to_the_uid_that_opened_it(listen: str, connect_to: str) -> None:
    family = socket.AF_INET6 if ":" in listen else socket.AF_INET
    owners = SocketOwners()
    holder: Holder | None = None
    with socket.socket(family) as listener:
        if family == socket.AF_INET6:
            listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        listener.bind((listen, 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        try:
            own = socket.create_connection((connect_to, port))
            accepted, peer = listener.accept()
            if listen == "::":
                assert peer[0] == "::ffff:127.0.0.1"  # what the server sees: a mapped address
            assert owners.uid(peer, accepted.getsockname()) == os.geteuid()
            if ROOT:  # a process of another uid: its own socket, its uid
                holder = Holder((connect_to, port), OTHER_UID)
                other, other_peer = listener.accept()
                assert other_peer[1] == holder.port
                assert owners.uid(other_peer, other.getsockname()) == OTHER_UID
                other.close()
            # No socket of that port (any more): nobody's
            own.close()
            assert owners.uid(peer, accepted.getsockname()) is None
            accepted.close()
            assert owners.uid((peer[0], 1), accepted_name(listen, port)) is None
        finally:
            if holder is not None:
                holder.stop()
            owners.close()


def accepted_name(listen: str, port: int) -> tuple[str, int]:
    return ("::ffff:127.0.0.1" if listen == "::" else listen, port)


def test_a_local_peer_is_its_account_and_a_remote_one_its_address() -> None:
    owners = SocketOwners()
    guard = ConnectionGuard(ConnectionLimits(), open_files=1 << 16, owners=owners)
    try:
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen(4)
            with socket.create_connection(listener.getsockname()):
                accepted, peer = listener.accept()
                with accepted:
                    assert guard.peer_of(peer, accepted.getsockname()) == f"uid {os.geteuid()}"
        # Not from this machine: not asked of the kernel, the address is the peer
        assert guard.peer_of(("192.0.2.7", 40000), ("127.0.0.1", 8470)) == "192.0.2.7"
        assert guard.peer_of(("::ffff:192.0.2.7", 1), ("::ffff:10.0.0.1", 2)) == "192.0.2.7"
        # From this machine, but no such socket: its address
        assert guard.peer_of(("127.0.0.1", 1), ("127.0.0.1", 2)) == "127.0.0.1"
    finally:
        guard.close()


# -- the caps -------------------------------------------------------------------------------------


def test_each_peer_has_its_cap_and_all_together_the_total() -> None:
    guard = ConnectionGuard(ConnectionLimits(max_connections=3, max_per_peer=2), open_files=1 << 16)
    alice, bob, carol = "uid 1001", "uid 1002", "uid 1003"
    assert guard.admit(alice) is None and guard.admit(alice) is None
    assert guard.admit(alice) == "max_per_peer"  # alice's third: over her cap
    assert guard.admit(bob) is None  # another peer: its own cap
    assert guard.admit(carol) == "max_connections"  # three open in all
    # root (the admin) is held to its peer's cap only: it gets in when the total is reached
    assert guard.admit("uid 0") is None and guard.admit("uid 0") is None
    assert guard.admit("uid 0") == "max_per_peer"
    guard.release(alice)
    guard.release("uid 0")
    guard.release("uid 0")
    assert guard.admit(carol) is None  # room again
    assert guard.by_peer == {alice: 1, bob: 1, carol: 1} and guard.open == 3
    assert guard.refused["max_per_peer"] == 2 and guard.refused["max_connections"] == 1


def test_connections_are_at_most_half_the_open_file_limit() -> None:
    guard = ConnectionGuard(
        ConnectionLimits(max_connections=4096, max_per_peer=4096), open_files=1024
    )
    assert (guard.limits.max_connections, guard.limits.max_per_peer) == (512, 512)
    kept = ConnectionGuard(ConnectionLimits(), open_files=1 << 20).limits
    assert (kept.max_connections, kept.max_per_peer) == (4096, 256)


def test_the_open_file_limit_is_raised_to_the_hard_limit() -> None:
    code = (
        "import resource; from corral.server.connections import raise_open_file_limit; "
        "print(raise_open_file_limit(), *resource.getrlimit(resource.RLIMIT_NOFILE))"
    )
    hard = min(4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1])

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))

    found = subprocess.run(
        [sys.executable, "-c", code], preexec_fn=lower, capture_output=True, text=True, check=True
    )
    assert found.stdout.split() == [str(hard)] * 3


def test_refusals_are_logged_once_a_minute_per_peer(caplog: pytest.LogCaptureFixture) -> None:
    now = [1000.0]
    guard = ConnectionGuard(
        ConnectionLimits(max_per_peer=1), open_files=1 << 16, clock=lambda: now[0]
    )
    guard.admit("uid 1001")
    guard.admit("uid 1002")
    with caplog.at_level(logging.WARNING, logger="corral.connections"):
        for _ in range(500):
            assert guard.admit("uid 1001") == "max_per_peer"
        assert guard.admit("uid 1002") == "max_per_peer"  # another peer: its own line
        now[0] += 59.0
        guard.admit("uid 1001")
        assert len(caplog.records) == 2
        now[0] += 1.0
        guard.admit("uid 1001")
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 3, lines
    assert "uid 1001" in lines[0] and "1 open, at most 1" in lines[0]
    assert "uid 1002" in lines[1]
    assert lines[2].endswith("; 500 more since the last such line"), lines[2]
    assert guard.refused["max_per_peer"] == 503


def test_a_connection_over_its_peers_cap_is_answered_503_at_once(
    server: RunningServer, address: tuple[str, int]
) -> None:
    held = [connect(address, b"GET /healthz HTTP/1.1\r\n") for _ in range(LIMITS.max_per_peer)]
    holder: Holder | None = None
    try:
        wait_until(lambda: server.guard.open == LIMITS.max_per_peer, "the held connections")
        before = refused(server, "max_per_peer")
        over = connect(address)  # sends nothing: the answer comes as it is accepted
        answer, _ = closed_after(over, time.monotonic())
        assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), answer
        detail = f"too many connections from uid {os.geteuid()}: at most 4 at once"
        assert answer.endswith(f'{{"detail": "{detail}"}}'.encode()), answer
        assert refused(server, "max_per_peer") == before + 1
        if ROOT:  # another account is another peer: answered as ever (401: no token)
            request = "GET /api/v1/whoami HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            holder = Holder(address, OTHER_UID, request)
            assert holder.process.stdout is not None
            assert holder.process.stdout.readline().startswith("HTTP/1.1 401 ")
            assert refused(server, "max_per_peer") == before + 1
    finally:
        if holder is not None:
            holder.stop()
        for connection in held:
            connection.close()


# -- the timeouts ---------------------------------------------------------------------------------


def test_half_a_header_is_closed_after_the_header_timeout(
    server: RunningServer, address: tuple[str, int]
) -> None:
    before = refused(server, "header_timeout")
    started = time.monotonic()
    connection = connect(address, b"GET /api/v1/whoami HTTP/1.1\r\nHost: x\r\nAuthoriz")
    with connection:
        answer, seconds = closed_after(connection, started)
    assert answer == b"" and seconds >= AT_LEAST_S
    # Nothing sent at all: the same
    started = time.monotonic()
    with connect(address) as connection:
        _, seconds = closed_after(connection, started)
    assert seconds >= AT_LEAST_S
    assert refused(server, "header_timeout") == before + 2


def test_headers_dripped_a_byte_at_a_time_are_closed_at_the_header_timeout(
    server: RunningServer, address: tuple[str, int]
) -> None:
    """The clock runs from the request's first byte, not from the last one (slowloris)."""
    started = time.monotonic()
    with connect(address, b"GET /healthz HTTP/1.1\r\n") as connection:
        dripped = 0
        while time.monotonic() - started < CLOSE_BUDGET_S:
            readable, _, _ = select.select([connection], [], [], 0.1)
            if readable:
                break
            try:
                connection.send(b"X-Drip: 1\r\n"[dripped % 11 : dripped % 11 + 1])
            except OSError:
                break
            dripped += 1
        _, seconds = closed_after(connection, started)
    assert AT_LEAST_S <= seconds < CLOSE_BUDGET_S and dripped > 3


def test_a_body_not_in_within_the_body_timeout_is_closed(
    server: RunningServer, address: tuple[str, int]
) -> None:
    before = refused(server, "body_timeout")
    head = b"POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
    with connect(address) as connection:
        started = time.monotonic()  # (before the headers: the body's clock starts after)
        connection.sendall(head + b'{"name": ')
        _, seconds = closed_after(connection, started)
    assert seconds >= AT_LEAST_S
    assert refused(server, "body_timeout") == before + 1


def test_an_idle_kept_alive_connection_is_closed_after_its_timeout(
    server: RunningServer, address: tuple[str, int]
) -> None:
    before = dict(server.guard.refused)
    with connect(address, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n") as connection:
        answer = read_answer(connection)
        answered = time.monotonic()
        assert answer.startswith(b"HTTP/1.1 ") and b"connection: close" not in answer
        rest, seconds = closed_after(connection, answered)
    # At its own timeout, not uvicorn's default keep-alive (5 s)
    assert rest == b"" and TIMEOUT_S - 0.1 <= seconds < 5.0
    assert server.guard.refused == before  # an idle end is no refusal


def test_a_connection_is_closed_after_its_most_requests(
    server: RunningServer, address: tuple[str, int]
) -> None:
    with connect(address) as connection:
        for number in range(1, LIMITS.max_requests + 1):
            connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = read_answer(connection)
            last = number == LIMITS.max_requests
            assert (b"\r\nconnection: close\r\n" in answer.lower()) == last, (number, answer)
        rest, _ = closed_after(connection, time.monotonic())
    assert rest == b""


def test_headers_over_the_cap_are_refused_431(
    server: RunningServer, address: tuple[str, int]
) -> None:
    before = refused(server, "header_too_large")
    line = b"X-Big: " + b"a" * 1000 + b"\r\n"
    with connect(address, b"GET /healthz HTTP/1.1\r\nHost: x\r\n") as connection:
        sent = 0
        try:  # until the server has had enough, and says so
            while sent <= 2 * LIMITS.max_header_bytes:
                connection.sendall(line)
                sent += len(line)
        except OSError:
            pass
        answer, _ = closed_after(connection, time.monotonic())
    assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"), answer[:200]
    assert b"at most 65536 bytes" in answer
    assert refused(server, "header_too_large") == before + 1


def test_metrics_count_the_refusals_by_reason(server: RunningServer) -> None:
    import httpx

    token = admin_token(server.manager.data_dir)
    headers = {"Authorization": f"Bearer {token}"}
    text = httpx.get(server.url + "/metrics", headers=headers, timeout=30).text
    for reason, count in server.guard.refused.items():
        assert f'corral_connections_refused_total{{reason="{reason}"}} {float(count)}' in text
    assert "corral_connections_open " in text and "corral_connection_peers " in text
    documented = (Path(__file__).parents[2] / "docs" / "server.md").read_text()
    for name in ("corral_connections_refused_total", "corral_connections_open"):
        assert f"`{name}`" in documented
    assert "`corral_connection_peers`" in documented
    for reason in server.guard.refused:
        assert f"`{reason}`" in documented


# -- corral up ------------------------------------------------------------------------------------


def test_corral_up_takes_the_connection_limits(tmp_path: Path, monkeypatch: Any) -> None:
    from click.testing import CliRunner

    from corral.cli.main import app  # (before corral.cli.up, which it imports)
    from corral.server.manager import Manager

    seen: list[ConnectionLimits] = []

    def serve(manager: Manager, options: object) -> None:
        seen.append(manager.settings.connections)
        manager.stop()

    monkeypatch.setattr("corral.cli.up.serve", serve)
    args = ["up", "--gpus", "1", "--single-user", "--data-dir", str(tmp_path / "d")]
    flags = [
        *("--max-connections", "100", "--max-connections-per-peer", "10"),
        *("--header-timeout-s", "3", "--body-timeout-s", "4", "--idle-timeout-s", "2"),
        *("--max-requests-per-connection", "50"),
    ]
    result = CliRunner().invoke(app, [*args, *flags])
    assert result.exit_code == 0, result.output
    assert seen == [
        ConnectionLimits(
            max_connections=100,
            max_per_peer=10,
            header_timeout_s=3.0,
            body_timeout_s=4.0,
            idle_timeout_s=2.0,
            max_requests=50,
        )
    ]
    result = CliRunner().invoke(app, [*args, "--header-timeout-s", "0"])
    assert result.exit_code == 2 and "--header-timeout-s: must be at least 0.1" in result.output
    result = CliRunner().invoke(app, [*args, "--max-connections-per-peer", "0"])
    assert result.exit_code == 2 and "--max-connections-per-peer" in result.output
