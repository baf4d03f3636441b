"""GET /api/v1/jobs/{id}/logs/stream (corral.server.logstream) and the asyncio client, against a
real manager (its API on 127.0.0.1, the local executor, the jobs' own processes)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from corral.client import AsyncClient, Client, ClientError, JobStatus, JsonClient
from corral.server import logstream
from corral.server.boot import RunningServer
from tests.server.helpers import (
    TWO_VCS,
    WAIT_S,
    admin_token,
    kill_jobs_of,
    start_server,
    wait_until,
)

# Writes 30 lines, each in three pieces 0.02 s apart (the second piece a 3-byte character, the
# stream's chunks may cut it), then ends: 30 * len("piece N: \u2192 end\n") bytes in all.
PIECES = (
    "import sys, time\n"
    "for i in range(30):\n"
    "    for part in (f'piece {i}: ', '\\u2192', ' end\\n'):\n"
    "        sys.stdout.write(part); sys.stdout.flush(); time.sleep(0.02)\n"
)
EXPECTED = "".join(f"piece {i}: \u2192 end\n" for i in range(30))
# Runs until its gate file exists.
GATED = (
    "import pathlib, sys, time\n"
    "print('waiting', flush=True)\n"
    "while not pathlib.Path(sys.argv[1]).exists():\n"
    "    time.sleep(0.05)\n"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    data_dir = tmp_path_factory.mktemp("corral-data")
    running = start_server(data_dir, gpus=2, config=TWO_VCS)
    try:
        yield running
    finally:
        running.stop()
        kill_jobs_of(data_dir)


@pytest.fixture(scope="module")
def tokens(server: RunningServer) -> dict[str, str]:
    with Client(server.url, admin_token(server.manager.data_dir)) as admin:
        return {
            "admin": admin_token(server.manager.data_dir),
            "alice": admin.create_token("alice", vc="a")["token"],
            "bob": admin.create_token("bob", vc="b")["token"],
        }


def http(server: RunningServer, token: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=server.url, headers=headers, timeout=httpx.Timeout(60.0))


def log_file(server: RunningServer, job_id: str) -> Path:
    return server.manager.attempt_dir(job_id, 1) / "rank-0.stdout"


def streams(server: RunningServer) -> logstream.Streams:
    found: logstream.Streams = server.server.config.app.state.log_streams
    return found


def test_the_stream_is_the_file_and_ends_when_the_log_is_final(
    server: RunningServer, tokens: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Streamed from byte 0 while the job writes: the bytes received are the file's, exactly
    # (EXPECTED, worked out from PIECES), and the stream ends by itself once the attempt's log
    # is final: the job has ended by then. The window is set to 10 minutes, so an end within
    # the read timeout (60 s of silence) is the final's. Read again from byte 100 after the
    # end, it is the file from there, and ends at once. A stream that never looked at the
    # attempt's end would run into the read timeout.
    monkeypatch.setattr(logstream, "WINDOW_S", 600.0)
    with Client(server.url, tokens["alice"]) as alice:
        job = alice.submit({"name": "pieces", "gpus": 1, "command": [sys.executable, "-c", PIECES]})
        wait_until(lambda: alice.job(job.id).attempts == 1, "the job's start")
    with http(server, tokens["alice"]) as client:
        received = b""
        with client.stream("GET", f"/api/v1/jobs/{job.id}/logs/stream?attempt=1") as response:
            assert response.status_code == 200, response.read()
            assert response.headers["X-Corral-Attempt"] == "1"
            assert response.headers["content-type"].startswith("text/plain")
            for data in response.iter_raw():
                received += data
        assert Client(server.url, tokens["alice"]).job(job.id).status is JobStatus.SUCCEEDED
        assert received == log_file(server, job.id).read_bytes() == EXPECTED.encode()
        began = time.monotonic()
        again = client.get(f"/api/v1/jobs/{job.id}/logs/stream", params={"offset": 100})
        assert again.status_code == 200
        assert again.content == EXPECTED.encode()[100:]
        assert time.monotonic() - began < 30  # (final already: no window's wait)


def test_only_those_who_may_read_the_job_stream_it(
    server: RunningServer, tokens: dict[str, str]
) -> None:
    # Alice's job (VC a): bob (VC b) is told it does not exist (404), as for its plain log;
    # no token is 401; a job that does not exist is 404; a bad offset is 422. The admin
    # streams it.
    with Client(server.url, tokens["alice"]) as alice:
        job = alice.submit({"name": "hers", "gpus": 1, "command": ["echo", "hello"]})
        alice.wait(job.id, timeout=WAIT_S)
    path = f"/api/v1/jobs/{job.id}/logs/stream"
    with http(server, tokens["bob"]) as bob:
        refused = bob.get(path)
        assert refused.status_code == 404 and refused.json()["detail"] == f"no job {job.id}"
        assert bob.get("/api/v1/jobs/999999/logs/stream").status_code == 404
    with http(server, None) as nobody:
        assert nobody.get(path).status_code == 401
    with http(server, tokens["admin"]) as admin:
        assert admin.get(path, params={"offset": -1}).status_code == 422
        assert admin.get(path).text == "hello\n"


def test_a_user_has_at_most_so_many_streams_and_a_closed_one_is_freed(
    server: RunningServer, tokens: dict[str, str], tmp_path: Path
) -> None:
    # A running job that writes nothing more: alice opens MAX_PER_USER (8) streams of its log;
    # a ninth is 429, while the admin may still open one. Alice's clients go away (their
    # connections closed, nothing read): the server's count of her streams falls back to 0
    # (each stream's task ended), and she may open one again.
    gate = tmp_path / "gate"
    with Client(server.url, tokens["alice"]) as alice:
        job = alice.submit(
            {"name": "quiet", "gpus": 1, "command": [sys.executable, "-c", GATED, str(gate)]}
        )
        wait_until(lambda: alice.job(job.id).status == "RUNNING", "the job's start")
    path = f"/api/v1/jobs/{job.id}/logs/stream"
    opened: list[httpx.Client] = []
    try:
        for _ in range(logstream.MAX_PER_USER):
            client = http(server, tokens["alice"])
            opened.append(client)
            response = client.send(client.build_request("GET", path), stream=True)
            assert response.status_code == 200
        wait_until(lambda: streams(server).count("alice") == logstream.MAX_PER_USER, "8 open")
        with http(server, tokens["alice"]) as ninth:
            with ninth.stream("GET", path) as refused:
                assert refused.status_code == 429
        with http(server, tokens["admin"]) as admin:
            with admin.stream("GET", path) as response:
                assert response.status_code == 200
        for client in opened:
            client.close()
        wait_until(lambda: streams(server).count("alice") == 0, "the closed streams freed")
        with http(server, tokens["alice"]) as again:
            with again.stream("GET", path) as response:
                assert response.status_code == 200
    finally:
        for client in opened:
            client.close()
        gate.touch()
    with Client(server.url, tokens["alice"]) as alice:
        assert alice.wait(job.id, timeout=WAIT_S).status is JobStatus.SUCCEEDED


class LosesTheFirstAnswer(httpx.AsyncBaseTransport):
    """The first submission reaches the manager (it stores the job); its answer is lost."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.keys: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.method == "POST" and request.url.path == "/api/v1/jobs":
            self.keys.append(request.headers.get("Idempotency-Key", ""))
            if len(self.keys) == 1:
                await response.aread()
                await response.aclose()
                raise httpx.ReadError("the connection broke before the answer")
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_the_async_client(server: RunningServer, tokens: dict[str, str]) -> None:
    # AsyncClient: a submission whose first answer is lost is tried again with its key and is
    # one job (the list of alice's jobs named `async` has one); follow_logs yields the log
    # exactly (EXPECTED); wait answers SUCCEEDED; cancel answers CANCELLED; jobs() lists typed
    # summaries; a job bob may not see is a one-line ClientError, 404. With a key drawn per
    # try, the list has two jobs.
    async def scenario() -> None:
        transport = LosesTheFirstAnswer()
        async with AsyncClient(server.url, tokens["alice"], transport=transport) as alice:
            spec = {"name": "async", "gpus": 1, "command": [sys.executable, "-c", PIECES]}
            job = await alice.submit(spec)
            mine = [one.id for one in await alice.jobs(user="alice") if one.name == "async"]
            assert mine == [job.id]
            assert len(transport.keys) == 2 and transport.keys[0] == transport.keys[1]
            text = "".join([piece async for piece in alice.follow_logs(job.id)])
            assert text == EXPECTED
            done = await alice.wait(job.id, timeout=WAIT_S)
            assert done.status is JobStatus.SUCCEEDED and done.attempt_history[0].exit_code == 0
            other = await alice.submit({"name": "stopped", "gpus": 1, "command": ["sleep", "600"]})
            assert (await alice.cancel(other.id)).status is JobStatus.CANCELLED
        async with AsyncClient(server.url, tokens["bob"]) as bob:
            with pytest.raises(ClientError) as refused:
                await bob.job(job.id)
            assert refused.value.status == 404 and str(refused.value) == f"no job {job.id}"

    asyncio.run(scenario())


def test_follow_reads_on_where_no_stream_is_granted(
    server: RunningServer, tokens: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # With no stream granted (at most 0 per user: every stream is 429), follow_logs reads on
    # by plain reads, `poll_s` apart: both clients (JsonClient on http.client, Client on
    # httpx) yield EXPECTED exactly. A client that took the 429 for a refusal would raise it.
    monkeypatch.setattr(logstream, "MAX_PER_USER", 0)
    spec = {"name": "polled", "gpus": 1, "command": [sys.executable, "-c", PIECES]}
    for kind in (Client, JsonClient):
        with kind(server.url, tokens["alice"]) as alice:
            job_id = alice.submit(spec)["id"]
            assert "".join(alice.follow_logs(job_id, poll_s=0.1)) == EXPECTED
