"""HTTP/1.1 over a socket: the exchange JsonClient (the CLI's) makes with the manager.

The standard library's http.client parses an answer's headers with the `email` package and
loads `ssl` even for a plain-http URL: some 30 ms of imports on every CLI call, where the
client commands' own code takes a few. This is the part of HTTP/1.1 the manager's answers use:
one request at a time on a kept-alive connection, bodies of a known length, chunked (a log
stream) or up to the connection's close, over TCP or TLS (https: the system's certificates and
host name verified, as http.client does; `ssl` is imported only then). Every socket operation
has the connection's timeout. Errors are the standard library's: OSError and its kinds
(ConnectionRefusedError, TimeoutError, ConnectionResetError where the manager closed the
connection before its answer, `Truncated` where it closed it inside one), and `BadAnswer`
(an OSError) for what is no HTTP answer.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator, Mapping
from urllib.parse import urlsplit

#: The longest status or header line read (as http.client's).
MAX_LINE = 65536
MAX_HEADERS = 100
READ_SIZE = 1 << 16


class BadAnswer(OSError):
    """What the server sent is no HTTP/1.x answer."""


class Truncated(ConnectionError):
    """The connection closed inside an answer's body."""


class Headers:
    """An answer's header fields, looked up by name in any case (`get`, `in`, `[]`)."""

    __slots__ = ("_fields",)

    def __init__(self, fields: dict[str, str]) -> None:
        self._fields = fields  # names lower-cased

    def get(self, name: str, default: str | None = None) -> str | None:
        return self._fields.get(name.lower(), default)

    def __getitem__(self, name: str) -> str:
        return self._fields[name.lower()]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._fields

    def items(self) -> list[tuple[str, str]]:
        return list(self._fields.items())

    def __repr__(self) -> str:
        return f"Headers({self._fields!r})"


class Answer:
    """An answer's status line and headers; its body read whole (`read`) or as it comes
    (`chunks`), once."""

    def __init__(
        self, reader: _Reader, status: int, reason: str, headers: Headers, method: str
    ) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        self._reader = reader
        encoding = (headers.get("transfer-encoding") or "").lower()
        self._chunked = "chunked" in encoding
        length = headers.get("content-length")
        self._length: int | None = None
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            self._length = 0
        elif not self._chunked and length is not None:
            try:
                self._length = int(length)
            except ValueError:
                raise BadAnswer(f"a Content-Length that is no number: {length!r}") from None
            if self._length < 0:
                raise BadAnswer(f"a negative Content-Length: {length!r}")
        connection = (headers.get("connection") or "").lower()
        #: The server closes the connection after this answer: it cannot carry another.
        self.will_close = (
            "close" in connection
            or (reader.version == "HTTP/1.0" and "keep-alive" not in connection)
            or (self._length is None and not self._chunked)
        )

    def chunks(self) -> Iterator[bytes]:
        """The body's bytes as they come (empty pieces never)."""
        reader = self._reader
        if self._chunked:
            while True:
                size = reader.chunk_size()
                if size == 0:
                    reader.skip_trailer()
                    return
                while size:  # (in pieces: a size is the server's word, not memory's)
                    data = reader.exactly(min(size, READ_SIZE))
                    size -= len(data)
                    yield data
                reader.end_of_chunk()
        elif self._length is not None:
            left = self._length
            while left:
                data = reader.some(min(left, READ_SIZE))
                if not data:
                    raise Truncated(f"the connection closed {left} bytes before the answer's end")
                left -= len(data)
                yield data
        else:  # up to the connection's close
            while data := reader.some(READ_SIZE):
                yield data

    def read(self) -> bytes:
        return b"".join(self.chunks())


