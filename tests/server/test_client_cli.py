"""The client commands and the Python SDK end to end: a real server on 127.0.0.1 (SQLite file,
local executor, 4 declared GPUs) running real job processes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from corral.cli.main import app
from corral.client import Client, ClientError
from corral.server.boot import RunningServer
from tests.server.helpers import (
    TWO_VCS,
    WAIT_S,
    admin_token,
    alive,
    kill_jobs_of,
    start_server,
    wait_until,
)

LIVE = ("PENDING", "RUNNING")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    data_dir = tmp_path_factory.mktemp("corral-data")
    running = start_server(data_dir, gpus=4)
    try:
        yield running
    finally:
        try:
            with Client(running.url, admin_token(data_dir)) as admin:
                for job in admin.jobs(status="RUNNING") + admin.jobs(status="PENDING"):
                    admin.cancel(job["id"])
        finally:
            running.stop()
            kill_jobs_of(data_dir)


@pytest.fixture(scope="module")
def admin_client(server: RunningServer) -> Iterator[Client]:
    with Client(server.url, admin_token(server.manager.data_dir), timeout=30) as client:
        yield client


@pytest.fixture(autouse=True)
def idle_cluster(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test starts on an idle cluster: what one leaves running is cancelled after it, and
    the next waits until those processes have let go of their GPUs."""
    uses_server = "server" in request.fixturenames
    admin: Client | None = request.getfixturevalue("admin_client") if uses_server else None
    yield
    if admin is None:
        return
    for job in admin.jobs():
        if job["status"] in LIVE:
            admin.cancel(job["id"])
    deadline = time.monotonic() + WAIT_S
    while any(gpu["job"] for node in admin.cluster()["nodes"] for gpu in node["gpus"]):
        assert time.monotonic() < deadline, "GPUs still held after cancelling every job"
        time.sleep(0.05)


def cli(server: RunningServer, *args: str, token: str | None = "admin") -> Result:
    """`corral ARGS` in-process with CORRAL_URL/CORRAL_TOKEN set as a user's shell would."""
    if token == "admin":
        token = admin_token(server.manager.data_dir)
    env = {"CORRAL_URL": server.url, "CORRAL_TOKEN": token}
    return CliRunner().invoke(app, list(args), env=env)


def write_spec(path: Path, **spec: object) -> Path:
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def wait_status(client: Client, job_id: str, statuses: tuple[str, ...], timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while True:
        job = client.job(job_id)
        if job["status"] in statuses:
            return job
        assert time.monotonic() < deadline, f"job {job_id} still {job['status']}"
        time.sleep(0.05)


def one_error_line(result: Result) -> str:
    """A refusal: exit code 1, nothing on stdout, one line on stderr, no traceback."""
    assert result.exit_code == 1, (result.exit_code, result.output)
    assert result.stdout == ""
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0].removeprefix("error: ")


# -- submit, ls, describe, logs -----------------------------------------------------------------


