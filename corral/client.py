"""The Python SDK over corral's REST API (/api/v1).

    from corral.client import Client, JobStatus

    with Client() as corral:                  # CORRAL_URL and CORRAL_TOKEN from the environment
        job = corral.submit("job.yaml")       # a JobSummary (corral.api_models)
        for text in corral.follow_logs(job.id):
            print(text, end="")
        assert corral.wait(job.id, timeout=600).status is JobStatus.SUCCEEDED

`Client` (on httpx) answers typed records (the server's own pydantic models,
corral.api_models); `AsyncClient` is the same on asyncio (httpx.AsyncClient); `JsonClient`
answers the server's JSON as it came (dicts and lists, what the CLI prints), on a socket of the
standard library (corral.wire): a CLI call loads neither httpx, pydantic nor http.client.

Every call rides out a manager's restart or a failover to a standby: a call that could not be
made (connection refused or broken, a 503, a standby naming the leader) is made again, with
backoff, for up to `failover_s` seconds (CORRAL_FAILOVER_S, default 60). A call that reached
the manager is made again only where that cannot do it twice: reads, cancels, holds, and
submissions, each of which carries an `Idempotency-Key` chosen here (a repeated one stores one
job). Every refusal is a ClientError whose message is one line: the server's own `detail` (e.g.
``gpus: must be a positive integer``), or what went wrong reaching it.
"""

from __future__ import annotations

import codecs
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self
from urllib.parse import quote, urlencode, urlsplit

if TYPE_CHECKING:
    from pathlib import Path

    import httpx

    from corral import wire
    from corral.api_models import (
        ClusterView,
        JobDetail,
        JobStatus,
        JobSummary,
        ProfileInfo,
        QueueView,
        ShareAnswer,
        SharedModel,
        VcView,
    )

__all__ = [
    "AsyncClient",
    "Client",
    "ClientError",
    "ClusterView",
    "JobDetail",
    "JobStatus",
    "JobSummary",
    "JsonClient",
    "LogChunk",
    "ProfileInfo",
    "QueueView",
    "ShareAnswer",
    "SharedModel",
    "SpecFileError",
    "VcView",
    "load_spec_file",
]

DEFAULT_URL = "http://127.0.0.1:8470"
FINAL_STATUSES = frozenset({"SUCCEEDED", "FAILED", "CANCELLED", "REFUSED"})
POLL_SECONDS = 0.5
#: Jobs per request when listing (the server's most), and its header naming the next page.
PAGE_SIZE = 10_000
NEXT_PAGE_HEADER = "X-Corral-Next-Before-Id"
#: A standby's answers name the leader's address here (corral.server.standby).
LEADER_HEADER = "X-Corral-Leader"
#: A submission's idempotency key (corral.server.api).
IDEMPOTENCY_HEADER = "Idempotency-Key"
#: How long a call is made again across a manager's restart or a failover.
FAILOVER_S = 60.0
#: The backoff between tries: the first pause, doubled after each try up to the most.
BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 2.0
#: The pause after every listed manager was tried once in vain (several listed).
FAILOVER_PAUSE_S = 0.25
#: The longest a log stream stays open (corral.server.api ends it then; the client reads on).
LOG_STREAM_WINDOW_S = 60.0

#: The names this module lends from corral.api_models, imported (with pydantic) when first used.
_MODELS = frozenset(
    {
        "ClusterView",
        "JobDetail",
        "JobStatus",
        "JobSummary",
        "ProfileInfo",
        "QueueView",
        "SharedModel",
        "ShareAnswer",
        "VcView",
    }
)


