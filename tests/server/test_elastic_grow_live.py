"""ElasticFlow grows a running elastic job in `corral up` when GPUs come free: real job processes
(local executor), a real SQLite file, HTTP on loopback, the real clock. The job starts on fewer
GPUs than its maximum because others hold them; each time a holder ends, it is restarted on the
next count of its curve that fits (powers of two), and only then."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.server.helpers import (
    admin_token,
    api,
    job,
    kill_jobs_of,
    start_server,
    submit,
    wait_for,
    wait_until,
)


def sleeper(name: str, gpus: int, **fields: Any) -> dict[str, Any]:
    return {"name": name, "gpus": gpus, "command": "exec sleep 3600", "grace_seconds": 1, **fields}


def running_gpus(found: dict[str, Any]) -> int:
    """GPUs of the job's running attempt (0 when none runs)."""
    live = [a for a in found["attempt_history"] if a["state"] != "ended"]
    return len(live[-1]["gpus"]) if live and found["status"] == "RUNNING" else 0


def on_gpus(client: Any, job_id: str, gpus: int) -> dict[str, Any]:
    """The job once its running attempt holds `gpus` GPUs."""

    def check() -> dict[str, Any] | None:
        found = job(client, job_id)
        return found if running_gpus(found) == gpus else None

    return dict(wait_until(check, f"job {job_id} running on {gpus} GPUs", timeout=60))


def ended_at(client: Any, job_id: str) -> float:
    """When the job's last attempt ended (its processes gone), once it has."""
    assert wait_for(client, job_id)["status"] == "CANCELLED"
    last = wait_until(
        lambda: (a := job(client, job_id)["attempt_history"][-1])["state"] == "ended" and a,
        f"job {job_id}'s attempt ended",
    )
    return float(last["ended_at"])


def test_an_elastic_job_grows_to_the_next_power_of_two_as_gpus_come_free(data_dir: Path) -> None:
    # Four GPUs of one machine, policy elasticflow, restore_s 30 (the default). No job has a
    # deadline: all are best effort, and GPUs go one step of a curve at a time to the job that
    # gains most per GPU; a running job keeps what it holds. E's curve: 1, 2, 4 GPUs (powers of
    # two up to its max 4), unmeasured so perfectly scaling (speeds 1, 2, 4). By hand:
    # 1. X (2 GPUs) and Y (1 GPU) run. E (elastic 1..4, time_limit 600 s: 600 s of work) gets
    #    the one GPU left: it starts on 1.
    # 2. X ends: 2 GPUs free. E's next step, 1 -> 2, takes one of them; the step after, 2 -> 4,
    #    needs 2 more and only 1 is free. Growing is worth its restart: 30 + W / 2 < W / 1 for
    #    its W of about 590 s left. E is restarted on 2 GPUs (not 3: not on its curve, not 4).
    # 3. Y ends: 2 GPUs free; 2 -> 4 is worth it (30 + W / 4 < W / 2 for W above 120 s): E is
    #    restarted on 4.
    # A manager that never grows a running job leaves E on 1 GPU with 3 idle.
    server = start_server(data_dir, gpus=4, policy="elasticflow")
    try:
        client = api(server.url, admin_token(data_dir))
        x = submit(client, **sleeper("X", 2))
        wait_for(client, x, ["RUNNING"])
        y = submit(client, **sleeper("Y", 1))
        wait_for(client, y, ["RUNNING"])
        elastic = {"min_gpus": 1, "max_gpus": 4}
        e = submit(client, **sleeper("E", 1, elastic=elastic, time_limit=600))
        started = wait_for(client, e, ["RUNNING"])
        assert running_gpus(started) == 1
        # While X and Y hold their GPUs, E stays on its one (no restart).
        assert job(client, e)["attempts"] == 1

        client.post(f"/api/v1/jobs/{x}/cancel")
        x_end = ended_at(client, x)
        grown = on_gpus(client, e, 2)
        history = grown["attempt_history"]
        assert [len(a["gpus"]) for a in history] == [1, 2]
        assert history[0]["outcome"] == "preempted"
        assert history[1]["started_at"] >= x_end - 1e-3  # after X ended, not before
        assert job(client, y)["attempts"] == 1  # Y kept its GPU

        client.post(f"/api/v1/jobs/{y}/cancel")
        y_end = ended_at(client, y)
        grown = on_gpus(client, e, 4)
        history = grown["attempt_history"]
        assert [len(a["gpus"]) for a in history] == [1, 2, 4]
        assert history[2]["started_at"] >= y_end - 1e-3
        assert len(set(history[2]["gpus"])) == 4
        client.post(f"/api/v1/jobs/{e}/cancel")
        assert wait_for(client, e)["status"] == "CANCELLED"
    finally:
        server.stop()
        kill_jobs_of(data_dir)
