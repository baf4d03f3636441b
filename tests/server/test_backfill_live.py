"""EASY backfill in `corral up` (`--backfill easy`): real job processes (local executor), a real
SQLite file, HTTP on loopback. The head of fifo's queue gets a reservation by the running jobs'
`time_limit`s; a later job starts before it only if its own `time_limit` ends by then."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from corral.cli.main import app
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


def sleeper(name: str, gpus: int, seconds: float, limit: float) -> dict[str, Any]:
    return {
        "name": name,
        "gpus": gpus,
        "command": f"exec sleep {seconds}",
        "time_limit": limit,
        "grace_seconds": 1,
    }


def test_easy_backfill_starts_the_short_job_and_never_delays_the_head(
    data_dir: Path, tmp_path: Path
) -> None:
    # One node of 3 GPUs, fifo, placement any. A (2 GPUs, sleeps 8 s, time_limit 30 s) runs.
    # H (3 GPUs) cannot start: the head. Released by its limit, A frees its GPUs by
    # A's start + 30 s: the shadow time, and H's reservation is all 3 GPUs. L (1 GPU, time_limit
    # 120 s) would hold the free GPU past the shadow time: it waits, "would delay job H". S
    # (1 GPU, time_limit 5 s) ends by the shadow time (it starts within 25 s of A): it runs at
    # once. A ends after 8 s and H starts then, not later than its shadow time; L starts only
    # after H (H holds all 3 GPUs until it ends).
    server = start_server(data_dir, gpus=3, policy="fifo", placement="any", backfill="easy")
    try:
        client = api(server.url, admin_token(data_dir))
        first = submit(client, **sleeper("A", 2, 8, 30))
        wait_for(client, first, ["RUNNING"])
        head = submit(client, **sleeper("H", 3, 1, 60))
        long = submit(client, **sleeper("L", 1, 1, 120))
        short = submit(client, **sleeper("S", 1, 0.5, 5))
        delays = f"would delay job {head} reserved at t="

        def decided() -> dict[str, Any] | None:
            found = job(client, long)
            return found if found["attempts"] or delays in found["reason"] else None

        waiting = wait_until(decided, "L waiting for the head's reservation (or started)")
        assert waiting["attempts"] == 0, waiting
        assert wait_for(client, short)["status"] == "SUCCEEDED"
        assert wait_for(client, head)["status"] == "SUCCEEDED"
        assert wait_for(client, long)["status"] == "SUCCEEDED"
        a, h, lj, s = (job(client, j) for j in (first, head, long, short))
        assert s["started_at"] < h["started_at"]  # the short job backfilled
        assert h["started_at"] <= a["started_at"] + 30  # the head kept its reservation
        assert lj["started_at"] >= h["started_at"]  # the long one did not pass it
    finally:
        server.stop()
        kill_jobs_of(data_dir)
    # `corral export-trace` (each job's time_limit_s with its spec), then the `corral simulate`
    # it prints: the replay starts the jobs in the manager's order, S before H, L after it.
    by_id = {first: "A", head: "H", long: "L", short: "S"}
    out = tmp_path / "history.corral.jsonl"
    exported = CliRunner().invoke(
        app, ["export-trace", "--data-dir", str(data_dir), "--out", str(out)]
    )
    assert exported.exit_code == 0, exported.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    limits = {r["id"]: r["time_limit_s"] for r in records if r["kind"] == "job"}
    assert limits[long] == 120 and limits[short] == 5
    printed = " ".join(exported.output.split())
    args = [*shlex.split(printed.split("replay with: ", 1)[1])[1:], "--out", str(tmp_path / "sim")]
    simulated = CliRunner().invoke(app, args)
    assert simulated.exit_code == 0, simulated.output

    def first_starts(path: Path) -> list[str]:
        order: list[str] = []
        for record in map(json.loads, path.read_text().splitlines()):
            name = by_id[str(record["job"])]
            if record["action"] == "start" and name not in order:
                order.append(name)
        return order

    (replayed,) = sorted((tmp_path / "sim").glob("decisions-*.jsonl"))
    live = first_starts(out.with_name("history.decisions.jsonl"))
    assert live == ["A", "S", "H", "L"]
    assert first_starts(replayed) == live


def test_greedy_backfill_lets_the_long_job_delay_the_head(data_dir: Path) -> None:
    # The same queue under greedy: L takes the free GPU at once and holds it for 15 s, so H,
    # needing all 3, starts only after L ends, though A ended after 3 s.
    server = start_server(data_dir, gpus=3, policy="fifo", placement="any", backfill="greedy")
    try:
        client = api(server.url, admin_token(data_dir))
        first = submit(client, **sleeper("A", 2, 3, 30))
        wait_for(client, first, ["RUNNING"])
        head = submit(client, **sleeper("H", 3, 0.5, 60))
        long = submit(client, **sleeper("L", 1, 15, 120))
        assert wait_for(client, head)["status"] == "SUCCEEDED"
        h, lj = job(client, head), job(client, long)
        assert lj["started_at"] < h["started_at"]
        assert h["started_at"] >= lj["finished_at"]
    finally:
        server.stop()
        kill_jobs_of(data_dir)
