"""Bounds on what one request may carry, so that nothing a client sends can crash, hang or exhaust
the manager; shared by the API's routes and the ASGI middleware that runs before them.

`RequestGuard` (the middleware) refuses, before any route runs:

- a body longer than `max_body_bytes` (ManagerSettings.max_body_bytes, `corral up
  --max-body-bytes`): 413 at once when Content-Length says so (not a byte of it read), else
  (chunked) as soon as the bytes read pass the limit; either way the connection is closed;
- a NUL character in the path or in any query parameter (422: PostgreSQL refuses NUL in text);
- a body on /api/ that is not strict JSON (422): UTF-8, nested at most `MAX_JSON_DEPTH` deep
  (checked before parsing, which recurses), no key given twice in one object.

Every refusal is `{"detail": "one line"}`. The integer bounds below are what the routes declare
in their parameters, so that no number a client sends reaches the database out of its range.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from itertools import accumulate
from typing import Any
from urllib.parse import parse_qsl

from fastapi import FastAPI, HTTPException, Request
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral.server.spec import MAX_ARRAY_TASKS as MAX_ARRAY_TASKS  # a job array's tasks
from corral.server.spec import one_line
from corral.server.store import MAX_JOB_ID

__all__ = [
    "DEFAULT_LIST_LIMIT",
    "JSON_SCOPE_KEY",
    "MAX_JOB_ID",
    "MAX_JSON_DEPTH",
    "MAX_LIST_LIMIT",
    "ApiFallback",
    "JsonError",
    "RequestGuard",
    "json_body",
    "one_line",
    "strict_json",
    "workdir_problem",
]

#: Arrays and objects nested deeper than this are refused before the JSON parser sees them.
MAX_JSON_DEPTH = 32
#: Listings: jobs per page by default, and at most.
DEFAULT_LIST_LIMIT = 1_000
MAX_LIST_LIMIT = 10_000
#: Where the middleware leaves a request body it parsed (routes take it instead of parsing again).
JSON_SCOPE_KEY = "corral.json"
#: Text echoed back in an error message is cut to this many characters.
MAX_ECHO_CHARS = 64

#: Bodies longer than this are checked and parsed in a worker thread, off the event loop.
INLINE_BODY_BYTES = 64 * 1024
#: The depth scan: openers count +1, closers -1 (as signed bytes), anything else is dropped.
_DEPTH_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_NOT_BRACKETS = bytes(set(range(256)) - set(b"[]{}"))
_SCAN_CHUNK = 64 * 1024


class JsonError(ValueError):
    """A body that is not strict JSON; str() is one line, `FIELD: reason` where a field is
    known (a duplicate key), else the reason alone."""

    def __init__(self, reason: str, field: str = "") -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}" if field else reason)


class _Duplicate:
    """Left in place of an object that has a key twice; the path grows on the way out."""

    __slots__ = ("path",)

    def __init__(self, path: list[str]) -> None:
        self.path = path


def _duplicate_in(value: object) -> _Duplicate | None:
    if isinstance(value, _Duplicate):
        return value
    if isinstance(value, list):  # objects inside were checked by their own hook
        for index, item in enumerate(value):
            found = _duplicate_in(item)
            if found is not None:
                return _Duplicate([str(index), *found.path])
    return None


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any] | _Duplicate:
    result: dict[str, Any] = {}
    for key, value in pairs:
        found = _duplicate_in(value)
        if found is not None:
            return _Duplicate([key, *found.path])
        if key in result:
            return _Duplicate([key])
        result[key] = value
    return result


def json_depth_exceeds(text: bytes | str, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether arrays and objects nest deeper than `limit` in `text` (as the parser would
    recurse, balanced or not), found without recursion and at C speed (for the worst MiB, in
    less time than parsing it takes): escaped backslashes and quotes dropped, then strings,
    then every byte but a bracket; the depth is the largest running sum of the brackets as +1
    and -1."""
    body = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    if b"\\" in body:  # (in valid JSON a backslash is in a string: escapes pair from the left)
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside = b"".join(body.split(b'"')[0::2])  # UTF-8 has no other byte that is a quote
    steps = outside.translate(_DEPTH_STEPS, _NOT_BRACKETS)
    if b"\x01" * (limit + 1) in steps:
        return True
    depth = 0
    for start in range(0, len(steps), _SCAN_CHUNK):
        chunk = memoryview(steps)[start : start + _SCAN_CHUNK].cast("b")
        if max(accumulate(chunk, initial=depth)) > limit:
            return True
        depth += sum(chunk)
    return False


def strict_json(body: bytes | str, max_depth: int = MAX_JSON_DEPTH) -> object:
    """The value of a JSON document, or JsonError: not UTF-8, nested deeper than `max_depth`,
    a key given twice in one object (named with its path, `env.PATH`), or invalid."""
    if isinstance(body, bytes):
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as error:
            raise JsonError(f"the body is not UTF-8 (byte {error.start})") from None
    else:
        text = body
    if json_depth_exceeds(body, max_depth):
        raise JsonError(f"the body nests arrays and objects more than {max_depth} deep")
    try:
        value = json.loads(text, object_pairs_hook=_object)
    except RecursionError:  # unbalanced brackets deeper than the scan could tell
        raise JsonError(f"the body nests arrays and objects more than {max_depth} deep") from None
    except ValueError as error:
        where = (
            f" (line {error.lineno}, column {error.colno})"
            if isinstance(error, json.JSONDecodeError)
            else ""
        )
        reason = error.msg if isinstance(error, json.JSONDecodeError) else str(error)
        raise JsonError(f"the body is not valid JSON: {one_line(reason, 200)}{where}") from None
    found = _duplicate_in(value)
    if found is not None:
        path = ".".join(one_line(part, MAX_ECHO_CHARS) for part in found.path)
        raise JsonError("duplicate key (given twice)", path)
    return value


