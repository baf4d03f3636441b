"""A job ElasticFlow refuses, through a real `corral up --policy elasticflow` (a process of its
own, SQLite, the local executor): REFUSED in the store with its reason and event, in the API's
listings and filters, in `corral ls --status refused`, in /metrics, never started, and still
REFUSED after the manager is killed and started again.

The refusal, worked out by hand: 2 GPUs, no measured throughput (every job runs at speed 1.0 on
the GPUs it asks for). "late" asks for 1 GPU, not elastic, and its work is its `time_limit`,
3600 s; its deadline is 60 s after its submission. On its only count, 1 GPU, it needs 3600 s > 60
s even alone on the empty cluster: refused, "its deadline (in 60s) cannot be met even on 1 GPUs
of an empty cluster". "ontime" (1 GPU, 600 s of work due in 3600 s) fits: admitted, it runs. "gated" is "late" again,
waiting for a job of a few seconds (`after:`): when its gate opens it is judged as if submitted
then, and refused as well.
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.server.helpers import Corral, job, kill_jobs_of, python_job, submit, wait_for

REFUSAL = "refused: its deadline (in 60s) cannot be met even on 1 GPUs of an empty cluster"
SLEEPER = "import time; time.sleep(600)"


def corral_cli(up: Corral, *args: str) -> subprocess.CompletedProcess[str]:
    """`corral ARGS` as a user's shell runs it, against the manager `up`."""
    token = (up.data_dir / "admin.token").read_text().strip()
    env = {**os.environ, "CORRAL_URL": up.url, "CORRAL_TOKEN": token}
    return subprocess.run(
        [sys.executable, "-m", "corral.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def stored(data_dir: Path, job_id: str) -> dict[str, Any]:
    """The job's row and events as the database holds them (read beside the manager)."""
    with sqlite3.connect(f"file:{data_dir / 'corral.db'}?mode=ro", uri=True) as db:
        db.row_factory = sqlite3.Row
        row = dict(db.execute("SELECT * FROM jobs WHERE id = ?", (int(job_id),)).fetchone())
        row["events"] = [
            (e["kind"], e["message"])
            for e in db.execute(
                "SELECT kind, message FROM events WHERE job_id = ? ORDER BY id", (int(job_id),)
            )
        ]
        row["attempt_rows"] = db.execute(
            "SELECT COUNT(*) FROM attempts WHERE job_id = ?", (int(job_id),)
        ).fetchone()[0]
    return row


def metric(client: httpx.Client, family: str, sample: str) -> dict[tuple, float]:
    text = client.get("/metrics")
    assert text.status_code == 200, text.text
    return {
        tuple(sorted(s.labels.items())): s.value
        for f in text_string_to_metric_families(text.text)
        if f.name == family
        for s in f.samples
        if s.name == sample
    }


def assert_refused(client: httpx.Client, up: Corral, late: str) -> None:
    found = job(client, late)
    assert (found["status"], found["reason"]) == ("REFUSED", REFUSAL), found
    assert found["attempts"] == 0 and found["attempt_history"] == [] and found["started_at"] is None
    assert found["finished_at"] == found["submitted_at"]
    assert [e["kind"] for e in found["events"]] == ["submitted", "refused"]
    row = stored(up.data_dir, late)
    assert (row["status"], row["reason"], row["attempts"]) == ("REFUSED", REFUSAL, 0)
    assert row["finished_at"] is not None and row["attempt_rows"] == 0
    assert row["events"][-1] == ("refused", REFUSAL)
    listed = client.get("/api/v1/jobs", params={"status": "refused"}).json()
    assert late in {j["id"] for j in listed} and {j["status"] for j in listed} == {"REFUSED"}
    assert late not in {j["id"] for j in client.get("/api/v1/queue").json()["jobs"]}


def test_a_refused_job_is_refused_in_the_store_api_cli_metrics_and_after_a_restart(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "corral"
    up = Corral(data_dir, "--gpus", "2", "--policy", "elasticflow")
    try:
        client = up.start()
        answer = client.post(
            "/api/v1/jobs",
            json=python_job("late", SLEEPER, time_limit=3600, deadline=60),
        )
        assert answer.status_code == 201, answer.text
        late = answer.json()["id"]
        assert (answer.json()["status"], answer.json()["reason"]) == ("REFUSED", REFUSAL)
        ontime = submit(client, **python_job("ontime", SLEEPER, time_limit=600, deadline=3600))
        child = submit(client, **python_job("child", "pass", after=[int(late)]))
        wait_for(client, ontime, ["RUNNING"])
        failed = wait_for(client, child)
        assert (failed["status"], failed["reason"]) == ("FAILED", f"dependency {late} was refused")
        # A job that waited at a gate is judged when the gate opens, as if submitted then: the
        # same 3600 s of work, due 60 s after its submission, cannot be done in what is left.
        parent = submit(client, **python_job("parent", "pass"))
        gated = submit(
            client,
            **python_job("gated", SLEEPER, time_limit=3600, deadline=60, after=[int(parent)]),
        )
        refused = wait_for(client, gated, ["REFUSED", "RUNNING"])
        assert refused["status"] == "REFUSED" and refused["attempts"] == 0, refused
        assert re.fullmatch(
            r"refused: its deadline \(in \d+s\) cannot be met even on 1 GPUs of an empty cluster",
            refused["reason"],
        )
        assert [e["kind"] for e in refused["events"]] == ["submitted", "refused"]
        assert stored(up.data_dir, gated)["status"] == "REFUSED"
        assert_refused(client, up, late)

        listed = corral_cli(up, "ls", "--status", "refused")
        assert listed.returncode == 0, listed.stderr
        rows = [line.split()[:5] for line in listed.stdout.splitlines()[1:]]
        assert rows == [
            [gated, "gated", "admin", "default", "REFUSED"],
            [late, "late", "admin", "default", "REFUSED"],
        ], listed.stdout
        cancel = corral_cli(up, "cancel", late)
        assert cancel.returncode == 1
        assert cancel.stderr == f"error: job {late} already ended (REFUSED); nothing to cancel\n"
        assert job(client, late)["status"] == "REFUSED"
        spec = tmp_path / "late.yaml"
        spec.write_text(
            "name: late2\ngpus: 1\ncommand: 'sleep 600'\ntime_limit: 3600\ndeadline: 60\n"
        )
        again = corral_cli(up, "submit", str(spec))
        assert again.returncode == 1 and again.stdout.strip().isdigit(), again
        assert again.stderr == (
            f"error: job {again.stdout.strip()} was refused: {REFUSAL.removeprefix('refused: ')}\n"
        )

        assert metric(client, "corral_jobs", "corral_jobs")[(("state", "REFUSED"),)] == 3
        assert metric(client, "corral_jobs_finished", "corral_jobs_finished_total") == {
            (("status", "REFUSED"), ("user", "admin"), ("vc", "default")): 3,
            (("status", "FAILED"), ("user", "admin"), ("vc", "default")): 1,
            (("status", "SUCCEEDED"), ("user", "admin"), ("vc", "default")): 1,
            (("status", "CANCELLED"), ("user", "admin"), ("vc", "default")): 0,  # (from the start)
        }
        usage = client.get("/api/v1/usage", params={"since": 0}).json()
        assert usage["total"]["finished"]["REFUSED"] == 3

        # Killed and started again: the refused job is not recovered, never starts, and stays
        # REFUSED while the new manager runs rounds (a job submitted after the restart runs).
        up.kill()
        client = up.start()
        probe = submit(client, **python_job("probe", "pass"))
        assert wait_for(client, probe)["status"] == "SUCCEEDED"
        assert job(client, ontime)["status"] == "RUNNING"  # found again, still running
        assert_refused(client, up, late)
        assert metric(client, "corral_jobs", "corral_jobs")[(("state", "REFUSED"),)] == 3
    finally:
        up.stop()
        kill_jobs_of(data_dir)
