"""Hold, release, requeue, job arrays, dependencies, signal_before_limit and levels, through a
live manager with the local executor: real job processes, a real SQLite file, HTTP on loopback."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.server.boot import RunningServer
from tests.server.helpers import (
    admin_token,
    api,
    job,
    python_job,
    start_server,
    submit,
    train_job,
    wait_for,
    wait_until,
)


@pytest.fixture
def one_gpu(data_dir: Path) -> Iterator[RunningServer]:
    running = start_server(data_dir, gpus=1)
    try:
        yield running
    finally:
        running.stop()


def until_file(path: Path) -> dict:
    """A job that runs until `path` exists."""
    code = f"import os, time\nwhile not os.path.exists({str(path)!r}): time.sleep(0.05)"
    return python_job("blocker", code)


def test_hold_release_and_a_hold_survives_a_restart(data_dir: Path, tmp_path: Path) -> None:
    running = start_server(data_dir, gpus=1)
    try:
        client = api(running.url, admin_token(data_dir))
        go = tmp_path / "go"
        blocker = submit(client, **until_file(go))
        wait_for(client, blocker, ["RUNNING"])
        held = submit(client, **python_job("held", "print('ran')"))
        answer = client.post(f"/api/v1/jobs/{held}/hold")
        assert answer.status_code == 200, answer.text
        assert answer.json()["held_by"] == "admin"
        assert job(client, held)["reason"] == "held by admin"
        go.touch()
        wait_for(client, blocker, ["SUCCEEDED"])
        later = submit(client, **python_job("later", "print('ran')"))
        wait_for(client, later, ["SUCCEEDED"])  # the GPU was free: the held job did not take it
        found = job(client, held)
        assert found["status"] == "PENDING" and found["attempts"] == 0
        assert found["reason"] == "held by admin"
        # Holding a running job is refused; releasing a job that is not held too.
        running_one = submit(client, **until_file(tmp_path / "go2"))
        wait_for(client, running_one, ["RUNNING"])
        refused = client.post(f"/api/v1/jobs/{running_one}/hold")
        assert refused.status_code == 409
        assert refused.json()["detail"] == (
            f"job {running_one} is RUNNING: only a pending job can be held"
        )
        assert client.post(f"/api/v1/jobs/{later}/release").status_code == 409
        client.post(f"/api/v1/jobs/{running_one}/cancel")
        wait_for(client, running_one, ["CANCELLED"])
    finally:
        running.stop()
    running = start_server(data_dir, gpus=1)  # the hold is in the store
    try:
        client = api(running.url, admin_token(data_dir))
        wait_until(lambda: job(client, held)["reason"] == "held by admin", "the hold kept")
        assert job(client, held)["status"] == "PENDING"
        assert client.post(f"/api/v1/jobs/{held}/release").status_code == 200
        done = wait_for(client, held, ["SUCCEEDED"])
        assert done["attempts"] == 1 and done["held_by"] is None
        kinds = [e["kind"] for e in done["events"]]
        assert kinds.index("held") < kinds.index("released") < kinds.index("started")
    finally:
        running.stop()


def test_requeue_a_running_job_and_a_failed_one(
    one_gpu: RunningServer, data_dir: Path, tmp_path: Path
) -> None:
    client = api(one_gpu.url, admin_token(data_dir))
    train = submit(client, **train_job("train", steps=40, step_s=0.05))
    wait_until(
        lambda: (data_dir / "jobs" / train / "checkpoint" / "ckpt.json").is_file(), "a checkpoint"
    )
    answer = client.post(f"/api/v1/jobs/{train}/requeue")
    assert answer.status_code == 200, answer.text
    done = wait_for(client, train, ["SUCCEEDED", "FAILED"])
    assert done["status"] == "SUCCEEDED", done
    outcomes = [a["outcome"] for a in done["attempt_history"]]
    assert outcomes == ["requeued", "succeeded"]
    assert done["failures"] == 0 and done["preemptions"] == 0
    # Requeue of a succeeded job is refused; so is one of a pending job.
    refused = client.post(f"/api/v1/jobs/{train}/requeue")
    assert refused.status_code == 409
    assert refused.json()["detail"] == (
        f"job {train} is SUCCEEDED: only a running, failed or cancelled job can be requeued"
    )
    # A job that fails until a file exists: FAILED, then requeued, it succeeds under its id.
    marker = tmp_path / "fixed"
    code = f"import os, sys\nsys.exit(0 if os.path.exists({str(marker)!r}) else 3)"
    flaky = submit(client, **python_job("flaky", code))
    failed = wait_for(client, flaky, ["FAILED", "SUCCEEDED"])
    assert failed["status"] == "FAILED" and failed["failures"] == 1
    marker.touch()
    assert client.post(f"/api/v1/jobs/{flaky}/requeue").status_code == 200
    done = wait_for(client, flaky, ["SUCCEEDED", "FAILED"])
    assert done["status"] == "SUCCEEDED"
    assert [a["number"] for a in done["attempt_history"]] == [1, 2]
    assert done["failures"] == 0 and done["exit_code"] == 0
    # Pending: refused.
    blocker = submit(client, **until_file(tmp_path / "go"))
    wait_for(client, blocker, ["RUNNING"])
    waiting = submit(client, **python_job("waiting", "pass"))
    refused = client.post(f"/api/v1/jobs/{waiting}/requeue")
    assert refused.status_code == 409 and "PENDING" in refused.json()["detail"]
    (tmp_path / "go").touch()
    wait_for(client, waiting, ["SUCCEEDED"])


def test_an_array_runs_at_most_its_cap_at_once_each_task_its_index(
    data_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "array"
    out.mkdir()
    code = (
        "import json, os, time\n"
        "start = time.time(); time.sleep(0.8)\n"
        f"path = os.path.join({str(out)!r}, os.environ['CORRAL_ARRAY_INDEX'])\n"
        "json.dump({'start': start, 'end': time.time(), 'array': "
        "os.environ['CORRAL_ARRAY_JOB_ID'], 'job': os.environ['CORRAL_JOB_ID']}, open(path, 'w'))"
    )
    running = start_server(data_dir, gpus=6)
    try:
        client = api(running.url, admin_token(data_dir))
        answer = client.post("/api/v1/jobs", json=python_job("arr", code, array="0-5%2"))
        assert answer.status_code == 201, answer.text
        first = answer.json()["id"]
        ids = answer.json()["array_tasks"]
        assert ids == [str(int(first) + i) for i in range(6)]
        last = job(client, ids[5])
        assert last["name"] == "arr[5]" and last["array_id"] == first and last["array_index"] == 5
        wait_until(lambda: job(client, ids[5])["reason"] == "array cap 2 reached", "the cap")
        for job_id in ids:
            assert wait_for(client, job_id)["status"] == "SUCCEEDED"
    finally:
        running.stop()
    runs = {int(p.name): json.loads(p.read_text()) for p in out.iterdir()}
    assert sorted(runs) == [0, 1, 2, 3, 4, 5]
    for index, run in runs.items():
        assert run["array"] == first and run["job"] == ids[index]
    # Never more than 2 at once: at each start, count the runs that cover that instant.
    for run in runs.values():
        overlapping = [r for r in runs.values() if r["start"] <= run["start"] < r["end"]]
        assert len(overlapping) <= 2, runs


def test_dependencies_a_failed_parent_fails_the_child_a_succeeded_one_starts_it(
    one_gpu: RunningServer, data_dir: Path, tmp_path: Path
) -> None:
    client = api(one_gpu.url, admin_token(data_dir))
    ran = tmp_path / "child-ran"
    child_code = f"open({str(ran)!r}, 'w').write('ran')"
    parent = submit(client, **python_job("parent", "import sys; sys.exit(2)"))
    child = submit(client, **python_job("child", child_code, after=[int(parent)]))
    assert job(client, child)["reason"] in (
        f"waiting for {parent} to succeed",
        "submitted: waiting for the next scheduling round",
        "waiting at a gate: checked at the next round",
    )
    found = wait_for(client, child, ["FAILED", "SUCCEEDED"])
    assert found["status"] == "FAILED"
    assert found["reason"] == f"dependency {parent} failed"
    assert found["attempts"] == 0 and not ran.exists()
    good = submit(client, **python_job("good", "import time; time.sleep(1)"))
    after_good = submit(client, **python_job("after-good", child_code, after=[good]))
    wait_until(
        lambda: job(client, after_good)["reason"] == f"waiting for {good} to succeed", "a reason"
    )
    done = wait_for(client, after_good)
    assert done["status"] == "SUCCEEDED" and ran.exists()
    assert done["started_at"] >= job(client, good)["finished_at"]


def test_signal_before_the_time_limit_reaches_the_job_then_it_ends_at_its_limit(
    one_gpu: RunningServer, data_dir: Path, tmp_path: Path
) -> None:
    client = api(one_gpu.url, admin_token(data_dir))
    seen = tmp_path / "usr1"
    code = (
        "import signal, time\n"
        f"def warned(number, frame):\n    open({str(seen)!r}, 'w').write(str(time.time()))\n"
        "signal.signal(signal.SIGUSR1, warned)\n"
        "start = time.time()\n"
        "while True: time.sleep(0.05)\n"
    )
    spec = python_job("limited", code, time_limit=5, signal_before_limit="USR1@3")
    job_id = submit(client, **spec)
    done = wait_for(client, job_id, ["FAILED", "SUCCEEDED"])
    assert done["status"] == "FAILED" and done["reason"].startswith("time limit: ran")
    assert seen.exists()  # the job caught SIGUSR1 (a default action would have killed it)
    events = [e for e in done["events"] if e["kind"] == "signal"]
    assert len(events) == 1 and events[0]["message"].startswith("sent SIGUSR1 to attempt 1")
    started = next(e["at"] for e in done["events"] if e["kind"] == "started")
    assert 1.0 <= float(seen.read_text()) - started <= 4.5  # about 2 s in (5 - 3), not at the end


def test_a_higher_level_starts_first(
    one_gpu: RunningServer, data_dir: Path, tmp_path: Path
) -> None:
    client = api(one_gpu.url, admin_token(data_dir))
    go = tmp_path / "go"
    # The blocker is level 5 too: under las a higher level may preempt, and high must wait.
    blocker = submit(client, **until_file(go), level=5)
    wait_for(client, blocker, ["RUNNING"])
    low = submit(client, **python_job("low", "pass"))
    high = submit(client, **python_job("high", "pass", level=5))
    queue = client.get("/api/v1/queue").json()["jobs"]
    assert [j["id"] for j in queue] == [high, low]
    go.touch()
    low_done, high_done = wait_for(client, low), wait_for(client, high)
    assert high_done["started_at"] < low_done["started_at"]


def test_bad_input_is_refused_with_one_line_naming_the_field(
    one_gpu: RunningServer, data_dir: Path
) -> None:
    client = api(one_gpu.url, admin_token(data_dir))
    cases = [
        ({"array": "1-x"}, "array: must be indexes such as 0-99, 1,3,5-7 or 0-99%10"),
        ({"array": "0-20000"}, "array: at most 10000 tasks"),
        ({"array": "0-3%0"}, "array: the cap after '%' must be at least 1"),
        ({"after": [999]}, "after.0: no job 999"),
        ({"after": ["x"]}, "after.0: must be a job id (a positive integer)"),
        ({"level": "high"}, "level: must be an integer from -1000000 to 1000000"),
        ({"signal_before_limit": "USR1@10"}, "signal_before_limit: needs time_limit"),
    ]
    for extra, message in cases:
        answer = client.post("/api/v1/jobs", json=python_job("bad", "pass", **extra))
        assert answer.status_code == 422, (extra, answer.text)
        assert answer.json()["detail"].startswith(message), answer.text
    assert client.get("/api/v1/jobs").json() == []  # nothing stored
    assert client.post("/api/v1/jobs/999/hold").status_code == 404
    assert client.post("/api/v1/jobs/999/release").status_code == 404
    assert client.post("/api/v1/jobs/999/requeue").status_code == 404
    plain = submit(client, **python_job("plain", "pass"))
    answer = client.post(f"/api/v1/jobs/{plain}/cancel", params={"array": "true"})
    assert answer.status_code == 422
    assert answer.json()["detail"] == f"array: job {plain} is not the id of a job array"
    assert sys.executable  # (python_job runs this interpreter)
