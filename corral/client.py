"""The Python SDK over corral's REST API (/api/v1).

    from corral.client import Client

    with Client() as corral:                  # CORRAL_URL and CORRAL_TOKEN from the environment
        job = corral.submit("job.yaml")
        for text in corral.follow_logs(job["id"]):
            print(text, end="")
        print(corral.wait(job["id"], timeout=600)["status"])

Every refusal is a ClientError whose message is one line: the server's own `detail` (e.g.
``gpus: must be a positive integer``), or what went wrong reaching it.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

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
#: With several managers listed, how long a request is tried again across a failover.
FAILOVER_S = 60.0
#: The pause after every listed manager was tried once in vain.
FAILOVER_PAUSE_S = 0.25


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


@dataclass(slots=True)
class Response:
    """An answer of the server: status, headers (case-insensitive), body."""

    status_code: int
    reason_phrase: str
    headers: Mapping[str, str]
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.content)


class Client:
    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        timeout: float = 30,
        *,
        failover_s: float | None = None,
    ) -> None:
        """`url` (default: CORRAL_URL): one manager's address, or several separated by commas
        (an active manager and its standbys, docs/ha.md): requests go to the one that leads,
        and across a failover they are tried again, on each listed manager in turn and where a
        standby says the leader is, for up to `failover_s` seconds (default: CORRAL_FAILOVER_S,
        else FAILOVER_S). Only requests that may be repeated are tried again once they were
        sent: reads, submissions (each carries an idempotency key: a repeated one stores one
        job) and cancels; any request a manager refused with 503 (it changed nothing)."""
        given = url or os.environ.get("CORRAL_URL") or DEFAULT_URL
        urls = [part.strip().rstrip("/") for part in given.split(",") if part.strip()]
        token = token if token is not None else os.environ.get("CORRAL_TOKEN", "")
        self._headers = {"Authorization": f"Bearer {token.strip()}"} if token.strip() else {}
        self.timeout = timeout
        # http.client, not httpx: a CLI call imports it in a few ms (httpx took 120 ms and
        # 60 ms more to set up its client); one keep-alive connection serves every request.
        self._targets = [_target(one) for one in urls or [DEFAULT_URL]]
        self.urls = [target[0] for target in self._targets]
        if failover_s is None:
            failover_s = _env_seconds("CORRAL_FAILOVER_S", FAILOVER_S)
        self.failover_s = failover_s
        self._connection: http.client.HTTPConnection | None = None
        self._use(0)

    def _use(self, index: int) -> None:
        """Send to the `index`th listed manager from now on."""
        self.close()
        self._at = index
        self.url, self._scheme, self._host, self._port, self._prefix = self._targets[index]

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- jobs ---------------------------------------------------------------------------------

    def submit(self, spec: dict[str, Any] | str | Path, *, source: str | None = None) -> dict:
        """Submit a job spec (a mapping, or a YAML/JSON file's path) -> the job's summary.
        Refusals of a file's spec name the file (`source` names it for a mapping). A spec with
        `env_from: submitter` and no `submitter_env` gets this process's environment there, less
        what corral.submitenv keeps back (corral's credentials, secrets, the login session)."""
        if isinstance(spec, str | Path):
            source = source or str(spec)
            spec = load_spec_file(spec)
        if str(spec.get("env_from", "")).lower() == "submitter" and "submitter_env" not in spec:
            from corral.submitenv import submitter_environment

            spec = {**spec, "submitter_env": submitter_environment()}  # (less corral's secrets)
        key = {IDEMPOTENCY_HEADER: uuid.uuid4().hex}  # a retry stores no second job
        try:
            return self._request("POST", "/jobs", json=spec, headers=key)
        except ClientError as error:
            if source and error.status in (403, 422):  # a field of the spec was refused
                raise ClientError(f"{source}: {error.message}", error.status) from None
            raise

    def jobs(
        self,
        status: str | None = None,
        vc: str | None = None,
        user: str | None = None,
        limit: int | None = None,
        name: str | None = None,
    ) -> list[dict]:
        """Jobs newest first (a user sees their own and their VC's), filtered by the server:
        the first `limit`, or (None) all of them, read a page at a time."""
        found: list[dict] = []
        before: str | None = None
        while limit is None or len(found) < limit:
            page = PAGE_SIZE if limit is None else min(PAGE_SIZE, limit - len(found))
            params = {
                "status": status,
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

    def queue(self, limit: int = 100) -> dict:
        """The waiting jobs in the scheduler's order: {"total": how many wait, "jobs": the
        first `limit` of them (summaries, whose `reason` says why each waits)}."""
        return self._request("GET", "/queue", params={"limit": limit})

    def job(self, job_id: str | int) -> dict:
        """One job's detail: the summary plus spec, attempts, events."""
        return self._request("GET", f"/jobs/{_segment(job_id)}")

    def cancel(self, job_id: str | int, *, array: bool = False) -> dict:
        """Cancel the job; `array`: every unfinished task of the array `job_id` names."""
        params = {"array": "true"} if array else None
        return self._request("POST", f"/jobs/{_segment(job_id)}/cancel", params=params)

    def hold(self, job_id: str | int, *, array: bool = False) -> dict:
        """Keep a pending job (or every task of an array) from starting until released."""
        params = {"array": "true"} if array else None
        return self._request("POST", f"/jobs/{_segment(job_id)}/hold", params=params)

    def release(self, job_id: str | int, *, array: bool = False) -> dict:
        """Let a held job (or every task of an array) start again."""
        params = {"array": "true"} if array else None
        return self._request("POST", f"/jobs/{_segment(job_id)}/release", params=params)

    def cancel_jobs(self, **where: Any) -> dict:
        """Cancel every unfinished job a filter selects, in one call and one transaction:
        `state` (PENDING, RUNNING or a list of them), `user`, `vc`, `name` (a shell glob,
        `sweep-*`); at least one. Users select only their own jobs. {"count", "ids"}."""
        return self._bulk("cancel", where)

    def hold_jobs(self, **where: Any) -> dict:
        """Hold every pending job a filter selects (as `cancel_jobs`): {"count", "ids"}."""
        return self._bulk("hold", where)

    def release_jobs(self, **where: Any) -> dict:
        """Release every held job a filter selects (as `cancel_jobs`): {"count", "ids"}."""
        return self._bulk("release", where)

    def _bulk(self, verb: str, where: Mapping[str, Any]) -> dict:
        body = {key: value for key, value in where.items() if value not in (None, (), [])}
        if isinstance(body.get("state"), tuple):
            body["state"] = list(body["state"])
        return self._request("POST", f"/jobs/{verb}", json=body)

    def requeue(self, job_id: str | int) -> dict:
        """Stop a running job and queue it again, or queue a failed or cancelled job again."""
        return self._request("POST", f"/jobs/{_segment(job_id)}/requeue")

    def wait(self, job_id: str | int, timeout: float, poll_s: float = POLL_SECONDS) -> dict:
        """The job's detail once it has ended (SUCCEEDED, FAILED, CANCELLED or REFUSED);
        ClientError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job["status"] in FINAL_STATUSES:
                return job
            if time.monotonic() >= deadline:
                raise ClientError(f"job {job_id} is still {job['status']} after {timeout:g} s")
            time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))

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
        params: dict[str, Any] = {"rank": rank, "stream": stream}
        if tail is None:
            params["offset"] = offset
        else:
            params["tail"] = tail
        if attempt is not None:
            params["attempt"] = attempt
        response = self._send("GET", f"/jobs/{_segment(job_id)}/logs", params=params)
        headers = response.headers
        return LogChunk(
            text=response.text,
            next_offset=int(headers.get("X-Corral-Offset", offset + len(response.content))),
            finished=headers.get("X-Corral-Finished", "true") == "true",
            attempt=int(headers.get("X-Corral-Attempt", attempt or 0)),
        )

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
        lines of the attempt rather than its beginning."""
        current = attempt
        offset = 0
        ends_line = True
        while True:
            chunk = self.log_chunk(job_id, current, rank, stream, offset, tail)
            tail = None  # only the first read: from there on, the offset
            if chunk.text:
                yield chunk.text
                ends_line = chunk.text.endswith("\n")
                offset = chunk.next_offset
            if current is None and chunk.attempt:
                current = chunk.attempt  # stay on it: a later attempt gets a separator
            if not chunk.finished:
                if not chunk.text:
                    time.sleep(poll_s)
                continue
            if chunk.text:
                continue  # read once more to be sure nothing is left
            if attempt is not None or current is None:
                return  # the attempt asked for is over, or the job ended before starting
            latest = self.log_chunk(job_id, None, rank, stream, 0).attempt
            if latest <= current:
                return  # the job ended with this attempt
            current, offset = latest, 0
            yield ("" if ends_line else "\n") + f"--- attempt {latest} ---\n"
            ends_line = True

    # -- cluster and auth ---------------------------------------------------------------------

    def vcs(self) -> list[dict]:
        """Virtual clusters: name, guaranteed_gpus, allocated_gpus, pending, running."""
        return self._request("GET", "/vcs")

    def cluster(self) -> dict:
        """Nodes and their GPUs (with the job holding each), and the VCs."""
        return self._request("GET", "/cluster")

    def nodes(self) -> list[dict]:
        """Every node: state (up, draining, drained, down), reason, by, since, GPUs, jobs."""
        return self._request("GET", "/nodes")

    def drain_node(self, node: str, reason: str, *, preempt: bool = False) -> dict:
        """Drain a node (admins only): nothing new starts on it; with `preempt` its jobs are
        preempted (checkpoint) and queued again, else they finish."""
        return self._request(
            "POST", f"/nodes/{_segment(node)}/drain", json={"reason": reason, "preempt": preempt}
        )

    def resume_node(self, node: str) -> dict:
        """Bring a drained node back (admins only)."""
        return self._request("POST", f"/nodes/{_segment(node)}/resume")

    def reservations(self) -> list[dict]:
        """Every reservation: name, start, end, duration, gpus, users, vcs, state, by."""
        return self._request("GET", "/reservations")

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
    ) -> dict:
        """Reserve `gpus` GPUs or the `nodes` from `start` (the manager's clock, seconds) for
        `duration` seconds for these users and VCs (admins only)."""
        body: dict = {"name": name, "start": start, "duration": duration}
        body |= {"users": users or [], "vcs": vcs or []}
        body |= {"gpus": gpus} if gpus is not None else {"nodes": nodes or []}
        return self._request("POST", "/reservations", json=body)

    def delete_reservation(self, name: str) -> dict:
        """Delete a reservation (admins only)."""
        return self._request("DELETE", f"/reservations/{_segment(name)}")

    def profiles(self) -> list[dict]:
        """Measured throughput per VC, model and placement shape (steps/s): {model, gpu_type,
        gpus, nodes, colocated, vc, shared, steps_per_s, samples_per_s, seconds, runs,
        updated_at}; a user sees their VC's, the shared models' and those of no VC."""
        return self._request("GET", "/profiles")

    def shared_models(self) -> list[dict]:
        """The models marked shared: {model, marked_by, marked_at}."""
        return self._request("GET", "/profiles/shared")

    def share_model(self, model: str, shared: bool = True) -> dict:
        """Mark `model` shared, or with `shared=False` not (admins only): {model, shared,
        changed}."""
        return self._request(
            "POST", "/profiles/share" if shared else "/profiles/unshare", json={"model": model}
        )

    def scheduler_config(self) -> dict:
        """The scheduler config the manager runs with: {"scheduler": {...}}."""
        return self._request("GET", "/config")

    def create_token(
        self,
        user: str,
        vc: str | None = None,
        admin: bool = False,
        *,
        unix_user: str | None = None,
        expires_in: float | None = None,
    ) -> dict:
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
        return self._request("POST", "/tokens", json=body)

    def tokens(self) -> list[dict]:
        """Every token (admins only), oldest first: {id, user, vc, admin, unix_user, name,
        created_at, expires_at, revoked_at, state}; never a secret."""
        return self._request("GET", "/tokens")

    def revoke_token(self, token_id: str) -> dict:
        """Revoke one token by its id (admins only); returns it as listed."""
        return self._request("DELETE", f"/tokens/{_segment(token_id)}")

    def revoke_user_tokens(self, user: str) -> list[dict]:
        """Revoke every token of `user` (admins only); returns those revoked now."""
        return self._request("POST", "/tokens/revoke", json={"user": user})["revoked"]

    def export(self, name: str) -> dict:
        """The job history as `corral export-trace` writes it (admins only): {"files": {file
        name: text}, "format", "written", "never_ran", ...}; `name` is the trace's file name,
        NAME.corral.jsonl or NAME.csv (Helios's format), and names the files beside it."""
        return self._request("GET", "/export", params={"name": name})

    def whoami(self) -> dict:
        return self._request("GET", "/whoami")

    def usage(self, since: float, until: float | None = None, by: str = "user") -> dict:
        """GPU-hours, jobs and queueing per user (`by="vc"`: per VC) in [since, until) (epoch
        seconds; until: now): {since, until, by, rows, total} (docs/server.md, usage)."""
        params: dict[str, Any] = {"since": since, "by": by}
        if until is not None:
            params["until"] = until
        return self._request("GET", "/usage", params=params)

    # -- HTTP ---------------------------------------------------------------------------------

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._send(method, path, **kwargs).json()

    def _send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        target_path = "/api/v1" + path
        if params:
            target_path += "?" + urlencode({k: v for k, v in params.items() if v is not None})
        sent_headers = dict(self._headers)
        if headers:
            sent_headers.update(headers)
        body = None
        if json is not None:
            body = _json_bytes(json)
            sent_headers["Content-Type"] = "application/json"
        repeatable = method == "GET" or _repeatable(method, path, sent_headers)
        deadline: float | None = None
        tried: set[int] = set()
        while True:
            problem: ClientError
            try:
                response = self._exchange(method, self._prefix + target_path, body, sent_headers)
            except (ConnectionRefusedError, socket.gaierror):  # nothing was sent
                problem = ClientError(
                    f"cannot reach corral at {self.url}: is `corral up` running? (CORRAL_URL)"
                )
                sent = False
            except ConnectionError:
                problem = ClientError(
                    f"cannot reach corral at {self.url}: is `corral up` running? (CORRAL_URL)"
                )
                sent = True
            except TimeoutError:
                problem = ClientError(
                    f"corral at {self.url} did not answer within {self.timeout:g} s"
                )
                sent = True
            except (OSError, http.client.HTTPException) as error:
                problem = ClientError(f"corral at {self.url}: {error or type(error).__name__}")
                sent = True
            else:
                if response.status_code < 400:
                    return response
                problem = ClientError(_detail(response), response.status_code)
                if (
                    response.status_code != 503
                    or len(self._targets) == 1
                    and not (response.headers.get(LEADER_HEADER))
                ):
                    raise problem
                sent = False  # a 503 changed nothing: the call may be repeated
                leader = response.headers.get(LEADER_HEADER)
                if leader and leader.rstrip("/") != self.url:
                    if deadline is None:
                        deadline = time.monotonic() + self.failover_s
                    if time.monotonic() < deadline and self._follow(leader.rstrip("/")):
                        continue
            if len(self._targets) == 1 or (sent and not repeatable):
                raise problem from None
            if deadline is None:
                deadline = time.monotonic() + self.failover_s
            if time.monotonic() >= deadline:
                raise problem from None
            tried.add(self._at)
            if len(tried) >= len(self._targets):  # each was tried: wait a little, then again
                tried.clear()
                time.sleep(FAILOVER_PAUSE_S)
            self._use((self._at + 1) % len(self._targets))

    def _follow(self, leader: str) -> bool:
        """Go to the leader a standby named; False for an address that is no usable URL."""
        for index, target in enumerate(self._targets):
            if target[0] == leader:
                self._use(index)
                return True
        try:
            self._targets.append(_target(leader))
        except ClientError:
            return False
        self.urls.append(leader)
        self._use(len(self._targets) - 1)
        return True

    def _exchange(
        self, method: str, target: str, body: bytes | None, headers: dict[str, str]
    ) -> Response:
        """One request on the kept-alive connection; once more on a fresh connection when the
        server had closed the old one meanwhile (nothing was sent then)."""
        for retry in (True, False):
            reused = self._connection is not None
            connection = self._connection or self._connect()
            self._connection = connection
            try:
                connection.request(method, target, body=body, headers=headers)
                answer = connection.getresponse()
                content = answer.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                if reused and retry:
                    continue
                raise
            except BaseException:
                self.close()
                raise
            if answer.will_close:
                self.close()
            return Response(answer.status, answer.reason, answer.headers, content)
        raise AssertionError("unreachable")

    def _connect(self) -> http.client.HTTPConnection:
        if self._scheme == "https":
            return http.client.HTTPSConnection(self._host, self._port, timeout=self.timeout)
        return http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)


def _target(url: str) -> tuple[str, str, str, int | None, str]:
    """(url, scheme, host, port, path prefix) of one manager's address."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        raise ClientError(f"CORRAL_URL: not a usable URL {url!r} ({error})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ClientError(f"CORRAL_URL: not a usable URL {url!r} (expected http://HOST:PORT)")
    return url, parts.scheme, parts.hostname, port, parts.path.rstrip("/")


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


def _repeatable(method: str, path: str, headers: Mapping[str, str]) -> bool:
    """Whether a request sent once may be sent again with the same effect: a submission with
    its idempotency key, a cancel."""
    if method != "POST":
        return False
    if path == "/jobs":
        return IDEMPOTENCY_HEADER in headers
    return path.startswith("/jobs/") and path.endswith("/cancel")


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


def _segment(job_id: str | int) -> str:
    """The job id as one path segment (an id such as '../tokens' must stay inside /jobs)."""
    return quote(str(job_id), safe="")


def _detail(response: Response) -> str:
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
    return " ".join(detail.split()) or f"HTTP {response.status_code}"