def test_submit_prints_the_id_and_the_job_runs_in_the_cwd(
    server: RunningServer, admin_client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    work = tmp_path / "project"
    work.mkdir()
    monkeypatch.chdir(work)
    write_spec(
        work / "job.yaml",
        name="hello",
        gpus=2,
        command='echo "hello $CORRAL_JOB_ID on $CUDA_VISIBLE_DEVICES"; pwd -P',
    )
    result = cli(server, "submit", "job.yaml")
    assert result.exit_code == 0, result.output
    assert re.fullmatch(r"\d+\n", result.stdout), result.stdout  # the id alone: ID=$(...)
    job_id = result.stdout.strip()

    job = admin_client.wait(job_id, timeout=WAIT_S)
    assert (job["status"], job["exit_code"], job["gpus"]) == ("SUCCEEDED", 0, 2)
    assert job["spec"]["workdir"] == str(work)  # the CLI sets the submitter's cwd

    logs = cli(server, "logs", job_id)
    assert logs.exit_code == 0, logs.output
    first, second = logs.stdout.splitlines()
    devices = re.fullmatch(rf"hello {job_id} on (\d),(\d)", first)
    assert devices and devices.group(1) != devices.group(2)
    assert {int(d) for d in devices.groups()} <= {0, 1, 2, 3}
    assert second == str(work.resolve())


def test_submit_and_ls_as_separate_processes(server: RunningServer, tmp_path: Path):
    """The shell's way: a real `python -m corral.cli` with CORRAL_URL and CORRAL_TOKEN."""
    spec = write_spec(tmp_path / "quick.json", name="quick", gpus=1, command=["true"])
    env = {
        **os.environ,
        "CORRAL_URL": server.url,
        "CORRAL_TOKEN": admin_token(server.manager.data_dir),
    }
    corral = [sys.executable, "-m", "corral.cli"]
    submitted = subprocess.run(
        [*corral, "submit", str(spec)], env=env, capture_output=True, text=True, timeout=120
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    assert job_id.isdigit() and submitted.stdout == job_id + "\n"
    listed = subprocess.run(
        [*corral, "ls", "-o", "json"], env=env, capture_output=True, text=True, timeout=120
    )
    assert listed.returncode == 0, listed.stderr
    jobs = json.loads(listed.stdout)  # nothing but JSON on stdout
    assert jobs[0]["id"] == job_id and jobs[0]["name"] == "quick"


def test_ls_json_has_the_fields_and_filters(
    server: RunningServer, admin_client: Client, tmp_path: Path
):
    done = admin_client.submit({"name": "ls-done", "gpus": 1, "command": "true"})["id"]
    admin_client.wait(done, timeout=WAIT_S)
    running = admin_client.submit({"name": "ls-running", "gpus": 3, "command": "sleep 30"})["id"]
    wait_status(admin_client, running, ("RUNNING",))

    result = cli(server, "ls", "-o", "json")
    assert result.exit_code == 0, result.output
    jobs = json.loads(result.stdout)
    ids = [int(job["id"]) for job in jobs]
    assert ids == sorted(ids, reverse=True)  # newest first
    by_id = {job["id"]: job for job in jobs}
    assert {k: by_id[running][k] for k in ("id", "name", "vc", "status", "gpus")} == {
        "id": running,
        "name": "ls-running",
        "vc": "default",
        "status": "RUNNING",
        "gpus": 3,
    }
    assert len(by_id[running]["placement"]) == 3
    assert by_id[done]["status"] == "SUCCEEDED" and by_id[done]["placement"] == []

    only_running = json.loads(cli(server, "ls", "--status", "running", "-o", "json").stdout)
    assert [job["id"] for job in only_running] == [running]
    assert json.loads(cli(server, "ls", "--user", "nobody", "-o", "json").stdout) == []
    assert json.loads(cli(server, "ls", "--vc", "default", "--all", "-o", "json").stdout)

    table = cli(server, "ls")
    assert table.exit_code == 0, table.output
    header, *rows = table.stdout.splitlines()
    assert header.split() == [
        "ID",
        "NAME",
        "USER",
        "VC",
        "STATUS",
        "GPUS",
        "AGE",
        "PROGRESS",
        "ETA",
        "REASON",
    ]
    row = next(r for r in rows if r.split()[0] == running)
    assert row.split()[1:6] == ["ls-running", "admin", "default", "RUNNING", "3"]

    assert cli(server, "ls", "-o", "xml").exit_code == 2  # a usage error
    assert cli(server, "ls", "--status", "sleeping").exit_code == 2


def test_describe_says_why_a_job_waits_then_shows_its_attempts(
    server: RunningServer, admin_client: Client
):
    blocker = admin_client.submit(
        {"name": "blocker", "gpus": 4, "command": "sleep 30", "grace_seconds": 0.5}
    )["id"]
    wait_status(admin_client, blocker, ("RUNNING",))
    waiter = admin_client.submit({"name": "waiter", "gpus": 1, "command": "echo waited"})["id"]
    # a scheduling round gave it its place: it stays pending, all 4 GPUs are busy
    wait_until(
        lambda: "waiting for free GPUs" in admin_client.job(waiter)["reason"],
        "the waiter's place in the queue",
    )

    pending = cli(server, "describe", waiter)
    assert pending.exit_code == 0, pending.output
    why = [line for line in pending.stdout.splitlines() if line.startswith("Why pending:")]
    assert len(why) == 1 and "waiting for free GPUs" in why[0], pending.stdout
    assert "Status:     PENDING" in pending.stdout
    assert admin_client.job(waiter)["reason"] in why[0]

    running = cli(server, "describe", blocker).stdout
    placement = re.search(r"Placement:\s+(.*)", running)
    assert placement and len(placement.group(1).split(", ")) == 4
    assert re.search(r"^\s*1\s+\S+\s+\d\d:\d\d:\d\d\s+running\s", running, re.M), running
    assert "Why pending" not in running

    admin_client.cancel(blocker)
    assert admin_client.wait(waiter, timeout=WAIT_S)["status"] == "SUCCEEDED"
    detail = json.loads(cli(server, "describe", waiter, "-o", "json").stdout)
    assert [a["outcome"] for a in detail["attempt_history"]] == ["succeeded"]
    assert {"submitted", "started", "succeeded"} <= {e["kind"] for e in detail["events"]}
    finished = cli(server, "describe", waiter).stdout
    assert "Reason: succeeded" in finished and "Exit code:  0" in finished
    assert re.search(r"^\s*1\s.*\bended\s+succeeded\s+0\b", finished, re.M), finished
    events = finished.split("Events", 1)[1]
    assert events.index("submitted") < events.index("started") < events.index("succeeded")

    missing = one_error_line(cli(server, "describe", "9999"))
    assert missing == "no job 9999"


def test_logs_follow_until_the_job_ends(
    server: RunningServer, admin_client: Client, tmp_path: Path
):
    code = (
        "import os, sys, time\n"
        "rank = os.environ['RANK']\n"
        "for i in range(4):\n"
        "    print(f'rank {rank} line {i}', flush=True)\n"
        "    time.sleep(0.15)\n"
        "print(f'warning from {rank}', file=sys.stderr)\n"
    )
    spec = {"name": "chatty", "gpus": 2, "workers": 2, "command": [sys.executable, "-c", code]}
    job_id = admin_client.submit(spec)["id"]

    followed = cli(server, "logs", "-f", job_id)
    assert followed.exit_code == 0, followed.output
    assert followed.stdout == "".join(f"rank 0 line {i}\n" for i in range(4))
    # -f returns only once the job is over, having read every line
    assert admin_client.job(job_id)["status"] == "SUCCEEDED"

    rank1 = cli(server, "logs", job_id, "--rank", "1")
    assert rank1.stdout == "".join(f"rank 1 line {i}\n" for i in range(4))
    assert cli(server, "logs", job_id, "--stderr").stdout == "warning from 0\n"
    assert cli(server, "logs", job_id, "--rank", "5").stdout == ""  # no such worker: no output

    text, offset, finished = admin_client.logs(job_id, offset=len("rank 0 line 0\n"))
    assert text.startswith("rank 0 line 1\n") and finished
    assert offset == len(followed.stdout)
    assert admin_client.logs(job_id, offset=offset) == ("", offset, True)


def test_follow_moves_on_to_the_retry(admin_client: Client, server: RunningServer):
    # The first attempt fails (after printing without a newline); the retry succeeds.
    marker = '"$CORRAL_CHECKPOINT_DIR/tried"'
    command = (
        f"sleep 0.3; if [ -f {marker} ]; then echo second; "
        f"else touch {marker}; printf first; exit 3; fi"
    )
    spec = {"name": "flaky", "gpus": 1, "max_retries": 1, "command": command}
    job_id = admin_client.submit(spec)["id"]
    text = "".join(admin_client.follow_logs(job_id, poll_s=0.1))
    assert text == "first\n--- attempt 2 ---\nsecond\n"
    job = admin_client.job(job_id)
    assert (job["status"], job["failures"]) == ("SUCCEEDED", 1)
    assert [(a["outcome"], a["exit_code"]) for a in job["attempt_history"]] == [
        ("failed", 3),
        ("succeeded", 0),
    ]
    assert "".join(admin_client.follow_logs(job_id, attempt=1)) == "first"
    assert cli(server, "logs", job_id, "--attempt", "1").stdout == "first"
    assert one_error_line(cli(server, "logs", job_id, "--attempt", "3")) == (
        f"job {job_id} has no attempt 3 (it had 2)"
    )


# -- cancel -------------------------------------------------------------------------------------


def test_cancel_a_running_job_ends_its_processes(
    server: RunningServer, admin_client: Client, tmp_path: Path
):
    pid_file = tmp_path / "pid"
    spec = write_spec(
        tmp_path / "sleepy.yaml",
        name="sleepy",
        gpus=2,
        grace_seconds=0.5,
        command=f"echo $$ > {pid_file}; exec sleep 30",
    )
    job_id = cli(server, "submit", str(spec)).stdout.strip()
    wait_status(admin_client, job_id, ("RUNNING",))
    deadline = time.monotonic() + WAIT_S
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline, "the job never wrote its pid"
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    assert alive(pid)

    result = cli(server, "cancel", job_id)
    assert (result.exit_code, result.stdout) == (0, f"job {job_id} cancelled\n"), result.output
    job = admin_client.job(job_id)
    assert (job["status"], job["reason"]) == ("CANCELLED", "cancelled by request")
    deadline = time.monotonic() + WAIT_S
    while alive(pid):
        assert time.monotonic() < deadline, "the cancelled job's process is still alive"
        time.sleep(0.05)
    again = cli(server, "cancel", job_id)  # cancelling twice is harmless
    assert again.exit_code == 0, again.output

    done = admin_client.submit({"name": "done", "gpus": 1, "command": "true"})["id"]
    admin_client.wait(done, timeout=WAIT_S)
    assert one_error_line(cli(server, "cancel", done)) == (
        f"job {done} already ended (SUCCEEDED); nothing to cancel"
    )
    assert one_error_line(cli(server, "cancel", "424242")) == "no job 424242"


# -- refusals -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"name": "bad", "gpus": 0, "command": "true"}, "gpus: must be a positive integer"),
        (
            {"name": "bad", "gpus": 4, "workers": 3, "command": "true"},
            "workers: must divide gpus (3 does not divide 4)",
        ),
        ({"name": "bad", "gpus": 1, "command": "true", "colour": "red"}, "colour: unknown field"),
        ({"name": "bad", "gpus": 1}, "command: field required"),
        # refused by the server, not by the file's validation: still named after the file
        ({"name": "bad", "gpus": 1, "vc": "nope", "command": "true"}, "vc: unknown VC 'nope'"),
    ],
)
def test_a_bad_spec_is_refused_and_nothing_is_stored(
    server: RunningServer,
    admin_client: Client,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    spec: dict,
    message: str,
):
    monkeypatch.chdir(tmp_path)
    write_spec(tmp_path / "job.yaml", **spec)
    before = admin_client.jobs()
    error = one_error_line(cli(server, "submit", "job.yaml"))
    assert error.startswith(f"job.yaml: {message}"), error
    assert admin_client.jobs() == before