class _Reader:
    """The connection's incoming bytes, buffered."""

    def __init__(self, sock: socket.socket) -> None:
        self._file = sock.makefile("rb")
        self.version = "HTTP/1.1"

    def line(self) -> bytes:
        line = self._file.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise BadAnswer("a header line longer than 65536 bytes")
        return line

    def some(self, most: int) -> bytes:
        return self._file.read1(most)

    def exactly(self, size: int) -> bytes:
        data = self._file.read(size)
        if len(data) < size:
            raise Truncated(f"the connection closed {size - len(data)} bytes before a chunk's end")
        return data

    def chunk_size(self) -> int:
        line = self.line()
        if not line:
            raise Truncated("the connection closed before a chunk")
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            size = -1
        if size < 0:
            raise BadAnswer(f"a chunk size that is no number: {line[:40]!r}")
        return size

    def end_of_chunk(self) -> None:
        if self.line() not in (b"\r\n", b"\n"):
            raise BadAnswer("a chunk that does not end where its size says")

    def skip_trailer(self) -> None:
        while self.line() not in (b"\r\n", b"\n", b""):
            pass

    def close(self) -> None:
        self._file.close()


class Connection:
    """One connection to `base` (http[s]://HOST[:PORT][/PREFIX]), opened at the first request,
    carrying one request at a time."""

    def __init__(self, base: str, timeout: float) -> None:
        parts = urlsplit(base)
        self.https = parts.scheme == "https"
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if self.https else 80)
        self.authority = parts.netloc.rpartition("@")[2]
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._reader: _Reader | None = None

    def _open(self) -> tuple[socket.socket, _Reader]:
        # An ASCII host name as bytes: getaddrinfo then needs no "idna" codec (some ms to load).
        host: str | bytes = self.host if not self.host.isascii() else self.host.encode()
        sock = socket.create_connection((host, self.port), self.timeout)  # type: ignore[arg-type]
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.https:
                import ssl

                context = ssl.create_default_context()
                context.set_alpn_protocols(["http/1.1"])
                sock = context.wrap_socket(sock, server_hostname=self.host)
            reader = _Reader(sock)
        except BaseException:
            sock.close()
            raise
        self._sock, self._reader = sock, reader
        return sock, reader

    def request(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes | None = None
    ) -> Answer:
        """Send one request and read its answer's status and headers."""
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self.authority}"]
        lines.append("Accept-Encoding: identity")
        for name, value in headers.items():
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                raise ValueError(f"a header with a line break: {name!r}")
            lines.append(f"{name}: {value}")
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}")
        data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")
        if self._sock is None or self._reader is None:
            sock, reader = self._open()
        else:
            sock, reader = self._sock, self._reader
        sock.sendall(data)
        while True:
            status, reason = self._status(reader)
            fields = self._headers(reader)
            if status != 100:  # (a "100 Continue" precedes the answer)
                return Answer(reader, status, reason, fields, method)

    @staticmethod
    def _status(reader: _Reader) -> tuple[int, str]:
        line = reader.line()
        if not line:
            raise ConnectionResetError("the manager closed the connection without an answer")
        version, _, rest = line.decode("latin-1").rstrip("\r\n").partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
            raise BadAnswer(f"not an HTTP answer: {line[:40]!r}")
        reader.version = version
        return int(code), reason.strip()

    @staticmethod
    def _headers(reader: _Reader) -> Headers:
        fields: dict[str, str] = {}
        for _ in range(MAX_HEADERS + 1):
            line = reader.line()
            if line in (b"\r\n", b"\n", b""):
                return Headers(fields)
            name, colon, value = line.decode("latin-1").partition(":")
            if not colon:
                raise BadAnswer(f"a header line without a colon: {line[:40]!r}")
            key = name.strip().lower()
            value = value.strip()
            fields[key] = f"{fields[key]}, {value}" if key in fields else value
        raise BadAnswer(f"more than {MAX_HEADERS} header lines")

    def close(self) -> None:
        reader, sock = self._reader, self._sock
        self._reader = self._sock = None
        if reader is not None:
            reader.close()
        if sock is not None:
            sock.close()
