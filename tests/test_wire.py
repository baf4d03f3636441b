"""JsonClient's HTTP/1.1 on a socket (corral.wire) against scripted servers on 127.0.0.1: the
bodies it reads (a known length, chunked, up to the close), the kept-alive connection and a
stale one, a body cut short, and https (the certificate and the host name verified). The live
tests (a real manager, its restarts and standbys) are tests/server/test_sdk_restart.py,
test_log_stream.py, test_leader.py and test_ha.py."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from corral.client import ClientError, JsonClient

#: What a handler gets: the request's head (request line and headers, as text) and body, the
#: connection to answer on.
Handler = Callable[[str, bytes, socket.socket], bool]  # True: keep the connection open


def read_request(conn: socket.socket) -> tuple[str, bytes] | None:
    data = b""
    while b"\r\n\r\n" not in data:
        more = conn.recv(65536)
        if not more:
            return None
        data += more
    head, _, body = data.partition(b"\r\n\r\n")
    text = head.decode("latin-1")
    length = 0
    for line in text.split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.lower() == "content-length":
            length = int(value)
    while len(body) < length:
        body += conn.recv(65536)
    return text, body


@contextmanager
def server(handler: Handler, tls: ssl.SSLContext | None = None) -> Iterator[tuple[int, list[int]]]:
    """A server on a free port of 127.0.0.1 that answers each request with `handler`; yields
    its port and a list that counts the connections it accepted."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    accepted: list[int] = []
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(30)
            try:
                if tls is not None:
                    conn = tls.wrap_socket(conn, server_side=True)
                while (request := read_request(conn)) is not None:
                    if not handler(request[0], request[1], conn):
                        break
            except (OSError, ssl.SSLError):
                pass

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            accepted.append(1)
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield port, accepted
    finally:
        stop.set()
        thread.join(timeout=10)
        listener.close()


def answer(conn: socket.socket, body: bytes, *headers: str, status: str = "200 OK") -> None:
    head = "\r\n".join([f"HTTP/1.1 {status}", *headers]) + "\r\n\r\n"
    conn.sendall(head.encode() + body)


def test_a_body_of_known_length_on_one_kept_alive_connection() -> None:
    # Three requests (whoami, a job, the queue) on one connection: the server counts one
    # accepted connection; the request line carries the path and the query, the Host header
    # the port, and the token.
    seen: list[str] = []

    def handle(head: str, body: bytes, conn: socket.socket) -> bool:
        seen.append(head)
        data = b'{"ok": true}'
        answer(conn, data, f"Content-Length: {len(data)}", "Content-Type: application/json")
        return True

    with server(handle) as (port, accepted):
        with JsonClient(f"http://127.0.0.1:{port}", "secret", failover_s=0) as client:
            assert client.whoami() == {"ok": True}
            assert client.job("7") == {"ok": True}
            assert client.queue(limit=3) == {"ok": True}
    assert len(accepted) == 1
    lines = [head.split("\r\n") for head in seen]
    assert [one[0] for one in lines] == [
        "GET /api/v1/whoami HTTP/1.1",
        "GET /api/v1/jobs/7 HTTP/1.1",
        "GET /api/v1/queue?limit=3 HTTP/1.1",
    ]
    assert f"Host: 127.0.0.1:{port}" in lines[0]
    assert "Authorization: Bearer secret" in lines[0]


def test_a_submission_sends_its_body_and_key() -> None:
    got: list[tuple[str, bytes]] = []

    def handle(head: str, body: bytes, conn: socket.socket) -> bool:
        got.append((head, body))
        data = b'{"id": "1", "status": "PENDING"}'
        answer(conn, data, f"Content-Length: {len(data)}", status="201 Created")
        return True

    with server(handle) as (port, _):
        with JsonClient(f"http://127.0.0.1:{port}", "t", failover_s=0) as client:
            assert client.submit({"gpus": 1, "command": "true"})["id"] == "1"
    head, body = got[0]
    assert head.startswith("POST /api/v1/jobs HTTP/1.1\r\n")
    assert body == b'{"gpus":1,"command":"true"}'
    keys = [line for line in head.split("\r\n") if line.startswith("Idempotency-Key: ")]
    assert len(keys) == 1 and len(keys[0].split(": ")[1]) == 32


def test_chunked_and_close_delimited_bodies() -> None:
    # A chunked body in three chunks (with a chunk extension and a trailer), then a body that
    # ends where the server closes the connection: both read whole; the second answer's
    # connection is not reused (two connections in all).
    def handle(head: str, body: bytes, conn: socket.socket) -> bool:
        if "/whoami" in head:
            answer(
                conn,
                b'3;x=y\r\n{"a\r\n6\r\n": [1,\r\n3\r\n2]}\r\n0\r\nX-Trailer: 1\r\n\r\n',
                "Transfer-Encoding: chunked",
            )
            return True
        answer(conn, b'{"b": 2}', "Connection: close")
        return False

    with server(handle) as (port, accepted):
        with JsonClient(f"http://127.0.0.1:{port}", "t", failover_s=0) as client:
            assert client.whoami() == {"a": [1, 2]}
            assert client.job("1") == {"b": 2}
            assert client.whoami() == {"a": [1, 2]}
    assert len(accepted) == 2