def test_a_job_larger_than_the_cluster_is_refused(
    server: RunningServer, admin_client: Client, tmp_path: Path
):
    spec = write_spec(tmp_path / "huge.yaml", name="huge", gpus=8, command="true")
    before = admin_client.jobs()
    error = one_error_line(cli(server, "submit", str(spec)))
    assert error.startswith(f"{spec}: gpus: ") and "8" in error, error
    assert admin_client.jobs() == before
    # no id was used up: the next job gets the next number
    after = admin_client.submit({"name": "next", "gpus": 1, "command": "true"})["id"]
    assert int(after) == max((int(job["id"]) for job in before), default=0) + 1


def test_a_missing_or_broken_file_is_named(server: RunningServer, tmp_path: Path):
    missing = one_error_line(cli(server, "submit", str(tmp_path / "nope.yaml")))
    assert missing.startswith(f"{tmp_path / 'nope.yaml'}: cannot read the file")
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    assert one_error_line(cli(server, "submit", str(broken))).startswith(f"{broken}: ")
    assert cli(server, "submit").exit_code == 2  # no FILE: a usage error


def test_unreachable_server_is_one_line(tmp_path: Path):
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with Client(url, "x") as client, pytest.raises(ClientError) as caught:
        client.jobs()
    assert caught.value.status is None
    assert str(caught.value) == (
        f"cannot reach corral at {url}: is `corral up` running? (CORRAL_URL)"
    )
    result = CliRunner().invoke(app, ["ls"], env={"CORRAL_URL": url, "CORRAL_TOKEN": "x"})
    assert one_error_line(result) == str(caught.value)


