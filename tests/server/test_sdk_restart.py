"""The Python client and `corral logs -f` ride out a kill -9 and restart of a real `corral up`
(its own process, the local executor, the job's own processes running on through it)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.client import Client, JobStatus, JsonClient
from tests.server.helpers import WAIT_S, Corral, admin_token, kill_jobs_of, wait_until

#: How long the clients ride out the restart: a cold `corral up` on a loaded 2-core machine.
RIDE_OUT_S = 240.0

# Writes 20 lines, waits for the file `restarting`, writes 50 more, 0.05 s apart (while the
# manager is down or starting again), waits for the file `go`, writes 20 more and ends.
STAGED = (
    "import pathlib, sys, time\n"
    "gates = pathlib.Path(sys.argv[1])\n"
    "def until(name):\n"
    "    while not (gates / name).exists():\n"
    "        time.sleep(0.05)\n"
    "for i in range(20):\n"
    "    print(f'before {i}', flush=True)\n"
    "until('restarting')\n"
    "for i in range(50):\n"
    "    print(f'during {i} \\u00e9t\\u00e9', flush=True)\n"
    "    time.sleep(0.05)\n"
    "until('go')\n"
    "for i in range(20):\n"
    "    print(f'after {i}', flush=True)\n"
)
#: What the job writes, worked out by hand from STAGED: 90 lines in this order.
EXPECTED = (
    "".join(f"before {i}\n" for i in range(20))
    + "".join(f"during {i} \u00e9t\u00e9\n" for i in range(50))
    + "".join(f"after {i}\n" for i in range(20))
)


@pytest.fixture
def corral(tmp_path: Path) -> Iterator[Corral]:
    server = Corral(tmp_path / "corral", "--gpus", "1")
    try:
        yield server
    finally:
        try:
            server.stop()
        finally:
            kill_jobs_of(server.data_dir)


def stdout_of(corral: Corral, job_id: str) -> Path:
    return corral.data_dir / "jobs" / job_id / "attempt-1" / "rank-0.stdout"


def test_wait_and_logs_follow_ride_out_a_kill_9_and_restart(corral: Corral, tmp_path: Path) -> None:
    # The job runs through a kill -9 of its manager and the manager's restart on the same data
    # directory and port. An SDK wait() in a thread and a `corral logs -f` process, both
    # started before the kill, go on across it: the wait answers SUCCEEDED once the job ends,
    # and logs -f prints exactly EXPECTED, the 90 lines (each once, in order: its stream broke
    # at the kill and was opened again from the byte it had reached) and exits 0. Without the
    # tries (failover_s=0) the wait raises "cannot reach corral" at the kill; opening the
    # stream again from byte 0 prints lines twice, from the plain read's offset loses some.
    corral.start().close()
    token = admin_token(corral.data_dir)
    gates = tmp_path / "gates"
    gates.mkdir()
    client = Client(corral.url, token, failover_s=RIDE_OUT_S)
    spec = {"name": "staged", "gpus": 1, "command": [sys.executable, "-c", STAGED, str(gates)]}
    job_id = client.submit(spec).id
    log = stdout_of(corral, job_id)
    wait_until(lambda: log.exists() and "before 19\n" in log.read_text(), "the first lines")

    followed = tmp_path / "followed.txt"
    env = {
        **os.environ,
        "CORRAL_URL": corral.url,
        "CORRAL_TOKEN": token,
        "CORRAL_FAILOVER_S": str(RIDE_OUT_S),
    }
    with followed.open("wb") as out:
        follower = subprocess.Popen(
            [sys.executable, "-m", "corral.cli", "logs", "-f", job_id],
            stdout=out,
            stderr=subprocess.PIPE,
            env=env,
        )
    waited: dict[str, Any] = {}

    def wait_for_the_job() -> None:
        try:
            waited["job"] = client.wait(job_id, timeout=WAIT_S + RIDE_OUT_S, poll_s=0.1)
        except Exception as error:  # reported by the assertion below
            waited["error"] = error

    waiter = threading.Thread(target=wait_for_the_job)
    waiter.start()
    try:
        wait_until(lambda: "before 19\n" in followed.read_text(), "logs -f printing")
        (gates / "restarting").touch()
        wait_until(lambda: "during 3 " in log.read_text(), "the job writing on")
        corral.kill()  # mid-stream: the job writes on while the manager is down
        wait_until(lambda: "during 49 " in log.read_text(), "the job's lines while it is down")
        corral.start().close()  # the same data directory and port
        (gates / "go").touch()
        waiter.join(timeout=WAIT_S + RIDE_OUT_S)
        assert not waiter.is_alive()
        assert "error" not in waited, waited.get("error")
        assert waited["job"].status is JobStatus.SUCCEEDED
        _, errors = follower.communicate(timeout=WAIT_S)
        assert follower.returncode == 0, errors.decode()
    finally:
        (gates / "restarting").touch()
        (gates / "go").touch()
        if follower.poll() is None:
            follower.kill()
            follower.wait()
        waiter.join(timeout=WAIT_S)
        client.close()
    assert log.read_text() == EXPECTED  # the job itself wrote each line once
    assert followed.read_text() == EXPECTED


class LosesTheFirstSubmitAnswer(httpx.BaseTransport):
    """Sends each request; the first submission's answer is lost: the manager stored the job,
    then was killed (kill -9) before the client read the answer, and is started again while
    the client tries the submission again."""

    def __init__(self, corral: Corral) -> None:
        self.corral = corral
        self.inner = httpx.HTTPTransport()
        self.restarting: threading.Thread | None = None
        self.submissions: list[str] = []  # each try's Idempotency-Key

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if request.method == "POST" and request.url.path == "/api/v1/jobs":
            self.submissions.append(request.headers.get("Idempotency-Key", ""))
            if len(self.submissions) == 1:
                response.read()
                assert response.status_code == 201, response.text  # stored
                response.close()
                self.corral.kill()
                self.restarting = threading.Thread(target=lambda: self.corral.start().close())
                self.restarting.start()
                raise httpx.RemoteProtocolError("the manager died before answering")
        return response

    def close(self) -> None:
        self.inner.close()


def test_a_submission_whose_answer_was_lost_is_one_job_across_a_restart(
    corral: Corral,
) -> None:
    # The first try of a submission is stored (job 1), and its answer lost: the manager is
    # killed. The client tries again (the connection refused while the manager starts again,
    # then its answer) with the same Idempotency-Key: the restarted manager answers job 1,
    # and one job is stored. With a key drawn per try (or none) the retry stores job 2.
    corral.start().close()
    token = admin_token(corral.data_dir)
    transport = LosesTheFirstSubmitAnswer(corral)
    try:
        with Client(corral.url, token, failover_s=RIDE_OUT_S, transport=transport) as client:
            job = client.submit({"name": "once", "gpus": 1, "command": ["true"]})
        assert transport.restarting is not None
        transport.restarting.join(timeout=RIDE_OUT_S)
        with JsonClient(corral.url, token) as plain:
            assert [one["id"] for one in plain.jobs()] == ["1"]
        assert job.id == "1" and job.name == "once"
        assert len(transport.submissions) == 2  # the lost try and the answered one
        assert transport.submissions[0] == transport.submissions[1] != ""
    finally:
        if transport.restarting is not None:
            transport.restarting.join(timeout=RIDE_OUT_S)