def test_a_stale_kept_alive_connection_is_replaced() -> None:
    # The server closes the connection after each answer without saying so (as one that
    # timed out an idle keep-alive): the next request meets a closed connection before any
    # answer, and is sent again on a fresh one: three answers, three connections.
    def handle(head: str, body: bytes, conn: socket.socket) -> bool:
        answer(conn, b"{}", "Content-Length: 2")
        return False

    with server(handle) as (port, accepted):
        with JsonClient(f"http://127.0.0.1:{port}", "t", failover_s=0) as client:
            for _ in range(3):
                assert client.whoami() == {}
    assert len(accepted) == 3


def test_a_body_cut_short_and_no_answer_are_one_line_errors() -> None:
    def cut(head: str, body: bytes, conn: socket.socket) -> bool:
        answer(conn, b'{"a": 1', "Content-Length: 100")
        return False

    with server(cut) as (port, _):
        url = f"http://127.0.0.1:{port}"
        with JsonClient(url, "t", failover_s=0) as client:
            with pytest.raises(ClientError) as caught:
                client.whoami()
    assert caught.value.message == (
        f"cannot reach corral at {url}: is `corral up` running? (CORRAL_URL)"
    )

    def garbage(head: str, body: bytes, conn: socket.socket) -> bool:
        conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
        return False

    with server(garbage) as (port, _):
        url = f"http://127.0.0.1:{port}"
        with JsonClient(url, "t", failover_s=0) as client:
            with pytest.raises(ClientError) as caught:
                client.whoami()
    assert caught.value.message.startswith(f"corral at {url}: not an HTTP answer: b'SSH-2.0")


def test_a_chunk_size_is_read_in_pieces_and_a_negative_one_refused() -> None:
    # A chunk's size is the server's word: a huge one followed by a short chunk is a cut body
    # (read in pieces, never one buffer of that size: 2**62 bytes would be a MemoryError), and
    # a negative one is no HTTP (int("-1", 16) parses).
    from corral.wire import BadAnswer, Connection, Truncated

    def huge(head: str, body: bytes, conn: socket.socket) -> bool:
        answer(conn, b"4000000000000000\r\nabc", "Transfer-Encoding: chunked")
        return False

    def negative(head: str, body: bytes, conn: socket.socket) -> bool:
        answer(conn, b"-1\r\nabc\r\n0\r\n\r\n", "Transfer-Encoding: chunked")
        return False

    for handler, error in ((huge, Truncated), (negative, BadAnswer)):
        with server(handler) as (port, _):
            connection = Connection(f"http://127.0.0.1:{port}", timeout=30)
            try:
                with pytest.raises(error):
                    connection.request("GET", "/", {}).read()
            finally:
                connection.close()


def test_a_refusal_names_the_servers_detail() -> None:
    def handle(head: str, body: bytes, conn: socket.socket) -> bool:
        data = b'{"detail": "job 9 not found"}'
        answer(conn, data, f"Content-Length: {len(data)}", status="404 Not Found")
        return True

    with server(handle) as (port, _):
        with JsonClient(f"http://127.0.0.1:{port}", "t", failover_s=0) as client:
            with pytest.raises(ClientError) as caught:
                client.job("9")
    assert (caught.value.message, caught.value.status) == ("job 9 not found", 404)


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for the name `localhost` (and its key)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"]
        + ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost"]
        + ["-addext", "subjectAltName=DNS:localhost"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return cert, key


def test_https_verifies_the_certificate_and_the_host_name(
    certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # An https URL: TLS with the system's trust (here: SSL_CERT_FILE names the certificate,
    # as a site's own CA would be installed). Trusted and named `localhost`: answered. Reached
    # as 127.0.0.1, a name the certificate does not hold: refused. Not trusted: refused.
    cert, key = certificate
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)

    def handle(head: str, body: bytes, conn: socket.socket) -> bool:
        answer(conn, b'{"tls": true}', "Content-Length: 13")
        return True

    with server(handle, tls) as (port, _):
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        with JsonClient(f"https://localhost:{port}", "t", failover_s=0) as client:
            assert client.whoami() == {"tls": True}
        with JsonClient(f"https://127.0.0.1:{port}", "t", failover_s=0) as client:
            with pytest.raises(ClientError) as caught:
                client.whoami()
        assert "certificate verify failed" in caught.value.message
        assert "127.0.0.1" in caught.value.message
        monkeypatch.setenv("SSL_CERT_FILE", str(cert.parent / "none.pem"))
        with JsonClient(f"https://localhost:{port}", "t", failover_s=0) as client:
            with pytest.raises(ClientError) as caught:
                client.whoami()
        assert "certificate verify failed" in caught.value.message