# -- auth ---------------------------------------------------------------------------------------


def test_tokens_and_who_may_do_what(server: RunningServer, admin_client: Client):
    for token in (None, "not-a-token"):
        refused = one_error_line(cli(server, "ls", token=token))
        assert refused.startswith("a valid token is needed"), refused
    with Client(server.url, "") as anonymous, pytest.raises(ClientError) as caught:
        anonymous.whoami()
    assert caught.value.status == 401

    created = cli(server, "token", "create", "alice", "--vc", "default")
    assert created.exit_code == 0, created.output
    alice_token = created.stdout.strip()
    assert created.stdout == alice_token + "\n" and len(alice_token) >= 32
    as_json = json.loads(
        cli(server, "token", "create", "bob", "--vc", "default", "-o", "json").stdout
    )
    assert {k: v for k, v in as_json.items() if k not in ("token", "id")} == {
        "user": "bob",
        "vc": "default",
        "admin": False,
        "unix_user": None,
        "expires_at": None,
    }
    bob_token = as_json["token"]
    carol_token = admin_client.create_token("carol")["token"]  # no VC: sees her own jobs only
    assert one_error_line(cli(server, "token", "create", "dave", "--vc", "nope")).startswith(
        "vc: unknown VC 'nope'"
    )

    alice = Client(server.url, alice_token)
    bob = Client(server.url, bob_token)
    carol = Client(server.url, carol_token)
    try:
        assert alice.whoami() == {"user": "alice", "vc": "default", "admin": False}
        alices = alice.submit({"name": "mine", "gpus": 1, "command": "sleep 30"})["id"]
        carols = carol.submit({"name": "hers", "gpus": 1, "command": "sleep 30"})["id"]
        admins = admin_client.submit(
            {"name": "ops", "gpus": 1, "vc": "default", "command": "true"}
        )["id"]
        assert alice.job(alices)["user"] == "alice"

        # bob reads his VC's jobs but may not cancel alice's
        assert bob.job(alices)["name"] == "mine"
        refused = one_error_line(cli(server, "cancel", alices, token=bob_token))
        assert refused == f"job {alices} belongs to alice; only they or an admin may cancel it"
        assert alice.job(alices)["status"] in LIVE
        with pytest.raises(ClientError) as caught:
            bob.cancel(alices)
        assert caught.value.status == 403

        # carol, without a VC, sees only her own jobs; the others do not exist for her
        assert {job["id"] for job in carol.jobs()} == {carols}
        assert one_error_line(cli(server, "describe", alices, token=carol_token)) == (
            f"no job {alices}"
        )
        # a VC member sees the whole VC (every job here is in `default`)
        seen_by_bob = {job["id"] for job in bob.jobs()}
        assert {alices, carols, admins} <= seen_by_bob

        # users make no tokens
        assert one_error_line(cli(server, "token", "create", "mallory", token=alice_token)) == (
            "only an admin may create tokens"
        )
        with pytest.raises(ClientError) as caught:
            alice.create_token("mallory", admin=True)
        assert caught.value.status == 403

        owned = cli(server, "cancel", alices, token=alice_token)
        assert owned.exit_code == 0 and alice.job(alices)["status"] == "CANCELLED"
    finally:
        for client in (alice, bob, carol):
            client.close()


