"""Usage accounting (corral.server.usage, GET /api/v1/usage, `corral usage`) on a real store whose
jobs and attempts have known instants, the totals worked out by hand.

The period is [T, T + 10 h). Jobs (H = one hour):

1. alice (a), 2 GPUs, submitted T-2H, first start T-1H; attempt 1 [T-1H, T+1H] (straddles the
   start: 1 h inside x 2 GPUs), attempt 2 [T+3H, T+4H] (2 GPU-h); SUCCEEDED at T+4H.
2. alice (a), half a GPU, submitted T+1H, started T+2H (waited 1 h); [T+2H, T+6H]: 4 h x 0.5 =
   2 GPU-h; FAILED at T+6H.
3. bob (b), 4 GPUs, submitted T+8H, started T+9H (1 h); [T+9H, T+12H] straddles the end: 1 h x 4;
   SUCCEEDED at T+12H, after the period (not counted as ended).
4. bob (b), submitted T+0.5H, never started, CANCELLED at T+5H.
5. carol (a), 1 GPU, submitted T-5H, started T+0.5H (5.5 h = 19,800 s); [T+0.5H, T+1.5H]: 1 GPU-h
   (in the first case its attempt's end was never recorded: its job's end, T+1.5H, counts);
   SUCCEEDED at T+1.5H.
6. bob (b), 8 GPUs, submitted T-2H, started T-1H; [T-1H, T] ends exactly at the start: nothing;
   FAILED at T exactly (counted: the period includes its start).
7. bob (b), wholly before: submitted T-10H, [T-9H, T-8H], SUCCEEDED at T-8H: nothing.
8. alice (a), submitted at T+10H exactly: after the period (it excludes its end).
9. (first case only) dave (b), 1 GPU, submitted and started T+7H (waited 0), still running at
   now = T+9H: 2 GPU-h.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from corral.server.boot import RunningServer
from corral.server.store import Store
from corral.server.usage import nearest_rank, usage_report
from tests.server.helpers import admin_token, api, kill_jobs_of, start_server

T = 1_700_000_000.0
H = 3600.0
SINCE, UNTIL = T, T + 10 * H


def add_job(
    store: Store,
    job_id: int,
    user: str,
    vc: str,
    gpus: float,
    submitted: float,
    status: str,
    started: float | None = None,
    finished: float | None = None,
    attempts: tuple[tuple[float, float | None], ...] = (),
) -> None:
    whole = 1 if gpus < 1 else int(gpus)
    store.insert_job(
        job_id,
        name=f"job{job_id}",
        user=user,
        vc=vc,
        priority="guaranteed",
        gpus=whole,
        spec={"name": f"job{job_id}", "gpus": gpus, "command": "true"},
        submitted_at=submitted,
    )
    store.update_job(
        job_id, status=status, started_at=started, finished_at=finished, attempts=len(attempts)
    )
    for number, (begin, end) in enumerate(attempts, start=1):
        names = [f"node0/{index}" for index in range(whole)]
        store.add_attempt(job_id, number, names, begin, "running")
        if end is not None:
            store.update_attempt(job_id, number, ended_at=end, state="ended", outcome="succeeded")


def fill(store: Store, *, live: bool) -> None:
    """The jobs above; `live`: with carol's attempt open and dave's running job (a manager's
    recovery would close those, so the API's case leaves them out)."""
    add_job(
        store,
        1,
        "alice",
        "a",
        2,
        T - 2 * H,
        "SUCCEEDED",
        T - H,
        T + 4 * H,
        ((T - H, T + H), (T + 3 * H, T + 4 * H)),
    )
    add_job(
        store,
        2,
        "alice",
        "a",
        0.5,
        T + H,
        "FAILED",
        T + 2 * H,
        T + 6 * H,
        ((T + 2 * H, T + 6 * H),),
    )
    add_job(
        store,
        3,
        "bob",
        "b",
        4,
        T + 8 * H,
        "SUCCEEDED",
        T + 9 * H,
        T + 12 * H,
        ((T + 9 * H, T + 12 * H),),
    )
    add_job(store, 4, "bob", "b", 1, T + 0.5 * H, "CANCELLED", None, T + 5 * H)
    carol_end = None if live else T + 1.5 * H
    add_job(
        store,
        5,
        "carol",
        "a",
        1,
        T - 5 * H,
        "SUCCEEDED",
        T + 0.5 * H,
        T + 1.5 * H,
        ((T + 0.5 * H, carol_end),),
    )
    add_job(store, 6, "bob", "b", 8, T - 2 * H, "FAILED", T - H, T, ((T - H, T),))
    add_job(
        store,
        7,
        "bob",
        "b",
        1,
        T - 10 * H,
        "SUCCEEDED",
        T - 9 * H,
        T - 8 * H,
        ((T - 9 * H, T - 8 * H),),
    )
    add_job(store, 8, "alice", "a", 1, UNTIL, "CANCELLED", None, UNTIL + H)
    if live:
        add_job(
            store, 9, "dave", "b", 1, T + 7 * H, "RUNNING", T + 7 * H, None, ((T + 7 * H, None),)
        )


def row(
    key: str,
    gpu_hours: float,
    submitted: int,
    succeeded: int = 0,
    failed: int = 0,
    cancelled: int = 0,
    waits: tuple[float, ...] = (),
    p95: float | None = None,
) -> dict[str, Any]:
    return {
        "key": key,
        "gpu_hours": gpu_hours,
        "submitted": submitted,
        "finished": {"SUCCEEDED": succeeded, "FAILED": failed, "CANCELLED": cancelled},
        "started": len(waits),
        "mean_wait_s": sum(waits) / len(waits) if waits else None,
        "p95_wait_s": p95,
    }


def close(found: dict[str, Any], expected: dict[str, Any]) -> None:
    assert found["key"] == expected["key"]
    assert found["gpu_hours"] == pytest.approx(expected["gpu_hours"], abs=1e-9), found["key"]
    for key in ("submitted", "finished", "started", "mean_wait_s", "p95_wait_s"):
        assert found[key] == expected[key], (found["key"], key)


def check(report: dict[str, Any], rows: list[dict[str, Any]], total: dict[str, Any]) -> None:
    assert [r["key"] for r in report["rows"]] == [r["key"] for r in rows]
    for found, expected in zip(report["rows"], rows, strict=True):
        close(found, expected)
    close(report["total"], total)


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """The same rows in SQLite and in PostgreSQL (the spec's share is read by each one's JSON)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'usage.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    opened = Store(url)
    try:
        fill(opened, live=True)
        yield opened
    finally:
        opened.close()


NOW = T + 9 * H


def test_usage_per_user_worked_out_by_hand(store: Store) -> None:
    report = usage_report(store, SINCE, UNTIL, "user", NOW)
    assert (report["since"], report["until"], report["by"]) == (SINCE, UNTIL, "user")
    check(
        report,
        [
            row("alice", 4 + 2, 1, succeeded=1, failed=1, waits=(H,), p95=H),
            row("bob", 4, 2, failed=1, cancelled=1, waits=(H,), p95=H),
            row("carol", 1, 0, succeeded=1, waits=(5.5 * H,), p95=5.5 * H),
            row("dave", 2, 1, waits=(0.0,), p95=0.0),
        ],
        # waits 0, 1 h, 1 h, 5.5 h: mean 6,750 s; the 95th percentile by nearest rank: the 4th
        row("total", 13, 4, 2, 2, 1, waits=(0.0, H, H, 5.5 * H), p95=5.5 * H),
    )


def test_usage_per_vc_and_visibility(store: Store) -> None:
    check(
        usage_report(store, SINCE, UNTIL, "vc", NOW),
        [
            row("a", 7, 1, succeeded=2, failed=1, waits=(H, 5.5 * H), p95=5.5 * H),
            row("b", 6, 3, failed=1, cancelled=1, waits=(0.0, H), p95=H),
        ],
        row("total", 13, 4, 2, 2, 1, waits=(0.0, H, H, 5.5 * H), p95=5.5 * H),
    )
    # bob of VC b sees his jobs and dave's (b); carol with no VC sees only her own
    bobs = usage_report(store, SINCE, UNTIL, "user", NOW, visible_to=("bob", "b"))
    assert [r["key"] for r in bobs["rows"]] == ["bob", "dave"]
    assert bobs["total"]["gpu_hours"] == pytest.approx(6)
    carols = usage_report(store, SINCE, UNTIL, "vc", NOW, visible_to=("carol", None))
    check(
        carols,
        [row("a", 1, 0, succeeded=1, waits=(5.5 * H,), p95=5.5 * H)],
        row("total", 1, 0, succeeded=1, waits=(5.5 * H,), p95=5.5 * H),
    )


def test_a_running_attempt_counts_up_to_now_and_no_further_than_until(store: Store) -> None:
    # now past the period's end: dave's attempt counts T+7H to T+10H
    later = usage_report(store, SINCE, UNTIL, "user", UNTIL + 5 * H)
    dave = next(r for r in later["rows"] if r["key"] == "dave")
    assert dave["gpu_hours"] == pytest.approx(3)
    # a period of one hour inside alice's half-GPU attempt and nothing else: 0.5 GPU-h
    narrow = usage_report(store, T + 4.5 * H, T + 5.5 * H, "user", NOW)
    assert narrow["total"]["gpu_hours"] == pytest.approx(0.5)
    assert narrow["total"]["finished"]["CANCELLED"] == 1  # job 4 at T+5H
    assert [r["key"] for r in narrow["rows"]] == ["alice", "bob"]
    empty = usage_report(store, T + 100 * H, T + 101 * H, "user", NOW)
    assert empty["rows"] == []
    assert empty["total"] == {
        "key": "total",
        "gpu_hours": 0.0,
        "submitted": 0,
        "finished": {"SUCCEEDED": 0, "FAILED": 0, "CANCELLED": 0},
        "started": 0,
        "mean_wait_s": None,
        "p95_wait_s": None,
    }


@pytest.mark.parametrize(
    ("since", "until", "by", "message"),
    [
        (T, T, "user", "until: must be after since"),
        (T, T - 1, "user", "until: must be after since"),
        (float("nan"), T, "user", "since: must be a time in epoch seconds"),
        (T, float("inf"), "user", "until: must be a time in epoch seconds"),
        (-5.0, T, "user", "since: must be a time in epoch seconds"),
        (T, T + 1, "team", "by: must be one of user, vc (got 'team')"),
    ],
)
def test_a_period_that_makes_no_sense_is_refused(
    store: Store, since: float, until: float, by: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        usage_report(store, since, until, by, NOW)


def test_nearest_rank() -> None:
    assert nearest_rank([], 0.95) is None
    assert nearest_rank([7.0], 0.95) == 7.0
    twenty = [float(i) for i in range(1, 21)]
    assert nearest_rank(twenty, 0.95) == 19.0  # ceil(19) = 19th
    assert nearest_rank([*twenty, 21.0], 0.95) == 20.0  # ceil(19.95) = 20th
    assert nearest_rank([1.0, 2.0], 0.5) == 1.0


# -- the API and the CLI on a live manager -------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    data_dir = tmp_path_factory.mktemp("usage") / "corral"
    data_dir.mkdir(mode=0o700)
    seeded = Store(Store.sqlite_url(data_dir))
    try:
        fill(seeded, live=False)
    finally:
        seeded.close()
    running = start_server(data_dir, gpus=8)
    try:
        yield running
    finally:
        running.stop()
        kill_jobs_of(data_dir)


API_BY_VC = (
    [
        row("a", 7, 1, succeeded=2, failed=1, waits=(H, 5.5 * H), p95=5.5 * H),
        row("b", 4, 2, failed=1, cancelled=1, waits=(H,), p95=H),
    ],
    row("total", 11, 3, 2, 2, 1, waits=(H, H, 5.5 * H), p95=5.5 * H),
)


def test_the_api_answers_usage_by_vc_and_per_user_for_a_user(server: RunningServer) -> None:
    admin = api(server.url, admin_token(server.manager.data_dir))
    found = admin.get("/api/v1/usage", params={"since": SINCE, "until": UNTIL, "by": "vc"})
    assert found.status_code == 200, found.text
    check(found.json(), *API_BY_VC)
    token = admin.post("/api/v1/tokens", json={"user": "bob", "vc": "default"}).json()["token"]
    bob = api(server.url, token)
    mine = bob.get("/api/v1/usage", params={"since": SINCE, "until": UNTIL}).json()
    check(
        mine,  # bob's VC here is `default`, where none of these jobs is: his own only
        [row("bob", 4, 2, failed=1, cancelled=1, waits=(H,), p95=H)],
        row("total", 4, 2, failed=1, cancelled=1, waits=(H,), p95=H),
    )
    assert api(server.url, None).get("/api/v1/usage", params={"since": SINCE}).status_code == 401
    # until defaults to now: everything since T, job 3's end and job 8 included
    since_t = admin.get("/api/v1/usage", params={"since": SINCE}).json()
    assert since_t["total"]["finished"]["SUCCEEDED"] == 3
    assert since_t["total"]["submitted"] == 4
    assert since_t["total"]["gpu_hours"] == pytest.approx(4 + 2 + 3 * 4 + 1)  # job 3 whole


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"since": SINCE, "until": SINCE}, "until: must be after since"),
        ({"since": "nan"}, "since: must be a time in epoch seconds"),
        ({"since": SINCE, "by": "team"}, "by: must be one of user, vc"),
        ({"since": "yesterday"}, "since"),
        ({}, "since"),
    ],
)
def test_the_api_refuses_a_bad_period_in_one_line(
    server: RunningServer, params: dict[str, Any], message: str
) -> None:
    admin = api(server.url, admin_token(server.manager.data_dir))
    found = admin.get("/api/v1/usage", params=params)
    assert found.status_code == 422
    detail = found.json()["detail"]
    assert isinstance(detail, str) and "\n" not in detail and message in detail


def iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat()


def corral(server: RunningServer, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        "CORRAL_URL": server.url,
        "CORRAL_TOKEN": admin_token(server.manager.data_dir),
        "PATH": "/usr/bin:/bin",
    }
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")  # this checkout's corral
    return subprocess.run(
        [sys.executable, "-m", "corral.cli", "usage", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_the_cli_prints_usage_as_json_and_as_a_table(server: RunningServer) -> None:
    done = corral(server, "--since", iso(SINCE), "--until", iso(UNTIL), "--by", "vc", "-o", "json")
    assert done.returncode == 0, done.stderr
    check(json.loads(done.stdout), *API_BY_VC)
    # a naive ISO time is UTC
    naive = datetime.fromtimestamp(SINCE, UTC).replace(tzinfo=None).isoformat()
    table = corral(server, "--since", naive, "--until", iso(UNTIL))
    assert table.returncode == 0, table.stderr
    keys = {"alice", "bob", "carol", "total"}
    lines = {p[0]: p for line in table.stdout.splitlines() if (p := line.split()) and p[0] in keys}
    assert lines["alice"][1:4] == ["6.00", "1", "1"]  # GPU-hours, submitted, succeeded
    assert lines["bob"][1:] == ["4.00", "2", "0", "1", "1", "1", "1.0h", "1.0h"]
    assert lines["total"][1:] == ["11.00", "3", "2", "2", "1", "3", "2.5h", "5.5h"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--since", "7x"), "--since: expected a duration back from now"),
        (("--since", "1d", "--until", "2d"), "--until: must be after --since"),
        (("--since", "1d", "--by", "team"), "team"),
    ],
)
def test_the_cli_refuses_bad_input_with_exit_2(
    server: RunningServer, args: tuple[str, ...], message: str
) -> None:
    done = corral(server, *args)
    assert done.returncode == 2
    assert message in done.stderr and done.stdout == ""