def __getattr__(name: str) -> Any:
    if name in _MODELS:
        from corral import api_models

        return getattr(api_models, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ClientError(Exception):
    """A request corral refused (`status` is the HTTP status) or could not be made (None)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass(slots=True)
class LogChunk:
    text: str
    next_offset: int
    finished: bool  # this attempt's log will not grow any more
    attempt: int  # the attempt read (0: the job has not started yet)


class SpecFileError(ClientError):
    """A job spec file that cannot be read, or holds no mapping; the message names the file."""


def load_spec_file(path: str | Path) -> dict[str, Any]:
    """The mapping a YAML (or JSON) job spec file holds, as the user wrote it: the server
    validates it (and fills defaults, e.g. the VC of a user's token when `vc` is not given).
    SpecFileError, naming the file, when it is unreadable or not a mapping."""
    from corral.yamlfile import YamlFileError, read_yaml_file

    try:
        data = read_yaml_file(path)
    except YamlFileError as error:
        raise SpecFileError(f"{path}: {error}") from None
    if not isinstance(data, dict):
        raise SpecFileError(f"{path}: a job spec is a mapping of fields, not {_kind(data)}")
    return data


def _kind(value: object) -> str:
    return {list: "a list", str: "a string", bool: "true/false"}.get(type(value), "a number")


def _spec_body(
    spec: Mapping[str, Any] | str | Path, source: str | None
) -> tuple[dict[str, Any], str | None]:
    """(the spec as sent, what names it in refusals) of a mapping or a spec file's path. A
    spec with `env_from: submitter` and no `submitter_env` gets this process's environment
    there, less what corral.submitenv keeps back (corral's credentials, secrets, the login
    session)."""
    if not isinstance(spec, Mapping):  # a path: str or os.PathLike (pathlib is not loaded)
        source = source or str(spec)
        spec = load_spec_file(spec)
    body = dict(spec)
    if str(body.get("env_from", "")).lower() == "submitter" and "submitter_env" not in body:
        from corral.submitenv import submitter_environment

        body["submitter_env"] = submitter_environment()  # (less corral's secrets)
    return body, source


def _named(error: ClientError, source: str | None) -> ClientError:
    """A refusal of a file's spec, naming the file."""
    if source and error.status in (403, 422):  # a field of the spec was refused
        return ClientError(f"{source}: {error.message}", error.status)
    return error


# -- what a call may do again ------------------------------------------------------------------


@dataclass(slots=True)
class _Request:
    method: str
    path: str  # under /api/v1
    params: dict[str, Any] | None
    content: bytes | None
    headers: dict[str, str]
    repeatable: bool  # sent once, it may be sent again with the same effect


def _request(
    method: str,
    path: str,
    base_headers: Mapping[str, str],
    *,
    params: Mapping[str, Any] | None = None,
    json: Any = None,
    headers: Mapping[str, str] | None = None,
) -> _Request:
    sent = dict(base_headers)
    if headers:
        sent.update(headers)
    content = None
    if json is not None:
        content = _json_bytes(json)
        sent["Content-Type"] = "application/json"
    kept = {k: v for k, v in params.items() if v is not None} if params else None
    repeatable = method == "GET" or _repeatable(method, path, sent)
    return _Request(method, path, kept, content, sent, repeatable)


def _repeatable(method: str, path: str, headers: Mapping[str, str]) -> bool:
    """Whether a request sent once may be sent again with the same effect: a submission with
    its idempotency key, a cancel or a hold (of one job or of those a filter selects). Not a
    release (a second one is refused: not held), nor a requeue (it would stop the job again)."""
    if method != "POST":
        return False
    if path == "/jobs":
        return IDEMPOTENCY_HEADER in headers
    if path in ("/jobs/cancel", "/jobs/hold"):
        return True
    return path.startswith("/jobs/") and path.endswith(("/cancel", "/hold"))


@dataclass(slots=True)
class _Tries:
    """One call's tries and what follows a failed one: raise, or try again (perhaps on another
    manager) after a pause. The policy of Client, JsonClient and AsyncClient alike."""

    base: _Base
    repeatable: bool
    deadline: float | None = None
    pause_s: float = BACKOFF_FIRST_S
    tried: set[int] = field(default_factory=set)

    def after(self, problem: ClientError, sent: bool, response: _Reply | None = None) -> float:
        """The seconds to pause before the next try, or `problem` raised."""
        base = self.base
        leader = response.headers.get(LEADER_HEADER) if response is not None else None
        if response is not None and response.status_code != 503:
            raise problem
        if sent:
            base._reached = True  # a manager took the connection: it went away meanwhile
            if not self.repeatable:
                raise problem
        several = len(base._targets) > 1
        if not (several or leader or base._reached):
            raise problem  # never reached a manager there: not a restart, it is not running
        now = time.monotonic()
        if self.deadline is None:
            self.deadline = now + base.failover_s
        if now >= self.deadline:
            raise problem
        if leader and leader.rstrip("/") != base.url and base._follow(leader.rstrip("/")):
            return 0.0
        import random  # (only here: a CLI call that is answered at once never loads it)

        pause = self.pause_s * random.uniform(0.5, 1.0)
        self.pause_s = min(BACKOFF_MAX_S, self.pause_s * 2)
        if several:
            self.tried.add(base._at)
            base._use((base._at + 1) % len(base._targets))
            if len(self.tried) < len(base._targets):
                return 0.0  # the next listed manager at once
            self.tried.clear()  # each was tried: pause, then again
            pause = max(pause, FAILOVER_PAUSE_S)
        if response is not None:
            pause = max(pause, min(_retry_after(response), BACKOFF_MAX_S))
        return max(0.0, min(pause, self.deadline - now))


def _retry_after(response: _Reply) -> float:
    try:
        return max(0.0, float(response.headers.get("Retry-After", "0")))
    except ValueError:
        return 0.0


def _unreachable(url: str) -> str:
    return f"cannot reach corral at {url}: is `corral up` running? (CORRAL_URL)"


def _httpx_problem(error: httpx.HTTPError, url: str, timeout: float) -> _Failed:
    """The one-line error of a failed httpx exchange, and whether the request may have
    reached the manager."""
    import httpx

    if isinstance(error, httpx.ConnectError):
        return _Failed(ClientError(_unreachable(url)), False)  # refused, or no such host
    if isinstance(error, httpx.ConnectTimeout | httpx.PoolTimeout):
        return _Failed(ClientError(f"corral at {url} did not answer within {timeout:g} s"), False)
    if isinstance(error, httpx.TimeoutException):
        return _Failed(ClientError(f"corral at {url} did not answer within {timeout:g} s"), True)
    if isinstance(error, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
        return _Failed(ClientError(_unreachable(url)), True)  # the manager went away
    return _Failed(ClientError(f"corral at {url}: {str(error) or type(error).__name__}"), True)


def _stdlib_problem(error: BaseException, url: str, timeout: float) -> _Failed | None:
    """The same of a failed exchange on a socket (corral.wire); None for an error of another
    kind."""
    import socket

    if isinstance(error, ConnectionRefusedError | socket.gaierror):
        return _Failed(ClientError(_unreachable(url)), False)  # nothing was sent
    if isinstance(error, TimeoutError):
        return _Failed(ClientError(f"corral at {url} did not answer within {timeout:g} s"), True)
    if isinstance(error, ConnectionError):  # (a body cut short: wire.Truncated)
        return _Failed(ClientError(_unreachable(url)), True)  # the manager went away
    if isinstance(error, OSError):  # (what is no HTTP answer: wire.BadAnswer)
        return _Failed(ClientError(f"corral at {url}: {error or type(error).__name__}"), True)
    return None


@dataclass(slots=True)
class _Reply:
    """An answer of the server: status, headers (case-insensitive), body."""

    status_code: int
    reason_phrase: str
    headers: Any  # case-insensitive: corral.wire's Headers, httpx's Headers
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.content)


class _Failed(Exception):
    """An exchange that failed: its one-line error, and whether the request may have reached
    the manager (`sent`)."""

    def __init__(self, problem: ClientError, sent: bool) -> None:
        super().__init__(problem.message)
        self.problem = problem
        self.sent = sent


@dataclass(slots=True)
class _Streamed:
    """A streamed answer: its status, its headers and its body's bytes as they come (an
    iteration that raises _Failed where the connection breaks)."""

    status_code: int
    reason_phrase: str
    headers: Any  # case-insensitive: corral.wire's Headers, httpx's Headers
    chunks: Iterator[bytes]

    def whole(self) -> _Reply:
        body = b"".join(self.chunks)
        return _Reply(self.status_code, self.reason_phrase, self.headers, body)


def _answer(response: _Reply) -> ClientError | None:
    """None for a success, else the refusal."""
    if response.status_code < 400:
        return None
    return ClientError(_detail(response), response.status_code)


# -- the connection and its tries ------------------------------------------------------------


class _Base:
    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        timeout: float = 30,
        *,
        failover_s: float | None = None,
    ) -> None:
        """`url` (default: CORRAL_URL): one manager's address, or several separated by commas
        (an active manager and its standbys, docs/ha.md): requests go to the one that leads.
        A call that fails because the manager is restarting or failing over is made again,
        with backoff, on each listed manager in turn and where a standby says the leader is,
        for up to `failover_s` seconds (default: CORRAL_FAILOVER_S, else FAILOVER_S). Only
        calls that may be repeated are made again once they were sent: reads, submissions
        (each carries an idempotency key: a repeated one stores one job), cancels and holds;
        any call a manager refused with 503 (it changed nothing). With one URL, a manager
        that was never reached fails the call at once (it is not running there)."""
        given = url or os.environ.get("CORRAL_URL") or DEFAULT_URL
        urls = [part.strip().rstrip("/") for part in given.split(",") if part.strip()]
        token = token if token is not None else os.environ.get("CORRAL_TOKEN", "")
        self._headers = {"Authorization": f"Bearer {token.strip()}"} if token.strip() else {}
        self.timeout = timeout
        self._targets = [_target(one) for one in urls or [DEFAULT_URL]]
        self.urls = list(self._targets)
        if failover_s is None:
            failover_s = _env_seconds("CORRAL_FAILOVER_S", FAILOVER_S)
        self.failover_s = failover_s
        self._reached = False  # a manager answered this client once (a failure now: a restart)
        self._at = 0
        self.url = self._targets[0]
        # TLS verified where a manager is reached by https; plain http needs no context with
        # the system's certificates (which take a while to load, on every CLI call)
        self._verify = any(one.startswith("https:") for one in self._targets)

    def _use(self, index: int) -> None:
        """Send to the `index`th listed manager from now on."""
        self._at = index
        self.url = self._targets[index]

    def _follow(self, leader: str) -> bool:
        """Go to the leader a standby named; False for an address that is no usable URL."""
        if leader in self._targets:
            self._use(self._targets.index(leader))
            return True
        try:
            self._targets.append(_target(leader))
        except ClientError:
            return False
        self.urls.append(leader)
        self._use(len(self._targets) - 1)
        if leader.startswith("https:") and not self._verify:
            self._verify = True
            self._reopen()  # (a plain-http client verifies no certificate)
        return True

    def _reopen(self) -> None:
        raise NotImplementedError

    def _address(self, request: _Request) -> str:
        return f"{self.url}/api/v1{request.path}"

    def _prepare(self, method: str, path: str, **kwargs: Any) -> _Request:
        return _request(method, path, self._headers, **kwargs)

    def _stream_timeout(self) -> float:
        """A stream's read timeout: the server sends nothing while the log does not grow, for
        a window at most."""
        return LOG_STREAM_WINDOW_S + self.timeout


class _Sync(_Base):
    """The blocking calls, answering JSON, over a wire (corral.wire's or httpx's): what
    JsonClient and Client share."""

    _wire: _Wire

    def close(self) -> None:
        self._wire.close()

    def _reopen(self) -> None:
        self._wire.reopen(self._verify)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- HTTP ---------------------------------------------------------------------------------

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._send(method, path, **kwargs).json()

    def _send(self, method: str, path: str, **kwargs: Any) -> _Reply:
        request = self._prepare(method, path, **kwargs)
        tries = _Tries(self, request.repeatable)
        while True:
            try:
                response = self._wire.exchange(self.url, request, self._address(request))
            except _Failed as failed:
                pause = tries.after(failed.problem, failed.sent)
            else:
                self._reached = True
                refused = _answer(response)
                if refused is None:
                    return response
                pause = tries.after(refused, False, response)
            time.sleep(pause)

    # -- jobs ---------------------------------------------------------------------------------

    def _submit(self, spec: Mapping[str, Any] | str | Path, source: str | None) -> Any:
        body, source = _spec_body(spec, source)
        key = {IDEMPOTENCY_HEADER: os.urandom(16).hex()}  # the same for each try: one job stored
        try:
            return self._request("POST", "/jobs", json=body, headers=key)
        except ClientError as error:
            raise _named(error, source) from None

    def _jobs(
        self,
        status: str | None,
        vc: str | None,
        user: str | None,
        limit: int | None,
        name: str | None,
    ) -> list[Any]:
        found: list[Any] = []
        before: str | None = None
        while limit is None or len(found) < limit:
            page = PAGE_SIZE if limit is None else min(PAGE_SIZE, limit - len(found))
            params = {
                "status": None if status is None else str(status),
                "vc": vc,
                "user": user,
                "name": name,
                "limit": page,
                "before_id": before,
            }
            response = self._send("GET", "/jobs", params=params)
            found += response.json()
            before = response.headers.get(NEXT_PAGE_HEADER)
            if before is None:
                break
        return found

    def _control(self, verb: str, job_id: str | int, array: bool = False) -> Any:
        params = {"array": "true"} if array else None
        return self._request("POST", f"/jobs/{_segment(job_id)}/{verb}", params=params)

    def _wait(self, job_id: str | int, timeout: float, poll_s: float) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            job = self._request("GET", f"/jobs/{_segment(job_id)}")
            if job["status"] in FINAL_STATUSES:
                return job
            if time.monotonic() >= deadline:
                raise ClientError(f"job {job_id} is still {job['status']} after {timeout:g} s")
            time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))

    def cancel_jobs(self, **where: Any) -> dict[str, Any]:
        """Cancel every unfinished job a filter selects, in one call and one transaction:
        `state` (PENDING, RUNNING or a list of them), `user`, `vc`, `name` (a shell glob,
        `sweep-*`); at least one. Users select only their own jobs. {"count", "ids"}."""
        return self._bulk("cancel", where)

    def hold_jobs(self, **where: Any) -> dict[str, Any]:
        """Hold every pending job a filter selects (as `cancel_jobs`): {"count", "ids"}."""
        return self._bulk("hold", where)

    def release_jobs(self, **where: Any) -> dict[str, Any]:
        """Release every held job a filter selects (as `cancel_jobs`): {"count", "ids"}."""
        return self._bulk("release", where)

    def _bulk(self, verb: str, where: Mapping[str, Any]) -> dict[str, Any]:
        body = {key: value for key, value in where.items() if value not in (None, (), [])}
        if isinstance(body.get("state"), tuple):
            body["state"] = list(body["state"])
        answer: dict[str, Any] = self._request("POST", f"/jobs/{verb}", json=body)
        return answer

    # -- cluster and auth ---------------------------------------------------------------------

    def nodes(self) -> list[dict[str, Any]]:
        """Every node: state (up, draining, drained, down), reason, by, since, GPUs, jobs."""
        return _objects(self._request("GET", "/nodes"))

    def drain_node(self, node: str, reason: str, *, preempt: bool = False) -> dict[str, Any]:
        """Drain a node (admins only): nothing new starts on it; with `preempt` its jobs are
        preempted (checkpoint) and queued again, else they finish."""
        return _object(
            self._request(
                "POST",
                f"/nodes/{_segment(node)}/drain",
                json={"reason": reason, "preempt": preempt},
            )
        )

    def resume_node(self, node: str) -> dict[str, Any]:
        """Bring a drained node back (admins only)."""
        return _object(self._request("POST", f"/nodes/{_segment(node)}/resume"))

    def reservations(self) -> list[dict[str, Any]]:
        """Every reservation: name, start, end, duration, gpus, users, vcs, state, by."""
        return _objects(self._request("GET", "/reservations"))

    def create_reservation(
        self,
        name: str,
        *,
        start: float,
        duration: float,
        gpus: int | None = None,
        nodes: list[str] | None = None,
        users: list[str] | None = None,
        vcs: list[str] | None = None,
    ) -> dict[str, Any]:
        """Reserve `gpus` GPUs or the `nodes` from `start` (the manager's clock, seconds) for
        `duration` seconds for these users and VCs (admins only)."""
        body: dict[str, Any] = {"name": name, "start": start, "duration": duration}
        body |= {"users": users or [], "vcs": vcs or []}
        body |= {"gpus": gpus} if gpus is not None else {"nodes": nodes or []}
        return _object(self._request("POST", "/reservations", json=body))

    def delete_reservation(self, name: str) -> dict[str, Any]:
        """Delete a reservation (admins only)."""
        return _object(self._request("DELETE", f"/reservations/{_segment(name)}"))

    def scheduler_config(self) -> dict[str, Any]:
        """The scheduler config the manager runs with: {"scheduler": {...}}."""
        return _object(self._request("GET", "/config"))

    def create_token(
        self,
        user: str,
        vc: str | None = None,
        admin: bool = False,
        *,
        unix_user: str | None = None,
        expires_in: float | None = None,
    ) -> dict[str, Any]:
        """A new token (admins only): {token, id, user, vc, admin, unix_user, expires_at}; the
        secret is shown only now. `unix_user`: the account the user's jobs run as (default:
        the one named like the user); `expires_in`: seconds from now (default: never)."""
        body: dict[str, Any] = {"user": user, "admin": admin}
        if vc is not None:
            body["vc"] = vc
        if unix_user is not None:
            body["unix_user"] = unix_user
        if expires_in is not None:
            body["expires_in_seconds"] = expires_in
        return _object(self._request("POST", "/tokens", json=body))

    def tokens(self) -> list[dict[str, Any]]:
        """Every token (admins only), oldest first: {id, user, vc, admin, unix_user, name,
        created_at, expires_at, revoked_at, state}; never a secret."""
        return _objects(self._request("GET", "/tokens"))

    def revoke_token(self, token_id: str) -> dict[str, Any]:
        """Revoke one token by its id (admins only); returns it as listed."""
        return _object(self._request("DELETE", f"/tokens/{_segment(token_id)}"))

    def revoke_user_tokens(self, user: str) -> list[dict[str, Any]]:
        """Revoke every token of `user` (admins only); returns those revoked now."""
        return _objects(
            _object(self._request("POST", "/tokens/revoke", json={"user": user}))["revoked"]
        )

    def export(self, name: str) -> dict[str, Any]:
        """The job history as `corral export-trace` writes it (admins only): {"files": {file
        name: text}, "format", "written", "never_ran", ...}; `name` is the trace's file name,
        NAME.corral.jsonl or NAME.csv (Helios's format), and names the files beside it."""
        return _object(self._request("GET", "/export", params={"name": name}))

    def whoami(self) -> dict[str, Any]:
        return _object(self._request("GET", "/whoami"))

    def usage(self, since: float, until: float | None = None, by: str = "user") -> dict[str, Any]:
        """GPU-hours, jobs and queueing per user (`by="vc"`: per VC) in [since, until) (epoch
        seconds; until: now): {since, until, by, rows, total} (docs/server.md, usage)."""
        params: dict[str, Any] = {"since": since, "by": by}
        if until is not None:
            params["until"] = until
        return _object(self._request("GET", "/usage", params=params))

    # -- logs ---------------------------------------------------------------------------------

    def logs(
        self,
        job_id: str | int,
        attempt: int | None = None,
        rank: int = 0,
        stream: str = "stdout",
        offset: int = 0,
        tail: int | None = None,
    ) -> tuple[str, int, bool]:
        """(text from `offset`, the next offset, whether the log is complete) of one worker's
        stdout or stderr; the latest attempt unless `attempt` is given. With `tail`, the text
        starts at the last `tail` lines instead. At most 1 MiB: read on from the next offset.
        When the log cap dropped what was asked for, the text starts with a line saying so."""
        chunk = self.log_chunk(job_id, attempt, rank, stream, offset, tail)
        return chunk.text, chunk.next_offset, chunk.finished

    def log_chunk(
        self,
        job_id: str | int,
        attempt: int | None = None,
        rank: int = 0,
        stream: str = "stdout",
        offset: int = 0,
        tail: int | None = None,
    ) -> LogChunk:
        params = _log_params(attempt, rank, stream, offset, tail)
        response = self._send("GET", f"/jobs/{_segment(job_id)}/logs", params=params)
        return _log_chunk(response, attempt, offset)

    def follow_logs(
        self,
        job_id: str | int,
        attempt: int | None = None,
        rank: int = 0,
        stream: str = "stdout",
        poll_s: float = POLL_SECONDS,
        tail: int | None = None,
    ) -> Iterator[str]:
        """The log's text as it grows, until the job ends. Without `attempt`, it follows the
        latest attempt and moves on to each new one (after a failure or a preemption),
        yielding a separator line between them. With `tail`, it starts with the last `tail`
        lines of the attempt rather than its beginning. The text comes as the manager streams
        it (GET .../logs/stream); across a restart of the manager it reads on from the byte it
        had reached, so nothing is lost or repeated. `poll_s`: the pause between reads where
        the manager serves no stream (too many open: 429)."""
        follow = _Follow(attempt, tail)
        while True:
            step = follow.read()
            chunk = self.log_chunk(job_id, step.attempt, rank, stream, step.offset, step.tail)
            yield from follow.took(chunk)
            then = follow.then(chunk)
            if then == "stream":
                yield from self._stream_log(job_id, follow, rank, stream, poll_s)
            elif then == "next":
                latest = self.log_chunk(job_id, None, rank, stream, 0).attempt
                separator = follow.next_attempt(latest)
                if separator is None:
                    return  # the job ended with this attempt
                yield separator
            elif then == "end":
                return

    def _stream_log(
        self, job_id: str | int, follow: _Follow, rank: int, stream: str, poll_s: float
    ) -> Iterator[str]:
        """The attempt's log from `follow.offset` as the manager streams it, until the stream
        ends (the attempt's log is final, or its window passed): the caller reads on with a
        plain read, which says which. A broken stream is opened again from the byte reached."""
        tries = _Tries(self, True)
        while True:
            request = self._prepare(
                "GET",
                f"/jobs/{_segment(job_id)}/logs/stream",
                params=_stream_params(follow, rank, stream),
            )
            decoder = _Decoder(follow.offset)
            try:
                with self._wire.stream(
                    self.url, request, self._address(request), self._stream_timeout()
                ) as response:
                    self._reached = True
                    follow.streamed(int(response.headers.get("X-Corral-Attempt", "0")))
                    if response.status_code == 429:  # too many streams open: read, pause
                        time.sleep(poll_s)
                        return
                    if response.status_code >= 400:
                        whole = response.whole()
                        refused = _answer(whole)
                        assert refused is not None
                        time.sleep(tries.after(refused, False, whole))
                        continue
                    for data in response.chunks:
                        text = decoder.decode(data)
                        follow.offset = decoder.offset
                        if text:
                            tries = _Tries(self, True)  # it flows again: a fresh allowance
                            yield follow.saw(text)
                return
            except _Failed as failed:
                follow.offset = decoder.offset
                time.sleep(tries.after(failed.problem, failed.sent))