def test_vc_ls(server: RunningServer, admin_client: Client):
    job_id = admin_client.submit({"name": "vc-user", "gpus": 3, "command": "sleep 30"})["id"]
    wait_status(admin_client, job_id, ("RUNNING",))
    listed = json.loads(cli(server, "vc", "ls", "-o", "json").stdout)
    assert listed == [
        {"name": "default", "guaranteed_gpus": 4, "allocated_gpus": 3, "pending": 0, "running": 1}
    ]
    table = cli(server, "vc", "ls").stdout.splitlines()
    assert table[0].split() == ["VC", "GUARANTEED", "ALLOCATED", "PENDING", "RUNNING"]
    assert table[1].split() == ["default", "4", "3", "0", "1"]


def test_ls_describe_and_profile_ls_show_what_a_job_reported(
    server: RunningServer, admin_client: Client
):
    # 20 steps of 0.1 s, each reported; it waits at step 20 for the gate, so the test reads
    # its progress while it runs and knows exactly where it is.
    gate = server.manager.data_dir / "gate-progress"
    code = (
        "import os, pathlib, time\n"
        "from corral.progress import report\n"
        "for step in range(1, 21):\n"
        "    time.sleep(0.1)\n"
        "    report(step=step, loss=2.0 / step)\n"
        f"while not pathlib.Path({str(gate)!r}).exists():\n"
        "    time.sleep(0.05)\n"
    )
    job_id = admin_client.submit(
        {
            "name": "reporter",
            "gpus": 1,
            "model": "tiny",
            "total_steps": 80,
            "command": [sys.executable, "-c", code],
        }
    )["id"]
    wait_until(
        lambda: (admin_client.job(job_id).get("progress") or {}).get("step") == 20,
        "the job's 20th report",
    )
    row = next(line for line in cli(server, "ls").stdout.splitlines() if "reporter" in line)
    assert "20/80 25%" in row
    described = cli(server, "describe", job_id).stdout
    progress = next(line for line in described.splitlines() if "Progress:" in line)
    assert "step 20/80 25%" in progress
    assert "loss 0.1 (down from" in progress  # 2/20; the first stored point's loss was higher
    # fifo estimates nothing: the remaining time is the declared total_steps at the measured rate
    # (60 steps left at about 10 steps/s: about 6 s, less the time since the 20th report), once
    # the rate is measured.
    estimate = wait_until(lambda: admin_client.job(job_id)["estimate"], "an estimate")
    assert estimate["source"] == "total_steps" and 0 <= estimate["remaining_s"] <= 60 / 5
    described = cli(server, "describe", job_id).stdout
    remaining = next(line for line in described.splitlines() if "Remaining:" in line)
    assert "(declared total_steps 80, step 20, at the measured " in remaining
    gate.write_text("")
    wait_status(admin_client, job_id, ("SUCCEEDED",))
    listed = json.loads(cli(server, "profile", "ls", "-o", "json").stdout)
    (tiny,) = [row for row in listed if row["model"] == "tiny"]
    assert (tiny["gpu_type"], tiny["gpus"], tiny["nodes"], tiny["runs"]) == ("gpu", 1, 1, 1)
    assert 0 < tiny["steps_per_s"] <= 10  # 0.1 s of sleep per step
    table = cli(server, "profile", "ls", "--model", "tiny").stdout.splitlines()
    assert table[0].split()[:3] == ["MODEL", "GPU", "TYPE"]
    assert table[1].split()[:5] == ["tiny", "gpu", "1", "1", "-"]
    assert "Throughput:" in cli(server, "describe", job_id).stdout


def test_describe_estimates_a_running_job_from_its_time_limit(
    server: RunningServer, admin_client: Client
):
    job_id = admin_client.submit(
        {"name": "limited", "gpus": 1, "time_limit": 600, "command": "sleep 60"}
    )["id"]
    running = wait_status(admin_client, job_id, ("RUNNING",))
    # No progress reports, no total_steps, and fifo estimates nothing: what is left of its
    # time_limit, 600 s less the seconds it has run (a few).
    estimate = admin_client.job(job_id)["estimate"]
    ran = time.time() - running["started_at"]
    assert estimate["source"] == "time_limit"
    assert 600 - ran - 5 <= estimate["remaining_s"] <= 600 - ran + 5, (estimate, ran)
    described = cli(server, "describe", job_id).stdout
    remaining = next(line for line in described.splitlines() if "Remaining:" in line)
    assert "(declared time_limit 600 s, " in remaining


