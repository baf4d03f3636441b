"""Jobs tell the live manager how they are doing (docs/progress.md): progress, measured
throughput per placement shape, hang detection, time limits and the lengths sjf orders by.
Real job processes, a real SQLite file, HTTP on loopback."""

from __future__ import annotations

from pathlib import Path

from corral.server.boot import RunningServer
from tests.server.helpers import (
    admin_token,
    api,
    job,
    start_server,
    submit,
    train_job,
    wait_for,
    wait_until,
)


def serve(data_dir: Path, **options: object) -> RunningServer:
    return start_server(data_dir, progress_check_s=0.1, **options)  # type: ignore[arg-type]


def test_progress_is_shown_and_the_models_throughput_is_stored(data_dir: Path) -> None:
    server = serve(data_dir, gpus=1)
    try:
        client = api(server.url, admin_token(data_dir))
        job_id = submit(client, **train_job("fit", 400, 0.02, total_steps=400, model="linear"))
        # train.py appends its reports by hand, as a program in any language would.
        running = wait_until(
            lambda: (
                (found := job(client, job_id))["progress"]
                and found["progress"]["steps_per_s"]
                and found
            ),
            "a measured rate",
        )
        progress = running["progress"]
        assert progress["total_steps"] == 400
        assert 0 < progress["step"] <= 400
        # 0.02 s of sleep per step: at most 50 steps/s, whatever the machine's load.
        assert 0 < progress["steps_per_s"] <= 50
        assert progress["eta_s"] is not None and progress["eta_s"] >= 0
        assert progress["loss"] is not None
        done = wait_for(client, job_id)
        assert done["status"] == "SUCCEEDED"
        detail = job(client, job_id)
        assert detail["progress"]["step"] == 400
        assert detail["progress_history"], "the loss curve is kept"
        steps = [point["step"] for point in detail["progress_history"]]
        assert steps == sorted(steps)
        (profile,) = detail["throughput"]
        assert (profile["model"], profile["gpu_type"], profile["gpus"]) == ("linear", "gpu", 1)
        assert 0 < profile["steps_per_s"] <= 50 and profile["runs"] == 1
        listed = client.get("/api/v1/profiles").json()
        assert [row["model"] for row in listed] == ["linear"]
    finally:
        server.stop()


def test_a_job_that_stops_reporting_is_stopped_and_retried_as_a_hang(data_dir: Path) -> None:
    server = serve(data_dir, gpus=1)
    try:
        client = api(server.url, admin_token(data_dir))
        spec = train_job("stuck", 1000, 0.02, progress_timeout=2, env={"HANG_AT_STEP": "5"})
        spec["env"] |= {"TRAIN_STEPS": "1000", "STEP_SECONDS": "0.02"}
        job_id = submit(client, **spec)

        def second_attempt() -> dict | None:
            found = job(client, job_id)
            return found if len(found["attempt_history"]) >= 2 else None

        found = wait_until(second_attempt, "a retry after the hang")
        first = found["attempt_history"][0]
        assert first["outcome"] == "lost"  # the infrastructure's: max_retries 0 is not used up
        assert first["reason"].startswith("hung: no progress report for")
        assert "progress_timeout 2 s" in first["reason"]
        assert any(e["kind"] == "stopping" for e in found["events"])
        client.post(f"/api/v1/jobs/{job_id}/cancel")
        assert wait_for(client, job_id)["status"] == "CANCELLED"
    finally:
        server.stop()


def test_a_job_past_its_time_limit_fails_without_a_retry(data_dir: Path) -> None:
    server = serve(data_dir, gpus=1)
    try:
        client = api(server.url, admin_token(data_dir))
        job_id = submit(client, **train_job("long", 100000, 0.05, time_limit=1, max_retries=3))
        done = wait_for(client, job_id)
        assert done["status"] == "FAILED"
        assert done["reason"].startswith("time limit: ran"), done["reason"]
        assert done["attempts"] == 1
    finally:
        server.stop()


def test_srtf_preempts_for_a_shorter_declared_length_and_refuses_jobs_without_one(
    data_dir: Path,
) -> None:
    server = serve(data_dir, gpus=1, policy="srtf")
    try:
        client = api(server.url, admin_token(data_dir))
        refused = client.post("/api/v1/jobs", json=train_job("vague", 5))
        assert refused.status_code == 422
        assert refused.json()["detail"].startswith("time_limit: policy srtf orders jobs by")
        # 3600 s declared against 60 s: srtf preempts the long job for the short one.
        long = submit(client, **train_job("long", 100000, 0.05, time_limit=3600))
        wait_for(client, long, ["RUNNING"])
        short = submit(client, **train_job("short", 5, 0.01, time_limit=60))
        assert wait_for(client, short)["status"] == "SUCCEEDED"
        found = job(client, long)
        assert found["preemptions"] == 1
        assert any(e["message"] == f"preempted by job {short}" for e in found["events"])
        client.post(f"/api/v1/jobs/{long}/cancel")
        assert wait_for(client, long)["status"] == "CANCELLED"
    finally:
        server.stop()


def test_sjf_orders_by_the_declared_time_limit_and_refuses_jobs_without_one(
    data_dir: Path,
) -> None:
    server = serve(data_dir, gpus=1, policy="sjf")
    try:
        client = api(server.url, admin_token(data_dir))
        refused = client.post("/api/v1/jobs", json=train_job("vague", 5))
        assert refused.status_code == 422
        assert refused.json()["detail"] == (
            "time_limit: policy sjf orders jobs by their length: give time_limit (seconds) or "
            "total_steps"
        )
        blocker = submit(client, **train_job("blocker", 100000, 0.05, time_limit=3600))
        wait_for(client, blocker, ["RUNNING"])
        long = submit(client, **train_job("long", 5, 0.01, time_limit=600))
        short = submit(client, **train_job("short", 5, 0.01, time_limit=60))
        client.post(f"/api/v1/jobs/{blocker}/cancel")
        first = wait_for(client, short, ["RUNNING", "SUCCEEDED"])
        assert job(client, long)["started_at"] is None or (
            job(client, long)["started_at"] >= first["started_at"]
        )
        assert wait_for(client, long)["status"] == "SUCCEEDED"
        assert job(client, long)["started_at"] >= job(client, short)["finished_at"]
    finally:
        server.stop()


def test_lines_that_are_not_reports_are_counted_and_shown_not_fatal(data_dir: Path) -> None:
    server = serve(data_dir, gpus=1)
    try:
        client = api(server.url, admin_token(data_dir))
        # Two bad lines among good ones, then it waits for the test to let it end.
        lines = 'not json\\n{"step": "x"}\\n{"step": 1}\\n{"step": 2, "loss": 0.5}\\n'
        gate = data_dir / "gate"
        command = (
            f"printf '{lines}' >> \"$CORRAL_PROGRESS_FILE\"; "
            f"while [ ! -e {gate} ]; do sleep 0.05; done"
        )
        job_id = submit(client, name="sloppy", gpus=1, command=command)
        found = wait_until(
            lambda: (
                (d := job(client, job_id))["progress_problems"]
                and (d["progress"] or {}).get("step") == 2
                and d
            ),
            "the reports read",
        )
        problems = found["progress_problems"]
        assert problems["malformed_lines"] == 2
        assert "line 2" in problems["last_error"]  # the latest problem: step is not a number
        assert found["progress"]["loss"] == 0.5
        gate.write_text("")
        assert wait_for(client, job_id)["status"] == "SUCCEEDED"
    finally:
        server.stop()