# -- the wires: a socket (JsonClient: the CLI's, quick to load) and httpx (Client) -------------


class _Wire:
    def exchange(self, base: str, request: _Request, address: str) -> _Reply:
        """One request to the manager at `base`; _Failed where it could not be made."""
        raise NotImplementedError

    def stream(
        self, base: str, request: _Request, address: str, read_timeout: float
    ) -> AbstractContextManager[_Streamed]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def reopen(self, verify: bool) -> None:
        self.close()


class _StdlibWire(_Wire):
    """HTTP/1.1 on a socket (corral.wire: the standard library's socket, and ssl for https): a
    CLI call loads it in a few ms, where http.client takes some 30 (its email parser, ssl) and
    httpx some 100 more; one kept-alive connection serves every request."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._connection: wire.Connection | None = None
        self._base: str | None = None

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    @staticmethod
    def _target(base: str, request: _Request) -> str:
        target = urlsplit(base).path + "/api/v1" + request.path
        if request.params:
            target += "?" + urlencode(request.params)
        return target

    def exchange(self, base: str, request: _Request, address: str) -> _Reply:
        """On the kept-alive connection; once more on a fresh connection when the server had
        closed the old one meanwhile (nothing was sent then)."""
        from corral import wire

        if base != self._base:
            self.close()
            self._base = base
        target = self._target(base, request)
        for retry in (True, False):
            reused = self._connection is not None
            connection = self._connection or wire.Connection(base, self.timeout)
            self._connection = connection
            try:
                answer = connection.request(
                    request.method, target, request.headers, request.content
                )
                content = answer.read()
            except (ConnectionResetError, BrokenPipeError) as error:
                self.close()
                if reused and retry and _stale(error):
                    continue
                raise self._failed(error, base) from None
            except BaseException as error:
                self.close()
                raise self._failed(error, base) from None
            if answer.will_close:
                self.close()
            return _Reply(answer.status, answer.reason, answer.headers, content)
        raise AssertionError("unreachable")

    def _failed(self, error: BaseException, base: str) -> BaseException:
        return _stdlib_problem(error, base, self.timeout) or error

    @contextmanager
    def stream(
        self, base: str, request: _Request, address: str, read_timeout: float
    ) -> Iterator[_Streamed]:
        from corral import wire

        connection = wire.Connection(base, read_timeout)  # its own: it stays busy
        try:
            try:
                answer = connection.request(
                    request.method, self._target(base, request), request.headers
                )
            except BaseException as error:
                raise self._failed(error, base) from None

            def chunks() -> Iterator[bytes]:
                pieces = answer.chunks()
                while True:
                    try:
                        data = next(pieces, b"")
                    except BaseException as error:
                        raise self._failed(error, base) from None
                    if not data:
                        return
                    yield data

            yield _Streamed(answer.status, answer.reason, answer.headers, chunks())
        finally:
            connection.close()


def _stale(error: BaseException) -> bool:
    """A kept-alive connection the server had closed (no answer: a ConnectionResetError; a
    broken pipe: closed under the request)."""
    return isinstance(error, ConnectionResetError | BrokenPipeError)


class _HttpxWire(_Wire):
    """httpx: a pool of kept-alive connections (Client's)."""

    def __init__(self, timeout: float, verify: bool, transport: httpx.BaseTransport | None) -> None:
        self.timeout = timeout
        self._transport = transport  # (tests: a transport that loses answers)
        self.http = self._open(verify)

    def _open(self, verify: bool) -> httpx.Client:
        _load_httpx()
        import httpx

        return httpx.Client(timeout=self.timeout, verify=verify, transport=self._transport)

    def close(self) -> None:
        self.http.close()

    def reopen(self, verify: bool) -> None:
        self.http.close()
        self.http = self._open(verify)

    def exchange(self, base: str, request: _Request, address: str) -> _Reply:
        _load_httpx()
        import httpx

        try:
            response = self.http.request(
                request.method,
                address,
                params=request.params,
                content=request.content,
                headers=request.headers,
            )
        except httpx.HTTPError as error:
            raise _httpx_problem(error, base, self.timeout) from None
        return _Reply(
            response.status_code, response.reason_phrase, response.headers, response.content
        )

    @contextmanager
    def stream(
        self, base: str, request: _Request, address: str, read_timeout: float
    ) -> Iterator[_Streamed]:
        _load_httpx()
        import httpx

        timeout = httpx.Timeout(self.timeout, read=read_timeout)
        try:
            with self.http.stream(
                "GET", address, params=request.params, headers=request.headers, timeout=timeout
            ) as response:

                def chunks() -> Iterator[bytes]:
                    try:
                        yield from response.iter_raw()
                    except httpx.HTTPError as error:
                        raise _httpx_problem(error, base, self.timeout) from None

                yield _Streamed(
                    response.status_code, response.reason_phrase, response.headers, chunks()
                )
        except httpx.HTTPError as error:
            raise _httpx_problem(error, base, self.timeout) from None


def _load_httpx() -> None:
    """Import httpx, when first needed (JsonClient, the CLI's, never loads it), without its
    own command line: httpx loads that (rich, pygments, click: some 100 ms) where those are
    installed, and then `httpx.main` only says to install httpx[cli]."""
    if "httpx" not in sys.modules:
        sys.modules["httpx._main"] = None  # type: ignore[assignment]
        try:
            import httpx  # noqa: F401
        finally:
            del sys.modules["httpx._main"]


# -- following a log -----------------------------------------------------------------------------


def _log_params(
    attempt: int | None, rank: int, stream: str, offset: int, tail: int | None
) -> dict[str, Any]:
    params: dict[str, Any] = {"rank": rank, "stream": stream}
    if tail is None:
        params["offset"] = offset
    else:
        params["tail"] = tail
    if attempt is not None:
        params["attempt"] = attempt
    return params


def _log_chunk(response: _Reply, attempt: int | None, offset: int) -> LogChunk:
    headers = response.headers
    return LogChunk(
        text=response.text,
        next_offset=int(headers.get("X-Corral-Offset", offset + len(response.content))),
        finished=headers.get("X-Corral-Finished", "true") == "true",
        attempt=int(headers.get("X-Corral-Attempt", attempt or 0)),
    )


@dataclass(slots=True)
class _Read:
    attempt: int | None
    offset: int
    tail: int | None


@dataclass(slots=True)
class _Follow:
    """Where a follower of a job's log is: the attempt it follows (None: the latest, until one
    is known), the byte it reached, whether its text so far ends a line. Shared by the blocking
    and the asyncio clients; each read or stream moves it on."""

    asked: int | None  # the attempt asked for (None: every attempt, the latest first)
    tail: int | None
    current: int | None = None
    offset: int = 0
    ends_line: bool = True

    def __post_init__(self) -> None:
        self.current = self.asked

    def read(self) -> _Read:
        """The next plain read: `tail` only the first time, then on from the offset."""
        tail, self.tail = self.tail, None
        return _Read(self.current, self.offset, tail)

    def took(self, chunk: LogChunk) -> list[str]:
        """What to yield of a plain read's chunk."""
        if self.current is None and chunk.attempt:
            self.current = chunk.attempt  # stay on it: a later attempt gets a separator
        if not chunk.text:
            return []
        self.offset = chunk.next_offset
        return [self.saw(chunk.text)]

    def saw(self, text: str) -> str:
        self.ends_line = text.endswith("\n")
        return text

    def streamed(self, attempt: int) -> None:
        """The stream's header named the attempt it follows."""
        if self.current is None and attempt:
            self.current = attempt

    def then(self, chunk: LogChunk) -> str:
        """After a plain read: "stream" (the log grows: stream it), "again" (read once more to
        be sure nothing is left), "next" (see whether a later attempt began) or "end"."""
        if not chunk.finished:
            return "stream"
        if chunk.text:
            return "again"
        if self.asked is not None or self.current is None:
            return "end"  # the attempt asked for is over, or the job ended before starting
        return "next"

    def next_attempt(self, latest: int) -> str | None:
        """The separator line before the latest attempt's log, or None: the job ended with
        this attempt."""
        if self.current is None or latest <= self.current:
            return None
        self.current, self.offset = latest, 0
        separator = ("" if self.ends_line else "\n") + f"--- attempt {latest} ---\n"
        self.ends_line = True
        return separator


def _stream_params(follow: _Follow, rank: int, stream: str) -> dict[str, Any]:
    params: dict[str, Any] = {"rank": rank, "stream": stream, "offset": follow.offset}
    if follow.current is not None:
        params["attempt"] = follow.current
    return params


class _Decoder:
    """UTF-8 text of a byte stream that may cut a character in two, and the offset of the
    bytes decoded so far (a cut character's first bytes wait for the rest)."""

    def __init__(self, offset: int) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._received = offset

    def decode(self, data: bytes) -> str:
        self._received += len(data)
        return str(self._decoder.decode(data))

    @property
    def offset(self) -> int:
        return self._received - len(self._decoder.getstate()[0])


class JsonClient(_Sync):
    """The API's calls answering the server's JSON as it came: dicts and lists (what the CLI
    prints), on a socket (corral.wire): it loads neither httpx, pydantic nor http.client."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        timeout: float = 30,
        *,
        failover_s: float | None = None,
    ) -> None:
        super().__init__(url, token, timeout, failover_s=failover_s)
        self._wire = _StdlibWire(timeout)

    def submit(
        self, spec: Mapping[str, Any] | str | Path, *, source: str | None = None
    ) -> dict[str, Any]:
        """Submit a job spec (a mapping, or a YAML/JSON file's path) -> the job's summary.
        Refusals of a file's spec name the file (`source` names it for a mapping)."""
        return _object(self._submit(spec, source))

    def jobs(
        self,
        status: str | None = None,
        vc: str | None = None,
        user: str | None = None,
        limit: int | None = None,
        name: str | None = None,
    ) -> list[dict[str, Any]]:
        """Jobs newest first (a user sees their own and their VC's), filtered by the server:
        the first `limit`, or (None) all of them, read a page at a time."""
        return [_object(one) for one in self._jobs(status, vc, user, limit, name)]

    def queue(self, limit: int = 100) -> dict[str, Any]:
        """The waiting jobs in the scheduler's order: {"total": how many wait, "jobs": the
        first `limit` of them (summaries, whose `reason` says why each waits)}."""
        return _object(self._request("GET", "/queue", params={"limit": limit}))

    def job(self, job_id: str | int) -> dict[str, Any]:
        """One job's detail: the summary plus spec, attempts, events."""
        return _object(self._request("GET", f"/jobs/{_segment(job_id)}"))

    def cancel(self, job_id: str | int, *, array: bool = False) -> dict[str, Any]:
        """Cancel the job; `array`: every unfinished task of the array `job_id` names."""
        return _object(self._control("cancel", job_id, array))

    def hold(self, job_id: str | int, *, array: bool = False) -> dict[str, Any]:
        """Keep a pending job (or every task of an array) from starting until released."""
        return _object(self._control("hold", job_id, array))

    def release(self, job_id: str | int, *, array: bool = False) -> dict[str, Any]:
        """Let a held job (or every task of an array) start again."""
        return _object(self._control("release", job_id, array))

    def requeue(self, job_id: str | int) -> dict[str, Any]:
        """Stop a running job and queue it again, or queue a failed or cancelled job again."""
        return _object(self._control("requeue", job_id))

    def wait(
        self, job_id: str | int, timeout: float, poll_s: float = POLL_SECONDS
    ) -> dict[str, Any]:
        """The job's detail once it has ended (SUCCEEDED, FAILED, CANCELLED or REFUSED);
        ClientError after `timeout` seconds."""
        return _object(self._wait(job_id, timeout, poll_s))

    def vcs(self) -> list[dict[str, Any]]:
        """Virtual clusters: name, guaranteed_gpus, allocated_gpus, pending, running."""
        return _objects(self._request("GET", "/vcs"))

    def cluster(self) -> dict[str, Any]:
        """Nodes and their GPUs (with the job holding each), and the VCs."""
        return _object(self._request("GET", "/cluster"))

    def profiles(self) -> list[dict[str, Any]]:
        """Measured throughput per VC, model and placement shape (steps/s): {model, gpu_type,
        gpus, nodes, colocated, vc, shared, steps_per_s, samples_per_s, seconds, runs,
        updated_at}; a user sees their VC's, the shared models' and those of no VC."""
        return _objects(self._request("GET", "/profiles"))

    def shared_models(self) -> list[dict[str, Any]]:
        """The models marked shared: {model, marked_by, marked_at}."""
        return _objects(self._request("GET", "/profiles/shared"))

    def share_model(self, model: str, shared: bool = True) -> dict[str, Any]:
        """Mark `model` shared, or with `shared=False` not (admins only): {model, shared,
        changed}."""
        path = "/profiles/share" if shared else "/profiles/unshare"
        return _object(self._request("POST", path, json={"model": model}))


class Client(_Sync):
    """The API's calls answering typed records (corral.api_models: pydantic models; a job's
    `status` is a JobStatus). A record also reads as a mapping (`job["status"]`), as the
    answers of this client did before they were typed. On httpx (`transport`: httpx's, e.g.
    a test's that loses answers)."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        timeout: float = 30,
        *,
        failover_s: float | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(url, token, timeout, failover_s=failover_s)
        self._wire = _HttpxWire(timeout, self._verify, transport)

    def submit(
        self, spec: Mapping[str, Any] | str | Path, *, source: str | None = None
    ) -> JobSummary:
        """Submit a job spec (a mapping, or a YAML/JSON file's path) -> the job's summary (a
        job array's also has `array_tasks`, its tasks' ids). Refusals of a file's spec name
        the file (`source` names it for a mapping). A spec with `env_from: submitter` and no
        `submitter_env` gets this process's environment there, less what corral.submitenv
        keeps back. Made again across a restart, it stores one job (its idempotency key)."""
        return _as_JobSummary(self._submit(spec, source))

    def jobs(
        self,
        status: str | JobStatus | None = None,
        vc: str | None = None,
        user: str | None = None,
        limit: int | None = None,
        name: str | None = None,
    ) -> list[JobSummary]:
        """Jobs newest first (a user sees their own and their VC's), filtered by the server:
        the first `limit`, or (None) all of them, read a page at a time."""
        found = self._jobs(None if status is None else str(status), vc, user, limit, name)
        summary = _as_JobSummary
        return [summary(one) for one in found]

    def queue(self, limit: int = 100) -> QueueView:
        """The waiting jobs in the scheduler's order: `total` (how many wait) and `jobs` (the
        first `limit` of them, whose `reason` says why each waits)."""
        answer = self._request("GET", "/queue", params={"limit": limit})
        return _as_QueueView(answer)

    def job(self, job_id: str | int) -> JobDetail:
        """One job's detail: the summary plus spec, attempts, events."""
        return _as_JobDetail(self._request("GET", f"/jobs/{_segment(job_id)}"))

    def cancel(self, job_id: str | int, *, array: bool = False) -> JobSummary:
        """Cancel the job; `array`: every unfinished task of the array `job_id` names."""
        return _as_JobSummary(self._control("cancel", job_id, array))

    def hold(self, job_id: str | int, *, array: bool = False) -> JobSummary:
        """Keep a pending job (or every task of an array) from starting until released."""
        return _as_JobSummary(self._control("hold", job_id, array))

    def release(self, job_id: str | int, *, array: bool = False) -> JobSummary:
        """Let a held job (or every task of an array) start again."""
        return _as_JobSummary(self._control("release", job_id, array))

    def requeue(self, job_id: str | int) -> JobSummary:
        """Stop a running job and queue it again, or queue a failed or cancelled job again."""
        return _as_JobSummary(self._control("requeue", job_id))

    def wait(self, job_id: str | int, timeout: float, poll_s: float = POLL_SECONDS) -> JobDetail:
        """The job's detail once it has ended (SUCCEEDED, FAILED, CANCELLED or REFUSED);
        ClientError after `timeout` seconds. It rides out restarts of the manager (each
        read is made again for up to `failover_s`)."""
        return _as_JobDetail(self._wait(job_id, timeout, poll_s))

    def vcs(self) -> list[VcView]:
        """Virtual clusters: name, guaranteed_gpus, allocated_gpus, pending, running."""
        view = _as_VcView
        return [view(one) for one in self._request("GET", "/vcs")]

    def cluster(self) -> ClusterView:
        """Nodes and their GPUs (with the job holding each), and the VCs."""
        return _as_ClusterView(self._request("GET", "/cluster"))

    def profiles(self) -> list[ProfileInfo]:
        """Measured throughput per VC, model and placement shape (steps/s); a user sees their
        VC's, the shared models' and those of no VC."""
        info = _as_ProfileInfo
        return [info(one) for one in self._request("GET", "/profiles")]

    def shared_models(self) -> list[SharedModel]:
        """The models marked shared."""
        model = _as_SharedModel
        return [model(one) for one in self._request("GET", "/profiles/shared")]

    def share_model(self, model: str, shared: bool = True) -> ShareAnswer:
        """Mark `model` shared, or with `shared=False` not (admins only)."""
        path = "/profiles/share" if shared else "/profiles/unshare"
        answer = self._request("POST", path, json={"model": model})
        return _as_ShareAnswer(answer)


class AsyncClient(_Base):
    """The job calls of Client on asyncio (httpx.AsyncClient), with the same tries across a
    restart or a failover: submit, job, jobs, cancel, wait, log_chunk, follow_logs."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        timeout: float = 30,
        *,
        failover_s: float | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(url, token, timeout, failover_s=failover_s)
        self._transport = transport
        self._http = self._open()
        self._retired: list[httpx.AsyncClient] = []

    def _open(self) -> httpx.AsyncClient:
        _load_httpx()
        import httpx

        return httpx.AsyncClient(
            timeout=self.timeout, verify=self._verify, transport=self._transport
        )

    def _reopen(self) -> None:
        self._retired.append(self._http)  # closed with this client (no await here)
        self._http = self._open()

    async def aclose(self) -> None:
        for one in [*self._retired, self._http]:
            await one.aclose()
        self._retired.clear()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        return (await self._send(method, path, **kwargs)).json()

    async def _send(self, method: str, path: str, **kwargs: Any) -> _Reply:
        import httpx

        request = self._prepare(method, path, **kwargs)
        tries = _Tries(self, request.repeatable)
        while True:
            address = self.url
            try:
                answer = await self._http.request(
                    request.method,
                    self._address(request),
                    params=request.params,
                    content=request.content,
                    headers=request.headers,
                )
            except httpx.HTTPError as error:
                failed = _httpx_problem(error, address, self.timeout)
                pause = tries.after(failed.problem, failed.sent)
            else:
                self._reached = True
                response = _Reply(
                    answer.status_code, answer.reason_phrase, answer.headers, answer.content
                )
                refused = _answer(response)
                if refused is None:
                    return response
                pause = tries.after(refused, False, response)
            await _sleep(pause)

    async def submit(
        self, spec: Mapping[str, Any] | str | Path, *, source: str | None = None
    ) -> JobSummary:
        """As Client.submit: one job however often it is made again."""
        body, source = _spec_body(spec, source)
        key = {IDEMPOTENCY_HEADER: os.urandom(16).hex()}
        try:
            answer = await self._request("POST", "/jobs", json=body, headers=key)
        except ClientError as error:
            raise _named(error, source) from None
        return _as_JobSummary(answer)

    async def job(self, job_id: str | int) -> JobDetail:
        answer = await self._request("GET", f"/jobs/{_segment(job_id)}")
        return _as_JobDetail(answer)

    async def jobs(
        self,
        status: str | JobStatus | None = None,
        vc: str | None = None,
        user: str | None = None,
        limit: int | None = None,
        name: str | None = None,
    ) -> list[JobSummary]:
        found: list[Any] = []
        before: str | None = None
        while limit is None or len(found) < limit:
            page = PAGE_SIZE if limit is None else min(PAGE_SIZE, limit - len(found))
            params = {
                "status": None if status is None else str(status),
                "vc": vc,
                "user": user,
                "name": name,
                "limit": page,
                "before_id": before,
            }
            response = await self._send("GET", "/jobs", params=params)
            found += response.json()
            before = response.headers.get(NEXT_PAGE_HEADER)
            if before is None:
                break
        summary = _as_JobSummary
        return [summary(one) for one in found]

    async def cancel(self, job_id: str | int, *, array: bool = False) -> JobSummary:
        params = {"array": "true"} if array else None
        answer = await self._request("POST", f"/jobs/{_segment(job_id)}/cancel", params=params)
        return _as_JobSummary(answer)

    async def wait(
        self, job_id: str | int, timeout: float, poll_s: float = POLL_SECONDS
    ) -> JobDetail:
        deadline = time.monotonic() + timeout
        while True:
            job = await self.job(job_id)
            if job.status.final:
                return job
            if time.monotonic() >= deadline:
                raise ClientError(f"job {job_id} is still {job.status} after {timeout:g} s")
            await _sleep(min(poll_s, max(0.0, deadline - time.monotonic())))

    async def log_chunk(
        self,
        job_id: str | int,
        attempt: int | None = None,
        rank: int = 0,
        stream: str = "stdout",
        offset: int = 0,
        tail: int | None = None,
    ) -> LogChunk:
        params = _log_params(attempt, rank, stream, offset, tail)
        response = await self._send("GET", f"/jobs/{_segment(job_id)}/logs", params=params)
        return _log_chunk(response, attempt, offset)

    async def follow_logs(
        self,
        job_id: str | int,
        attempt: int | None = None,
        rank: int = 0,
        stream: str = "stdout",
        poll_s: float = POLL_SECONDS,
        tail: int | None = None,
    ) -> AsyncIterator[str]:
        """As Client.follow_logs."""
        follow = _Follow(attempt, tail)
        while True:
            step = follow.read()
            chunk = await self.log_chunk(job_id, step.attempt, rank, stream, step.offset, step.tail)
            for text in follow.took(chunk):
                yield text
            then = follow.then(chunk)
            if then == "stream":
                async for text in self._stream_log(job_id, follow, rank, stream, poll_s):
                    yield text
            elif then == "next":
                latest = (await self.log_chunk(job_id, None, rank, stream, 0)).attempt
                separator = follow.next_attempt(latest)
                if separator is None:
                    return
                yield separator
            elif then == "end":
                return

    async def _stream_log(
        self, job_id: str | int, follow: _Follow, rank: int, stream: str, poll_s: float
    ) -> AsyncIterator[str]:
        import httpx

        tries = _Tries(self, True)
        while True:
            request = self._prepare(
                "GET",
                f"/jobs/{_segment(job_id)}/logs/stream",
                params=_stream_params(follow, rank, stream),
            )
            address = self.url
            decoder = _Decoder(follow.offset)
            try:
                async with self._http.stream(
                    "GET",
                    self._address(request),
                    params=request.params,
                    headers=request.headers,
                    timeout=httpx.Timeout(self.timeout, read=self._stream_timeout()),
                ) as response:
                    self._reached = True
                    follow.streamed(int(response.headers.get("X-Corral-Attempt", "0")))
                    if response.status_code == 429:
                        await _sleep(poll_s)
                        return
                    if response.status_code >= 400:
                        whole = _Reply(
                            response.status_code,
                            response.reason_phrase,
                            response.headers,
                            await response.aread(),
                        )
                        refused = _answer(whole)
                        assert refused is not None
                        await _sleep(tries.after(refused, False, whole))
                        continue
                    async for data in response.aiter_raw():
                        text = decoder.decode(data)
                        follow.offset = decoder.offset
                        if text:
                            tries = _Tries(self, True)
                            yield follow.saw(text)
                return
            except httpx.HTTPError as error:
                follow.offset = decoder.offset
                failed = _httpx_problem(error, address, self.timeout)
                await _sleep(tries.after(failed.problem, failed.sent))


async def _sleep(seconds: float) -> None:
    import asyncio  # (here: the blocking clients, the CLI's, do without it)

    await asyncio.sleep(seconds)


# -- helpers ------------------------------------------------------------------------------------


# corral.api_models is imported when a typed answer is first made: pydantic takes a while to
# load, and JsonClient (the CLI's) never loads it.


def _as_JobSummary(answer: Any) -> JobSummary:
    from corral.api_models import JobSummary

    return JobSummary.model_validate(answer)


def _as_JobDetail(answer: Any) -> JobDetail:
    from corral.api_models import JobDetail

    return JobDetail.model_validate(answer)


def _as_QueueView(answer: Any) -> QueueView:
    from corral.api_models import QueueView

    return QueueView.model_validate(answer)


def _as_VcView(answer: Any) -> VcView:
    from corral.api_models import VcView

    return VcView.model_validate(answer)


def _as_ClusterView(answer: Any) -> ClusterView:
    from corral.api_models import ClusterView

    return ClusterView.model_validate(answer)


def _as_ProfileInfo(answer: Any) -> ProfileInfo:
    from corral.api_models import ProfileInfo

    return ProfileInfo.model_validate(answer)


def _as_SharedModel(answer: Any) -> SharedModel:
    from corral.api_models import SharedModel

    return SharedModel.model_validate(answer)


def _as_ShareAnswer(answer: Any) -> ShareAnswer:
    from corral.api_models import ShareAnswer

    return ShareAnswer.model_validate(answer)


def _object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ClientError(f"corral answered {type(value).__name__}, not a JSON object")
    return value


def _objects(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise ClientError(f"corral answered {type(value).__name__}, not a JSON list")
    return [_object(one) for one in value]


def _target(url: str) -> str:
    """One manager's address, checked: http(s)://HOST[:PORT][/PREFIX]."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (a port that is no number raises here)
    except ValueError as error:
        raise ClientError(f"CORRAL_URL: not a usable URL {url!r} ({error})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ClientError(f"CORRAL_URL: not a usable URL {url!r} (expected http://HOST:PORT)")
    return url.rstrip("/")


def _env_seconds(name: str, default: float) -> float:
    text = os.environ.get(name)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ClientError(f"{name}: not a number of seconds: {text!r}") from None
    if not value >= 0:
        raise ClientError(f"{name}: must be 0 or more, got {text!r}")
    return value


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


def _segment(job_id: str | int) -> str:
    """The job id as one path segment (an id such as '../tokens' must stay inside /jobs)."""
    return quote(str(job_id), safe="")


def _detail(response: _Reply) -> str:
    """The server's one-line reason for a refusal."""
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    if isinstance(detail, list) and detail and isinstance(detail[0], dict):
        # FastAPI's own validation of query parameters: [{"loc": [...], "msg": ...}, ...]
        first = detail[0]
        where = ".".join(str(part) for part in first.get("loc", [])[1:])
        detail = f"{where}: {first.get('msg', 'invalid')}" if where else first.get("msg")
    if not isinstance(detail, str) or not detail:
        text = response.text.strip().splitlines()
        detail = text[0] if text else response.reason_phrase
    return " ".join(str(detail).split()) or f"HTTP {response.status_code}"