def test_users_see_their_own_vc_only(tmp_path: Path):
    """Two VCs (a, b): a user of one neither sees nor submits to the other."""
    data_dir = tmp_path / "two-vcs"
    running = start_server(data_dir, gpus=2, config=TWO_VCS)
    admin = Client(running.url, admin_token(data_dir))
    try:
        tokens = {vc: admin.create_token(f"user-{vc}", vc=vc)["token"] for vc in ("a", "b")}
        users = {vc: Client(running.url, token) for vc, token in tokens.items()}
        # no vc in the spec: the job goes to the token's VC
        ids = {
            vc: user.submit({"name": f"job-{vc}", "gpus": 1, "command": "true"})["id"]
            for vc, user in users.items()
        }
        assert {vc: admin.job(job_id)["vc"] for vc, job_id in ids.items()} == {"a": "a", "b": "b"}
        for vc, user in users.items():
            assert [job["id"] for job in user.jobs()] == [ids[vc]]
            assert [v["name"] for v in user.vcs()] == [vc]
        assert {job["id"] for job in admin.jobs()} == set(ids.values())
        assert [(v["name"], v["guaranteed_gpus"]) for v in admin.vcs()] == [("a", 1), ("b", 1)]

        spec = write_spec(tmp_path / "other.yaml", name="x", gpus=1, vc="b", command="true")
        result = CliRunner().invoke(
            app, ["submit", str(spec)], env={"CORRAL_URL": running.url, "CORRAL_TOKEN": tokens["a"]}
        )
        assert one_error_line(result) == f"{spec}: vc: user user-a may submit only to VC a"
        with pytest.raises(ClientError) as caught:
            users["a"].job(ids["b"])
        assert (caught.value.status, str(caught.value)) == (404, f"no job {ids['b']}")
        # a level above 0 jumps others' jobs: admins only; lowering one's own job is anyone's
        for raised in ({"level": 5}, {"priority": 1}):
            with pytest.raises(ClientError) as caught:
                users["a"].submit({"name": "pushy", "gpus": 1, "command": "true", **raised})
            assert (caught.value.status, str(caught.value)) == (
                403,
                "level: user user-a may not raise a job above level 0 (admins only)",
            )
        humble = users["a"].submit({"name": "humble", "gpus": 1, "command": "true", "level": -2})
        ids["humble"] = humble["id"]
        for job_id in ids.values():
            admin.wait(job_id, timeout=WAIT_S)
        for user in users.values():
            user.close()
    finally:
        admin.close()
        running.stop()
        kill_jobs_of(data_dir)


def test_wait_gives_up_after_its_timeout(admin_client: Client, server: RunningServer):
    job_id = admin_client.submit({"name": "slow", "gpus": 1, "command": "sleep 30"})["id"]
    began = time.monotonic()
    with pytest.raises(ClientError) as caught:
        admin_client.wait(job_id, timeout=0.3, poll_s=0.05)
    assert 0.3 <= time.monotonic() - began < 3
    assert re.fullmatch(rf"job {job_id} is still (PENDING|RUNNING) after 0.3 s", str(caught.value))


# -- filters, paging, output formats, queue, submit flags (issue 15) --------------------------


def test_ls_filters_and_limits_at_the_server(server: RunningServer, admin_client: Client):
    ids = {
        name: [admin_client.submit({"name": name, "gpus": 1, "command": "true"})["id"]]
        for name in ("filter-a", "filter-b")
    }
    ids["filter-a"].append(
        admin_client.submit({"name": "filter-a", "gpus": 1, "command": "true"})["id"]
    )
    named = json.loads(cli(server, "ls", "--name", "filter-a", "-o", "json").stdout)
    assert [job["id"] for job in named] == ids["filter-a"][::-1]  # newest first
    assert admin_client.jobs(name="filter-b")[0]["id"] == ids["filter-b"][0]
    assert json.loads(cli(server, "ls", "--name", "no-such-name", "-o", "json").stdout) == []
    newest = json.loads(cli(server, "ls", "--limit", "2", "-o", "json").stdout)
    assert [job["id"] for job in newest] == [ids["filter-a"][1], ids["filter-b"][0]]
    both = cli(server, "ls", "--all", "--limit", "2")
    assert both.exit_code == 2 and both.stderr == "error: --all and --limit: give one of them\n"
    # The API refuses bad paging in one line (4xx), and the Python client says it in one line.
    for query, message in (
        ({"limit": -1}, "limit: must be greater than or equal to 1"),
        ({"before_id": "abc"}, "before_id: must be a valid integer"),
        ({"status": "sleeping"}, "status: must be one of PENDING, RUNNING, SUCCEEDED"),
    ):
        with pytest.raises(ClientError) as refused:
            admin_client._send("GET", "/jobs", params=query)
        assert refused.value.status == 422 and refused.value.message.startswith(message), (
            refused.value.message
        )
        assert "\n" not in refused.value.message


