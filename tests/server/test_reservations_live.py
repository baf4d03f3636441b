"""Reservations in `corral up`: real job processes (local executor), a real SQLite file, HTTP on
loopback, the `corral reservation` commands against the running manager. A maintenance window
on one of two GPUs is honoured, and jobs backfill around it by their time limits."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
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

LEAD_S = 25.0  # the window opens this long after it is made (S starts well before)
WINDOW_S = 10.0


def sleeper(name: str, seconds: float, limit: float | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name,
        "gpus": 1,
        "command": f"exec sleep {seconds}",
        "grace_seconds": 1,
    }
    if limit is not None:
        spec["time_limit"] = limit
    return spec


def test_a_maintenance_window_is_honoured_with_backfill_around_it(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two GPUs, fifo with greedy backfill, placement any (the lowest free GPUs first). `corral
    # reservation create maint --gpus 1` keeps one GPU (the node's first, device 0) for no one
    # from LEAD_S from now for WINDOW_S. Then L (sleeps 45 s, time_limit 90 s) would run into
    # the window on device 0: it starts on device 1. S (sleeps 1 s, time_limit 5 s) ends before
    # the window opens: it starts on device 0. U (sleeps 1 s, no time_limit) is unbounded: it
    # waits, its reason naming the reservation, and starts when the window closes (L holds
    # device 1 until well after).
    server = start_server(data_dir, gpus=2, policy="fifo", placement="any", backfill="greedy")
    try:
        token = admin_token(data_dir)
        monkeypatch.setenv("CORRAL_URL", server.url)
        monkeypatch.setenv("CORRAL_TOKEN", token)
        client = api(server.url, token)
        made = CliRunner().invoke(
            app,
            [
                "reservation",
                "create",
                "maint",
                "--gpus",
                "1",
                "--start",
                f"+{LEAD_S:g}s",
                "--duration",
                f"{WINDOW_S:g}s",
            ],
        )
        assert made.exit_code == 0, made.output
        (reservation,) = client.get("/api/v1/reservations").json()
        assert reservation["state"] == "waiting" and reservation["gpus"][0].endswith("/0")
        listed = CliRunner().invoke(app, ["reservation", "ls"])
        assert listed.exit_code == 0 and "maint" in listed.output, listed.output
        reserved = reservation["gpus"][0]

        long = submit(client, **sleeper("L", 45, 90))
        short = submit(client, **sleeper("S", 1, 5))
        unbounded = submit(client, **sleeper("U", 1, None))
        placed_long = wait_for(client, long, ["RUNNING"])["placement"]
        assert reserved not in str(placed_long), placed_long

        def waiting_for_window() -> dict[str, Any] | None:
            found = job(client, unbounded)
            return found if "reservation maint" in found["reason"] or found["attempts"] else None

        assert wait_until(waiting_for_window, "U held back by the window")["attempts"] == 0
        assert wait_for(client, short)["status"] == "SUCCEEDED"
        assert wait_for(client, unbounded)["status"] == "SUCCEEDED"
        s, u = job(client, short), job(client, unbounded)
        assert s["started_at"] < reservation["start"]
        assert u["started_at"] >= reservation["end"]
        assert job(client, long)["status"] == "RUNNING"  # not U's way in: it holds device 1

        # Refused in one line: a name taken, GPUs another reservation claims in that window,
        # both a count and nodes.
        node = reserved.split("/")[0]
        again = {"start": reservation["start"], "duration": 5}
        taken = client.post("/api/v1/reservations", json={"name": "maint", "gpus": 1, **again})
        assert taken.status_code == 409, taken.text
        overlap = client.post(
            "/api/v1/reservations", json={"name": "other", "nodes": [node], **again}
        )
        assert overlap.status_code == 409 and "reserved" in overlap.text, overlap.text
        both = client.post(
            "/api/v1/reservations", json={"name": "x", "gpus": 1, "nodes": [node], **again}
        )
        assert both.status_code == 422, both.text
        # A restarted manager keeps it (the store's reservations table).
        server.stop()
        server = start_server(data_dir, gpus=2, policy="fifo", placement="any", backfill="greedy")
        client = api(server.url, token)
        monkeypatch.setenv("CORRAL_URL", server.url)
        (kept,) = client.get("/api/v1/reservations").json()
        assert (kept["name"], kept["gpus"], kept["state"]) == ("maint", [reserved], "ended")

        made = CliRunner().invoke(
            app,
            [
                "reservation",
                "create",
                "tmp",
                "--nodes",
                node,
                "--start",
                "+1h",
                "--duration",
                "10m",
                "--users",
                "alice",
                "--vc",
                "a",
            ],
        )
        assert made.exit_code == 0 and "2 GPUs for alice, VC a" in made.output, made.output
        deleted = CliRunner().invoke(app, ["reservation", "delete", "tmp"])
        assert deleted.exit_code == 0, deleted.output
        assert [r["name"] for r in client.get("/api/v1/reservations").json()] == ["maint"]
        assert client.delete("/api/v1/reservations/tmp").status_code == 404
        assert wait_for(client, long)["status"] == "SUCCEEDED"
    finally:
        server.stop()
        kill_jobs_of(data_dir)
    # `corral export-trace` records the reservation; the `corral simulate` it prints makes it in
    # the replay's scheduler and starts the jobs as the manager did: L, S, then U once the
    # window closed.
    by_id = {long: "L", short: "S", unbounded: "U"}
    out = tmp_path / "history.corral.jsonl"
    exported = CliRunner().invoke(
        app, ["export-trace", "--data-dir", str(data_dir), "--out", str(out)]
    )
    assert exported.exit_code == 0, exported.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    (recorded,) = [r for r in records if r["kind"] == "reservation"]
    assert (recorded["name"], recorded["gpus"], recorded["users"]) == ("maint", [reserved], [])
    printed = " ".join(exported.output.split())
    args = [*shlex.split(printed.split("replay with: ", 1)[1])[1:], "--out", str(tmp_path / "sim")]
    simulated = CliRunner().invoke(app, args)
    assert simulated.exit_code == 0, simulated.output

    def starts(path: Path) -> dict[str, float]:
        first: dict[str, float] = {}
        for record in map(json.loads, path.read_text().splitlines()):
            if record["action"] == "start":
                first.setdefault(by_id[str(record["job"])], record["at"])
        return first

    (replayed,) = sorted((tmp_path / "sim").glob("decisions-*.jsonl"))
    live, again = starts(out.with_name("history.decisions.jsonl")), starts(replayed)
    assert sorted(live, key=live.__getitem__) == ["L", "S", "U"]
    assert sorted(again, key=again.__getitem__) == ["L", "S", "U"]
    window_end = recorded["start"] + recorded["duration"]
    assert again["S"] < recorded["start"] and again["U"] >= window_end


def test_a_reservation_by_count_takes_the_gpu_free_when_its_window_opens(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two GPUs of one node, fifo, placement any: A (sleeps 60 s, time_limit 90 s) starts on
    # device 0 and, by its limit, may run until 90 s from now. `--gpus 1` for a window from 20 s
    # on: device 0 is busy into it, device 1 idle, so device 1 is reserved (by node order alone,
    # the node's first GPU, device 0, would be).
    server = start_server(data_dir, gpus=2, policy="fifo", placement="any")
    try:
        token = admin_token(data_dir)
        monkeypatch.setenv("CORRAL_URL", server.url)
        monkeypatch.setenv("CORRAL_TOKEN", token)
        client = api(server.url, token)
        busy = submit(client, **sleeper("A", 60, 90))
        assert str(wait_for(client, busy, ["RUNNING"])["placement"]).endswith("/0']")
        args = ["reservation", "create", "demo", "--gpus", "1", "--start", "+20s"]
        made = CliRunner().invoke(app, [*args, "--duration", "5s"])
        assert made.exit_code == 0, made.output
        (reservation,) = client.get("/api/v1/reservations").json()
        assert reservation["gpus"][0].endswith("/1"), reservation
        client.post(f"/api/v1/jobs/{busy}/cancel")
    finally:
        server.stop()
        kill_jobs_of(data_dir)