def workdir_form_problem(path: str) -> str | None:
    """Why `path` cannot name a job's working directory, by its form alone (one line), or None."""
    if not os.path.isabs(path):
        return f"must be an absolute path on the manager's machine (got {one_line(path, 200)})"
    return None


def workdir_problem(path: str) -> str | None:
    """Why `path` cannot be a job's working directory on this machine (one line), or None."""
    form = workdir_form_problem(path)
    if form is not None:
        return form
    try:
        if os.path.isdir(path):
            return None
        exists = os.path.lexists(path)
    except (OSError, ValueError):
        exists = False
    shown = one_line(path, 200)
    if exists:
        return f"{shown} is not a directory (on the manager's machine)"
    return f"{shown} does not exist on the manager's machine"


# -- the middleware -------------------------------------------------------------------------------


class _Refusal(HTTPException):
    """Raised from the guarded `receive`: FastAPI lets an HTTPException from reading the body
    through, and the app's handler answers it."""


def _error_body(status: int, detail: str) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    body = json.dumps({"detail": detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if status == 413:
        headers.append((b"connection", b"close"))
    return body, headers


async def _answer(
    send: Send, status: int, detail: str, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    body, headers = _error_body(status, detail)
    headers += extra or []
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def nul_problem(scope: Scope) -> str | None:
    """A one-line refusal when the path or a query parameter holds a NUL character."""
    if "\x00" in scope.get("path", ""):
        return "path: must not contain a NUL character"
    query = scope.get("query_string", b"")
    if b"\x00" in query or b"%00" in query:
        pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True)
        for key, value in pairs:
            if "\x00" in key or "\x00" in value:
                name = one_line(key, MAX_ECHO_CHARS) or "query"
                return f"{name}: must not contain a NUL character"
    return None


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class RequestGuard:
    """The pure ASGI middleware described in the module's docstring."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    def too_large(self, size: int | None = None) -> str:
        said = f" ({size} bytes)" if size is not None else ""
        return f"the request body is too large{said}; at most {self.max_body_bytes} bytes"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        problem = nul_problem(scope)
        if problem is not None:
            await _answer(send, 422, problem)
            return
        length = _content_length(scope)
        if length is not None and length > self.max_body_bytes:
            await _answer(send, 413, self.too_large(length))  # not one byte of it read
            return
        is_api = scope.get("path", "").startswith("/api/")
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, self._guarded(scope, receive, is_api), watched)
        except _Refusal as refusal:  # not answered by the app's handler (none on that path)
            if started:
                raise
            await _answer(send, refusal.status_code, str(refusal.detail))

    def _guarded(
        self, scope: Scope, receive: Receive, check_json: bool
    ) -> Callable[[], Awaitable[Message]]:
        """`receive` that reads the whole body at its first call, counting (413 past the limit),
        checks it is strict JSON (on /api/), and hands it over as one message."""
        read = False

        async def guarded() -> Message:
            nonlocal read
            if read:
                return await receive()
            chunks: list[bytes] = []
            size = 0
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return message  # the client went away
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self.max_body_bytes:
                    raise _Refusal(413, self.too_large(), headers={"Connection": "close"})
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
            read = True
            body = b"".join(chunks)
            if check_json and body.strip():
                try:
                    if len(body) <= INLINE_BODY_BYTES:
                        scope[JSON_SCOPE_KEY] = strict_json(body)
                    else:  # up to ~0.1 s of CPU for the worst MiB: not on the event loop
                        scope[JSON_SCOPE_KEY] = await run_in_threadpool(strict_json, body)
                except JsonError as error:
                    raise _Refusal(422, str(error)) from None
            return {"type": "http.request", "body": body, "more_body": False}

        return guarded


async def json_body(request: Request) -> object:
    """The request's JSON body: as the middleware parsed it, else (no middleware) parsed here as
    strictly. JsonError for an empty body too."""
    body = await request.body()
    if not body.strip():
        raise JsonError("the body is empty: a JSON document is expected")
    if JSON_SCOPE_KEY in request.scope:
        return request.scope[JSON_SCOPE_KEY]
    return strict_json(body)


class ApiFallback:
    """What answers a request no route took (mounted at "/", last): under /api a JSON 404 (no
    such path) or 405 (a path of the API, another method), never the dashboard's files; the
    dashboard (`static`) elsewhere."""

    def __init__(self, app: FastAPI, static: ASGIApp | None) -> None:
        self.app = app
        self.static = static

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and (path == "/api" or path.startswith("/api/")):
            methods = sorted(
                {
                    method
                    for route in self.app.routes
                    if isinstance(route, APIRoute) and route.path_regex.match(path)
                    for method in route.methods or ()
                }
            )
            shown = one_line(path, 200)
            if methods:
                detail = f"{scope['method']} {shown}: not allowed; use {', '.join(methods)}"
                extra = [(b"allow", ", ".join(methods).encode())]
                await _answer(send, 405, detail, extra)
            else:
                await _answer(send, 404, f"no such API path: {shown}")
        elif self.static is not None:
            await self.static(scope, receive, send)
        else:
            await _answer(send, 404, "Not Found")