def test_every_listing_prints_yaml_and_wide(server: RunningServer, admin_client: Client):
    job_id = admin_client.submit({"name": "formats", "gpus": 1, "command": "sleep 30"})["id"]
    wait_status(admin_client, job_id, ("RUNNING",))
    for args in (("ls",), ("vc", "ls"), ("token", "ls"), ("profile", "ls"), ("queue",)):
        as_json = json.loads(cli(server, *args, "-o", "json").stdout)
        as_yaml = yaml.safe_load(cli(server, *args, "-o", "yaml").stdout)
        if args == ("ls",):  # the AGE of a record moves on; its fields do not
            as_json = [job | {"reason": ""} for job in as_json]
            as_yaml = [job | {"reason": ""} for job in as_yaml]
        assert as_yaml == as_json, args
        assert cli(server, *args, "-o", "wide").exit_code == 0, args
    wide = cli(server, "ls", "-o", "wide").stdout.splitlines()
    assert wide[0].split() == [
        "ID", "NAME", "USER", "VC", "STATUS", "GPUS", "WORKERS", "PRIORITY", "AGE",
        "PROGRESS", "ETA", "ATTEMPTS", "PLACEMENT", "REASON",
    ]  # fmt: skip
    row = next(line.split() for line in wide if line.split()[0] == job_id)
    placement = admin_client.job(job_id)["placement"]
    assert row[5:8] == ["1", "1", "guaranteed"] and ",".join(placement) in row
    token_header = cli(server, "token", "ls", "-o", "wide").stdout.splitlines()[0]
    assert "STATE" in token_header.split()
    described = yaml.safe_load(cli(server, "describe", job_id, "-o", "yaml").stdout)
    assert described["id"] == job_id and described["spec"]["command"] == "sleep 30"


def test_ls_keeps_the_reason_and_drops_the_queue_prefix(
    server: RunningServer, admin_client: Client
):
    blocker = admin_client.submit({"name": "big", "gpus": 4, "command": "sleep 30"})["id"]
    wait_status(admin_client, blocker, ("RUNNING",))
    waiter = admin_client.submit({"name": "small", "gpus": 1, "command": "true"})["id"]

    def waiting_reason() -> str | None:
        reason = admin_client.job(waiter)["reason"]
        return reason if "free GPUs" in reason else None

    reason = wait_until(waiting_reason, "the waiter's reason")
    assert reason.startswith("PENDING, position 1 of 1 in the queue; ")
    informative = reason.split("; ", 1)[1]
    # Longer than the 60 characters `ls` used to cut it to, and now shown whole in the table.
    assert len(informative) > 60, informative
    row = next(r for r in cli(server, "ls").stdout.splitlines() if r.split()[0] == waiter)
    assert "position" not in row and row.endswith(informative), row
    wide = next(
        r for r in cli(server, "ls", "-o", "wide").stdout.splitlines() if r.startswith(waiter)
    )
    assert wide.endswith(informative)  # whole, however long


def test_queue_shows_the_waiting_jobs_in_the_schedulers_order(
    server: RunningServer, admin_client: Client
):
    blocker = admin_client.submit({"name": "hog", "gpus": 4, "command": "sleep 30"})["id"]
    wait_status(admin_client, blocker, ("RUNNING",))
    waiting = [
        admin_client.submit({"name": f"wait-{i}", "gpus": 1, "command": "true"})["id"]
        for i in range(3)
    ]
    wait_until(lambda: admin_client.queue()["total"] == 3, "the three in the queue")
    wait_until(lambda: "free GPUs" in admin_client.job(waiting[0])["reason"], "a round")
    expected = [job["id"] for job in admin_client.queue()["jobs"]]
    assert sorted(expected) == sorted(waiting)
    listed = json.loads(cli(server, "queue", "-o", "json").stdout)
    assert listed["total"] == 3
    assert [(job["position"], job["id"]) for job in listed["jobs"]] == list(
        enumerate(expected, start=1)
    )
    table = cli(server, "queue", "--limit", "2")
    header, *rows = table.stdout.splitlines()
    assert header.split() == [
        "POS",
        "ID",
        "NAME",
        "USER",
        "VC",
        "GPUS",
        "PRIORITY",
        "WAIT",
        "REASON",
    ]
    assert [row.split()[:2] for row in rows] == [["1", expected[0]], ["2", expected[1]]]
    assert table.stderr == "(1 more waiting: --limit)\n"
    assert "waiting for free GPUs" in rows[0]


