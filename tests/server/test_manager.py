"""The embedded manager end to end: real job processes, a real SQLite file, HTTP on loopback."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.server.boot import RunningServer
from tests.server.helpers import (
    TWO_VCS,
    WAIT_S,
    admin_token,
    alive,
    api,
    job,
    kill_jobs_of,
    python_job,
    start_server,
    submit,
    train_job,
    wait_for,
    wait_until,
)


@pytest.fixture
def server(data_dir: Path) -> Iterator[RunningServer]:
    running = start_server(data_dir, gpus=2)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def two_vcs(data_dir: Path) -> Iterator[RunningServer]:
    running = start_server(data_dir, gpus=2, config=TWO_VCS)
    try:
        yield running
    finally:
        running.stop()


def checkpointed(data_dir: Path, job_id: str) -> bool:
    """Whether train.py has written a checkpoint for the job (one step done at least)."""
    return (data_dir / "jobs" / job_id / "checkpoint" / "ckpt.json").is_file()


ENV_DUMP = (
    "import json, os; keys = ['CUDA_VISIBLE_DEVICES', 'RANK', 'LOCAL_RANK', 'WORLD_SIZE', "
    "'MASTER_ADDR', 'MASTER_PORT', 'CORRAL_CHECKPOINT_DIR', 'CORRAL_JOB_ID', 'CORRAL_ATTEMPT', "
    "'CORRAL_LOCAL_GPUS', 'GREETING', 'CUDA_DEVICE_ORDER', 'CORRAL_TOKEN']; "
    "print(json.dumps({k: os.environ.get(k) for k in keys} | "
    "{'pid': os.getpid(), 'pgid': os.getpgid(0)}))"
)


def test_a_two_worker_job_gets_its_gpus_and_torch_distributed_variables(
    server: RunningServer, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_TOKEN", "the-admins-secret")  # the manager's, not its jobs'
    client = api(server.url, admin_token(data_dir))
    job_id = submit(
        client,
        **python_job("env", ENV_DUMP, gpus=2, workers=2, env={"GREETING": "hello"}),
    )
    done = wait_for(client, job_id)
    assert done["status"] == "SUCCEEDED" and done["exit_code"] == 0
    attempt_dir = data_dir / "jobs" / job_id / "attempt-1"
    seen = [json.loads((attempt_dir / f"rank-{r}.stdout").read_text()) for r in (0, 1)]
    for rank, env in enumerate(seen):
        # torchrun's convention: every worker sees the job's GPUs on its node, LOCAL_RANK picks
        assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
        assert env["RANK"] == env["LOCAL_RANK"] == str(rank)
        assert env["CORRAL_LOCAL_GPUS"] == str(rank)
        assert env["WORLD_SIZE"] == "2" and env["MASTER_ADDR"] == "127.0.0.1"
        assert env["CORRAL_CHECKPOINT_DIR"] == str(data_dir / "jobs" / job_id / "checkpoint")
        assert env["CORRAL_JOB_ID"] == job_id and env["CORRAL_ATTEMPT"] == "1"
        assert env["GREETING"] == "hello"
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # device numbers as NVML gives them
        assert env["CORRAL_TOKEN"] is None
    assert seen[0]["MASTER_PORT"] == seen[1]["MASTER_PORT"]
    # one process group for the job's workers, led by worker 0, not the server's group
    assert seen[0]["pgid"] == seen[1]["pgid"] == seen[0]["pid"]
    assert seen[0]["pgid"] != os.getpgid(0)
    detail = job(client, job_id)
    assert [a["gpus"] for a in detail["attempt_history"]] == [[f"{_node()}/0", f"{_node()}/1"]]
    assert [e["kind"] for e in detail["events"]] == ["submitted", "started", "succeeded"]


def _node() -> str:
    from corral.server.executors.local import node_name

    return node_name()


def test_a_preempted_job_checkpoints_and_resumes_on_gpus_no_one_else_holds(
    two_vcs: RunningServer, data_dir: Path
) -> None:
    admin = api(two_vcs.url, admin_token(data_dir))
    alice = api(
        two_vcs.url, admin.post("/api/v1/tokens", json={"user": "alice", "vc": "a"}).json()["token"]
    )
    bob = api(
        two_vcs.url, admin.post("/api/v1/tokens", json={"user": "bob", "vc": "b"}).json()["token"]
    )
    first = submit(alice, **train_job("first", steps=60))
    second = submit(alice, **train_job("second", steps=60))
    wait_for(alice, first, ["RUNNING"])
    wait_for(alice, second, ["RUNNING"])  # on b's idle GPU, borrowed
    for job_id in (first, second):  # some steps done, each checkpointed
        wait_until(lambda j=job_id: checkpointed(data_dir, j), f"job {job_id}'s checkpoint")
    mine = submit(bob, **python_job("bob", "import time; time.sleep(1)"))
    ended = [wait_for(admin, j, timeout=240) for j in (first, second, mine)]
    assert [e["status"] for e in ended] == ["SUCCEEDED"] * 3
    preempted = [e for e in ended if e["preemptions"] == 1]
    assert len(preempted) == 1 and preempted[0]["vc"] == "a"  # b took its GPU back
    victim = preempted[0]
    assert victim["attempts"] == 2
    logs = data_dir / "jobs" / victim["id"]
    resumed = (logs / "attempt-2" / "rank-0.stdout").read_text()
    step = int(resumed.split("resumed from step ")[1].split()[0])
    assert step > 0  # resumed, not restarted
    assert "starting from step 0" in (logs / "attempt-1" / "rank-0.stdout").read_text()
    # No GPU ever ran two attempts at once: the preempted job's processes left before bob's began.
    spans: dict[str, list[tuple[float, float]]] = {}
    for entry in ended:
        for attempt in job(admin, entry["id"])["attempt_history"]:
            for gpu in attempt["gpus"]:
                spans.setdefault(gpu, []).append((attempt["started_at"], attempt["ended_at"]))
    for gpu, intervals in spans.items():
        intervals.sort()
        for (_, end), (start, _) in zip(intervals, intervals[1:], strict=False):
            assert start >= end, f"{gpu}: an attempt started before the previous one ended"
    first_attempt = job(admin, victim["id"])["attempt_history"][0]
    assert first_attempt["outcome"] == "preempted"


def test_a_failed_attempt_is_retried_after_its_backoff(
    server: RunningServer, data_dir: Path
) -> None:
    client = api(server.url, admin_token(data_dir))
    flaky = (
        "import os, sys, pathlib; mark = pathlib.Path(os.environ['CORRAL_CHECKPOINT_DIR'], 'tried');"
        "sys.exit(0) if mark.exists() else (mark.touch(), print('boom', file=sys.stderr), sys.exit(3))"
    )
    job_id = submit(client, **python_job("flaky", flaky, max_retries=2))
    done = wait_for(client, job_id)
    assert done["status"] == "SUCCEEDED"
    assert (done["attempts"], done["failures"]) == (2, 1)
    history = job(client, job_id)["attempt_history"]
    assert [a["outcome"] for a in history] == ["failed", "succeeded"]
    assert history[0]["exit_code"] == 3
    assert history[1]["started_at"] - history[0]["ended_at"] >= 0.5 - 0.06  # the backoff, 1 tick
    kinds = [e["kind"] for e in job(client, job_id)["events"]]
    assert kinds.count("retrying") == 1


def test_the_same_fast_failure_again_and_again_is_a_user_error(
    server: RunningServer, data_dir: Path
) -> None:
    client = api(server.url, admin_token(data_dir))
    job_id = submit(client, **python_job("typo", "import torchh", max_retries=10))
    done = wait_for(client, job_id)
    assert done["status"] == "FAILED"
    assert done["attempts"] == 3  # fast_fail_repeats = 2: the third identical failure ends it
    assert "user error" in done["reason"] and "torchh" in done["reason"]


def test_different_failures_use_up_the_retries(server: RunningServer, data_dir: Path) -> None:
    client = api(server.url, admin_token(data_dir))
    varying = "import os, sys; sys.exit('failure number ' + os.environ['CORRAL_ATTEMPT'])"
    job_id = submit(client, **python_job("varying", varying, max_retries=2))
    done = wait_for(client, job_id)
    assert done["status"] == "FAILED"
    assert (done["attempts"], done["failures"]) == (3, 3)
    assert "failure number 3" in done["reason"]


def test_cancel_stops_a_running_job_and_a_pending_one_never_runs(
    server: RunningServer, data_dir: Path
) -> None:
    client = api(server.url, admin_token(data_dir))
    running = submit(
        client,
        **python_job(
            "long", "import os, time; print(os.getpid(), flush=True); time.sleep(600)", gpus=2
        ),
    )
    waiting = submit(client, **python_job("waits", "print('ran')", gpus=2))
    wait_for(client, running, ["RUNNING"])
    stdout = data_dir / "jobs" / running / "attempt-1" / "rank-0.stdout"
    wait_until(lambda: stdout.is_file() and stdout.read_text().strip(), "the job's pid")
    pid = int(stdout.read_text().split()[0])
    assert job(client, waiting)["status"] == "PENDING"
    assert client.post(f"/api/v1/jobs/{waiting}/cancel").json()["status"] == "CANCELLED"
    assert client.post(f"/api/v1/jobs/{running}/cancel").json()["status"] == "CANCELLED"
    wait_until(lambda: not alive(pid), f"the cancelled job's process {pid} to end")
    assert job(client, waiting)["attempts"] == 0
    history = job(client, running)["attempt_history"]
    assert [a["outcome"] for a in history] == ["cancelled"]
    # cancelling again changes nothing
    assert client.post(f"/api/v1/jobs/{running}/cancel").json()["status"] == "CANCELLED"


BAD_SPECS = [
    ({"name": "x", "gpus": 0, "command": "true"}, "gpus: must be a positive integer"),
    ({"name": "x", "gpus": 1}, "command: field required"),
    (
        {"name": "x", "gpus": 3, "command": "true"},
        "gpus: asks for 3 GPUs but the cluster has only 2 GPUs",
    ),
    ({"name": "x", "gpus": 2, "workers": 3, "command": "true"}, "workers: must divide gpus"),
    ({"name": "x", "gpus": 1, "command": "true", "vc": "nope"}, "vc: unknown VC 'nope'"),
    ({"name": "x", "gpus": 1, "command": "true", "colour": "red"}, "colour: unknown field"),
    (["not", "a", "mapping"], "the job spec must be a mapping of fields"),
]


@pytest.mark.parametrize(("body", "message"), BAD_SPECS)
def test_a_bad_spec_is_refused_with_its_field_and_nothing_is_stored(
    server: RunningServer, data_dir: Path, body: object, message: str
) -> None:
    client = api(server.url, admin_token(data_dir))
    response = client.post("/api/v1/jobs", json=body)
    assert response.status_code == 422
    assert response.json()["detail"].startswith(message)
    assert client.get("/api/v1/jobs").json() == []
    assert server.manager.scheduler.jobs == {}
    assert submit(client, **python_job("ok", "pass")) == "1"  # no id was used up


def test_tokens_and_permissions(two_vcs: RunningServer, data_dir: Path) -> None:
    url = two_vcs.url
    admin = api(url, admin_token(data_dir))
    assert api(url, None).get("/api/v1/jobs").status_code == 401
    assert api(url, "not-a-token").get("/api/v1/jobs").status_code == 401
    tokens = {
        user: admin.post("/api/v1/tokens", json={"user": user, "vc": vc}).json()["token"]
        for user, vc in (("alice", "a"), ("carol", "a"), ("bob", "b"))
    }
    alice, carol, bob = (api(url, tokens[u]) for u in ("alice", "carol", "bob"))
    sleeper = python_job("sleeper", "import time; time.sleep(600)")
    alices = submit(alice, **sleeper)  # vc defaults to the token's VC
    bobs = submit(bob, **sleeper)
    assert job(alice, alices)["vc"] == "a"
    assert bob.post("/api/v1/jobs", json=sleeper | {"vc": "a"}).status_code == 403
    # a user sees own jobs and the VC's, not other VCs'
    assert [j["id"] for j in carol.get("/api/v1/jobs").json()] == [alices]
    assert carol.get(f"/api/v1/jobs/{bobs}").status_code == 404
    response = carol.post(f"/api/v1/jobs/{alices}/cancel")
    assert response.status_code == 403 and "belongs to alice" in response.json()["detail"]
    assert bob.post("/api/v1/tokens", json={"user": "mallory", "admin": True}).status_code == 403
    assert alice.get("/api/v1/whoami").json() == {"user": "alice", "vc": "a", "admin": False}
    assert [v["name"] for v in bob.get("/api/v1/vcs").json()] == ["b"]
    assert alice.post(f"/api/v1/jobs/{alices}/cancel").json()["status"] == "CANCELLED"
    assert admin.post(f"/api/v1/jobs/{bobs}/cancel").json()["status"] == "CANCELLED"


def test_metrics_show_queues_allocation_states_and_round_latency(
    two_vcs: RunningServer, data_dir: Path
) -> None:
    admin = api(two_vcs.url, admin_token(data_dir))
    sleeper = python_job("sleeper", "import time; time.sleep(600)", gpus=2)
    running = submit(admin, **sleeper | {"vc": "a"})
    wait_for(admin, running, ["RUNNING"])
    queued = [submit(admin, **sleeper | {"vc": "b"}) for _ in range(2)]

    def metrics() -> dict[str, float]:
        return {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in admin.get("/metrics").text.splitlines()
            if line and not line.startswith("#")
        }

    # once a scheduling round has seen both queued jobs
    values = wait_until(
        lambda: (found := metrics()).get('corral_queue_length{vc="b"}') == 2 and found,
        "both of b's jobs in its queue",
    )
    # b's jobs wait: b is guaranteed 1 GPU and a job of 2 cannot start while a holds both
    assert values['corral_queue_length{vc="b"}'] == 2
    assert values['corral_queue_length{vc="a"}'] == 0
    assert values['corral_gpus_allocated{vc="a"}'] == 2
    assert values['corral_jobs{state="RUNNING"}'] == 1
    assert values['corral_jobs{state="PENDING"}'] == 2
    assert values["corral_scheduling_round_seconds_count"] >= 1
    for job_id in [running, *queued]:
        admin.post(f"/api/v1/jobs/{job_id}/cancel")


def test_a_waiting_job_says_why(server: RunningServer, data_dir: Path) -> None:
    client = api(server.url, admin_token(data_dir))
    blocker = submit(client, **python_job("blocker", "import time; time.sleep(600)", gpus=2))
    wait_for(client, blocker, ["RUNNING"])
    waiting = submit(client, **python_job("waiting", "pass", gpus=1))
    reason = wait_until(
        lambda: (
            (found := job(client, waiting)["reason"]).startswith("PENDING, position")
            and "not yet considered" not in found  # its place in the queue comes first
            and found
        ),
        "a scheduling round to give the waiting job its place",
    )
    assert reason.startswith("PENDING, position 1 of 1 in the queue")
    assert "free" in reason or "GPUs" in reason, reason
    client.post(f"/api/v1/jobs/{blocker}/cancel")
    assert wait_for(client, waiting)["status"] == "SUCCEEDED"


def test_logs_are_kept_per_attempt_and_stream(server: RunningServer, data_dir: Path) -> None:
    client = api(server.url, admin_token(data_dir))
    code = "import sys; print('out line'); print('err line', file=sys.stderr)"
    job_id = submit(client, **python_job("logs", code))
    wait_for(client, job_id)
    out = client.get(f"/api/v1/jobs/{job_id}/logs")
    assert out.text == "out line\n" and out.headers["X-Corral-Finished"] == "true"
    assert out.headers["X-Corral-Offset"] == str(len("out line\n"))
    err = client.get(f"/api/v1/jobs/{job_id}/logs", params={"stream": "stderr", "offset": 4})
    assert err.text == "line\n"


def _resumed_step(data_dir: Path, job_id: str, attempt: int) -> int:
    text = (data_dir / "jobs" / job_id / f"attempt-{attempt}" / "rank-0.stdout").read_text()
    return int(text.split("resumed from step ")[1].split()[0])


def _resumed_from(data_dir: Path, job_id: str, attempt: int) -> int:
    """The step an attempt resumed from; 0 for one whose worker wrote nothing of it (stopped
    before it started, or before it read its checkpoint)."""
    try:
        return _resumed_step(data_dir, job_id, attempt)
    except (OSError, IndexError):
        return 0


def test_las_preempts_the_job_that_attained_more_service_and_it_resumes(
    data_dir: Path,
) -> None:
    # One GPU; LAS's first queue holds jobs under 3 GPU-seconds of service (wide enough that the
    # short job stays in it even on a loaded machine).
    server = start_server(data_dir, gpus=1, policy="las", las_thresholds_gpu_s=[3.0])
    try:
        client = api(server.url, admin_token(data_dir))
        long = submit(client, **train_job("long", steps=150))
        wait_for(client, long, ["RUNNING"])
        running_since = time.monotonic()
        wait_until(lambda: checkpointed(data_dir, long), "the long job's checkpoint")
        # past 3 GPU-seconds of the time the scheduler counts: it moves to the second queue
        time.sleep(max(0.0, running_since + 3.5 - time.monotonic()))
        short = submit(client, **python_job("short", "import time; time.sleep(0.3)"))
        done_short = wait_for(client, short)
        done_long = wait_for(client, long, timeout=240)
        assert done_short["status"] == done_long["status"] == "SUCCEEDED"
        assert (done_long["preemptions"], done_long["attempts"]) == (1, 2)
        assert done_short["preemptions"] == 0
        assert done_short["finished_at"] < done_long["finished_at"]
        assert _resumed_step(data_dir, long, 2) > 0
        events = [e["message"] for e in job(client, long)["events"]]
        assert f"preempted by job {short}" in events
    finally:
        server.stop()


def _worker_run_s(data_dir: Path) -> float:
    """Seconds a one-step training job runs under a manager on this machine as loaded now, from
    its start to its end by the manager's clock: a worker's start, one step and its exit."""
    server = start_server(data_dir, gpus=1)
    try:
        client = api(server.url, admin_token(data_dir))
        done = wait_for(client, submit(client, **train_job("probe", steps=1)), timeout=240)
        assert done["status"] == "SUCCEEDED", done
        return float(done["finished_at"]) - float(done["started_at"])
    finally:
        server.stop()
        kill_jobs_of(data_dir)


def test_time_slicing_suspends_and_resumes_jobs_in_turns(data_dir: Path) -> None:
    # The quantum is sized to this machine's load: at least 4 times a worker's measured start
    # (a turn lasts at least half a quantum, so twice a start: a worker checkpoints some steps in
    # each), and each job's work 2.5 quanta, so that no job ends within its first turn. A fixed
    # 0.8 s quantum ended before a worker had started on a loaded machine.
    start_s = _worker_run_s(data_dir.parent / "probe")
    quantum_s = max(0.8, 4 * start_s)
    step_s = 0.05
    steps = math.ceil(2.5 * quantum_s / step_s)
    server = start_server(data_dir, gpus=1, policy="timeslice", quantum_s=quantum_s)
    try:
        client = api(server.url, admin_token(data_dir))
        first = submit(client, **train_job("first", steps=steps, step_s=step_s))
        second = submit(client, **train_job("second", steps=steps, step_s=step_s))
        timeout = 240 + 20 * quantum_s
        done = [wait_for(client, j, timeout=timeout) for j in (first, second)]
        assert [d["status"] for d in done] == ["SUCCEEDED", "SUCCEEDED"]
        # Each is suspended at least once and resumes from its checkpoint, and the second ran
        # before the first finished. (Load may still rise after the probe: a turn may end
        # before its worker started, so some later attempt resumes past step 0, not
        # necessarily the second.)
        for entry in done:
            assert entry["preemptions"] >= 1, (entry, quantum_s)
            resumed = [
                _resumed_from(data_dir, entry["id"], n) for n in range(2, entry["attempts"] + 1)
            ]
            assert max(resumed) > 0, (resumed, quantum_s)
        second_start = job(client, second)["attempt_history"][0]["started_at"]
        assert second_start < done[0]["finished_at"]
    finally:
        server.stop()


def test_export_trace_asks_the_manager_at_corral_url(
    server: RunningServer, data_dir: Path, tmp_path: Path
) -> None:
    """Without --data-dir or --db, export-trace asks the manager at CORRAL_URL (an admin's
    CORRAL_TOKEN), as the client commands do, and writes the same files as the local read."""
    from click.testing import CliRunner

    from corral.cli.main import app
    from corral.sim.traces import load_trace

    client = api(server.url, admin_token(data_dir))
    wait_for(client, submit(client, **python_job("exported", "pass")))
    env = {"CORRAL_URL": server.url, "CORRAL_TOKEN": admin_token(data_dir)}
    remote, local = tmp_path / "remote" / "h.corral.jsonl", tmp_path / "local" / "h.corral.jsonl"
    asked = CliRunner().invoke(app, ["export-trace", "--out", str(remote)], env=env)
    assert asked.exit_code == 0, asked.output
    read = CliRunner().invoke(
        app, ["export-trace", "--data-dir", str(data_dir), "--out", str(local)], env=env
    )
    assert read.exit_code == 0, read.output
    names = sorted(path.name for path in remote.parent.iterdir())
    assert names == sorted(path.name for path in local.parent.iterdir())
    assert names == [
        "h.corral.jsonl",
        "h.decisions.jsonl",
        "h.scheduler.yaml",
        "h.throughputs.json",
    ]
    ids = sorted(job.id for job in load_trace(f"corral:{remote}").jobs)
    assert ids == sorted(job.id for job in load_trace(f"corral:{local}").jobs) and ids
    assert f"wrote {len(ids)} job" in asked.output
    user = client.post("/api/v1/tokens", json={"user": "exporter"}).json()["token"]
    refused = CliRunner().invoke(
        app, ["export-trace", "--out", str(remote)], env=env | {"CORRAL_TOKEN": user}
    )
    assert refused.exit_code == 2 and "only an admin may export the job history" in refused.output
    misnamed = CliRunner().invoke(app, ["export-trace", "--out", str(tmp_path / "h.txt")], env=env)
    assert misnamed.exit_code == 2
    assert "a corral trace is written as NAME.corral.jsonl" in " ".join(misnamed.output.split())


def test_export_trace_writes_the_history_that_simulate_replays(
    server: RunningServer, data_dir: Path, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from corral.cli.main import app
    from corral.sim.traces import load_trace

    client = api(server.url, admin_token(data_dir))
    ran = [submit(client, **python_job(f"j{i}", "import time; time.sleep(0.3)")) for i in range(3)]
    two = submit(client, **python_job("pair", "pass", gpus=2))
    never = submit(client, **python_job("never", "pass", gpus=2))
    for job_id in [*ran, two]:
        wait_for(client, job_id)
    client.post(f"/api/v1/jobs/{never}/cancel")  # may or may not have run: see below
    out = tmp_path / "history.csv"
    result = CliRunner().invoke(
        app, ["export-trace", "--data-dir", str(data_dir), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    trace = load_trace(f"helios:{out}")
    replayed = {spec.id: spec for spec in trace.jobs}
    assert set(ran) | {two} <= set(replayed)
    assert replayed[two].gpus == 2 and replayed[ran[0]].gpus == 1
    for job_id in ran:  # each ran about 0.3 s (plus the interpreter's start, slow under load)
        assert 0.25 < replayed[job_id].duration_s < WAIT_S
    assert (never in replayed) == (job(client, never)["attempts"] > 0)
    # Beside the trace: the config the manager ran with (fast_settings: a 0.5 s backoff, relax
    # at once), which the replay takes; the API serves the same.
    config = tmp_path / "history.scheduler.yaml"
    assert f"--scheduler-config {config}" in " ".join(result.output.split())
    assert client.get("/api/v1/config").json()["scheduler"]["retry"]["backoff_s"] == 0.5
    shown = CliRunner().invoke(
        app,
        ["config", "show", "--url", server.url],
        env={"CORRAL_TOKEN": admin_token(data_dir)},
    )
    assert shown.exit_code == 0 and "backoff_s: 0.5" in shown.output
    simulated = CliRunner().invoke(
        app,
        [
            "simulate",
            "--trace",
            f"helios:{out}",
            "--cluster",
            "1x2",
            "--scheduler-config",
            str(config),
            "--compare",
            "fifo,las",
            "--out",
            str(tmp_path / "sim"),
        ],
    )
    assert simulated.exit_code == 0, simulated.output
    assert "fifo" in simulated.output and "las" in simulated.output
    runs = json.loads((tmp_path / "sim" / "summary.json").read_text())["runs"]
    replay = runs[0]["options"]["scheduler"]
    assert replay["retry"]["backoff_s"] == 0.5 and replay["relax"]["after_s"] == 0.0


def test_a_second_manager_on_the_same_data_directory_is_refused(
    server: RunningServer, data_dir: Path
) -> None:
    from corral.server.boot import BootError, ServerOptions, build_manager

    with pytest.raises(BootError, match="another corral manager .* is using this data directory"):
        build_manager(ServerOptions(data_dir=data_dir, gpus=2, single_user=True))
    server.stop()  # the lock goes with the manager: a new one may start
    again = build_manager(ServerOptions(data_dir=data_dir, gpus=2, single_user=True))
    again.stop()


def test_the_queue_lists_waiting_jobs_in_the_schedulers_order(
    two_vcs: RunningServer, data_dir: Path
) -> None:
    admin = api(two_vcs.url, admin_token(data_dir))
    bob = api(
        two_vcs.url, admin.post("/api/v1/tokens", json={"user": "bob", "vc": "b"}).json()["token"]
    )
    blocker = submit(admin, **python_job("blocker", "import time; time.sleep(600)", gpus=2, vc="a"))
    wait_for(admin, blocker, ["RUNNING"])
    waiting = [
        submit(admin, **python_job("w1", "pass", gpus=2, vc="a")),
        submit(bob, **python_job("w2", "pass", gpus=2)),
        submit(admin, **python_job("w3", "pass", gpus=1, vc="a")),
    ]
    # once a scheduling round has placed all three in the queue
    queue = wait_until(
        lambda: (
            (found := admin.get("/api/v1/queue").json())["total"] == 3
            and all(j["reason"].startswith("PENDING, position") for j in found["jobs"])
            and found
        ),
        "three jobs in the queue, each with its place",
    )
    assert queue["total"] == 3
    # fifo within LAS's first queue: submission order; each says where it stands
    assert [j["id"] for j in queue["jobs"]] == waiting
    for position, entry in enumerate(queue["jobs"], start=1):
        assert entry["status"] == "PENDING"
        assert entry["reason"].startswith(f"PENDING, position {position} of 3")
    first = admin.get("/api/v1/queue", params={"limit": 2}).json()
    assert first["total"] == 3 and [j["id"] for j in first["jobs"]] == waiting[:2]
    mine = bob.get("/api/v1/queue").json()  # bob sees his VC's only
    assert mine["total"] == 1 and [j["id"] for j in mine["jobs"]] == [waiting[1]]
    for job_id in [blocker, *waiting]:
        admin.post(f"/api/v1/jobs/{job_id}/cancel")


def test_a_second_manager_on_the_same_sqlite_file_is_refused(tmp_path: Path) -> None:
    from corral.server.boot import BootError, ServerOptions, build_manager

    url = f"sqlite:///{tmp_path / 'shared.db'}"
    first = build_manager(
        ServerOptions(data_dir=tmp_path / "one", gpus=1, db_url=url, single_user=True)
    )
    try:
        with pytest.raises(BootError, match="another corral manager is using this database"):
            build_manager(
                ServerOptions(data_dir=tmp_path / "two", gpus=1, db_url=url, single_user=True)
            )
    finally:
        first.stop()
    build_manager(
        ServerOptions(data_dir=tmp_path / "two", gpus=1, db_url=url, single_user=True)
    ).stop()