def test_submit_flags_override_the_file_and_a_command_needs_no_file(
    server: RunningServer, admin_client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)
    spec = write_spec(tmp_path / "job.yaml", name="from-file", gpus=1, command="true")
    submitted = cli(
        server, "submit", str(spec), "--gpus", "2", "--name", "flagged",
        "--set", "max_retries=2", "--set", "env.LR=0.1", "--workers", "2",
    )  # fmt: skip
    assert submitted.exit_code == 0, submitted.output
    detail = admin_client.job(submitted.stdout.strip())
    assert (detail["name"], detail["gpus"], detail["workers"]) == ("flagged", 2, 2)
    assert detail["spec"]["max_retries"] == 2 and detail["spec"]["env"] == {"LR": "0.1"}

    line = cli(
        server, "submit", "--gpus", "1", "--", sys.executable, "-c",
        "import sys; print('argv', sys.argv[1:])", "--lr", "0.1",
    )  # fmt: skip
    assert line.exit_code == 0, line.output
    job_id = line.stdout.strip()
    done = admin_client.wait(job_id, timeout=WAIT_S)
    assert (
        done["status"] == "SUCCEEDED"
        and done["name"] == "python3"
        or done["name"].startswith("python")
    )
    assert cli(server, "logs", job_id).stdout == "argv ['--lr', '0.1']\n"
    assert done["spec"]["workdir"] == str(tmp_path)

    nothing = cli(server, "submit", "--gpus", "1")
    assert (
        nothing.exit_code == 2 and "give a job spec FILE, or the command after --" in nothing.stderr
    )
    bad_set = cli(server, "submit", str(spec), "--set", "gpus")
    assert bad_set.exit_code == 2 and "--set: expected KEY=VALUE" in bad_set.stderr
    refused = one_error_line(cli(server, "submit", str(spec), "--set", "gpus=-1"))
    assert refused.startswith(f"{spec}: gpus:"), refused
    listed = write_spec(tmp_path / "list.yaml")
    listed.write_text("- a\n- b\n")
    assert one_error_line(cli(server, "submit", str(listed))) == (
        f"{listed}: a job spec is a mapping of fields, not a list"
    )


def test_describe_of_a_retried_running_job_shows_no_old_exit_code(
    server: RunningServer, admin_client: Client, tmp_path: Path
):
    marker = tmp_path / "failed-once"
    command = f"if [ -e {marker} ]; then sleep 30; else touch {marker}; exit 3; fi"
    job_id = admin_client.submit(
        {"name": "retried", "gpus": 1, "max_retries": 1, "command": command}
    )["id"]
    wait_until(
        lambda: (job := admin_client.job(job_id))["status"] == "RUNNING" and job["attempts"] == 2,
        "the second attempt running",
    )
    described = cli(server, "describe", job_id).stdout
    assert "Exit code" not in described, described
    attempts = described.split("\nAttempts\n", 1)[1].split("\n\n", 1)[0].splitlines()
    first = next(row for row in attempts if row.split()[0] == "1")
    assert re.search(r"\bended\s+failed\s+3\b", first), attempts
    assert admin_client.job(job_id)["exit_code"] == 3  # the JSON is unchanged: scripts read it


def test_the_client_reconnects_when_its_kept_connection_was_closed(server: RunningServer):
    """One keep-alive connection serves a Client's requests; when it was closed meanwhile (the
    server's keep-alive timeout), the next request goes out again on a fresh one."""
    import socket

    def connections(client: Client) -> list[object]:
        return list(client._wire.http._transport._pool.connections)

    with Client(server.url, admin_token(server.manager.data_dir)) as client:
        assert client.whoami()["admin"]
        (kept,) = connections(client)  # (httpcore's connection and its socket)
        kept._connection._network_stream.get_extra_info("socket").shutdown(socket.SHUT_RDWR)
        assert client.whoami()["admin"]
        (again,) = connections(client)
        assert again is not kept
        assert client.vcs() and connections(client) == [again]  # kept alive from there on


def test_the_retry_backoff_counts_down_in_ls_and_describe(tmp_path: Path):
    """A failed job held for its retry backoff (60 s here): ls and describe say how long is
    left, counted from the time asked (no scheduling round runs while it is held)."""
    data_dir = tmp_path / "backoff"
    running = start_server(data_dir, gpus=1, retry_backoff_s=60.0)
    admin = Client(running.url, admin_token(data_dir))
    env = {"CORRAL_URL": running.url, "CORRAL_TOKEN": admin_token(data_dir)}
    held = re.compile(r"retry backoff: held for (\d+) s more")
    try:
        job_id = admin.submit({"name": "flaky", "gpus": 1, "max_retries": 1, "command": "exit 3"})[
            "id"
        ]

        def left() -> int | None:
            found = held.search(admin.job(job_id)["reason"])
            return int(found.group(1)) if found else None

        first = wait_until(left, "the job held for its backoff")
        assert 50 <= first <= 60
        later = wait_until(lambda: (n := left()) is not None and n < first and n, "a second on")
        assert later < first
        row = next(
            line
            for line in CliRunner().invoke(app, ["ls", "-o", "wide"], env=env).stdout.splitlines()
            if line.startswith(job_id)
        )
        shown = held.search(row)
        assert shown and int(shown.group(1)) <= later and "position" not in row, row
        described = CliRunner().invoke(app, ["describe", job_id], env=env).stdout
        why = held.search(described.split("Why pending:", 1)[1])
        assert why and int(why.group(1)) <= later, described
        assert "Exit code" not in described  # it waits: the 3 is its first attempt's
        admin.cancel(job_id)
    finally:
        admin.close()
        running.stop()
        kill_jobs_of(data_dir)
