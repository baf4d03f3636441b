"""Liveness: /healthz (the process answers), /readyz (the store answers and a round ran lately),
idle rounds and the gauge of the latest round's time, on a real manager.

A stuck control loop is made real: the test takes the manager's lock, which every round needs,
and holds it; the store is made unreachable by stopping PostgreSQL under the manager."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from corral.server.boot import RunningServer, ServerOptions, build_manager
from tests.server.helpers import (
    admin_token,
    api,
    fast_settings,
    run_server,
    start_server,
    wait_until,
)
from tests.server.postgres import PostgresServer

#: Rounds at least every 0.3 s; not ready once none ran for 2 s.
LIVENESS = {"round_every_s": 0.3, "ready_round_s": 2.0}


@pytest.fixture
def server(data_dir: Path) -> Iterator[RunningServer]:
    running = start_server(data_dir, gpus=1, **LIVENESS)
    try:
        yield running
    finally:
        running.stop()


def ready(client: httpx.Client) -> httpx.Response:
    return client.get("/readyz")


def last_round(client: httpx.Client) -> float | None:
    text = client.get("/metrics").text
    found = re.search(r"^corral_last_round_timestamp_seconds ([0-9.e+]+)$", text, re.M)
    return float(found.group(1)) if found else None


def test_healthz_and_readyz_need_no_token_and_idle_rounds_keep_the_gauge_fresh(
    server: RunningServer, data_dir: Path
) -> None:
    anonymous = api(server.url, None)
    assert anonymous.get("/healthz").status_code == 200
    assert anonymous.get("/healthz").json() == {"status": "ok"}
    response = wait_until(lambda: (r := ready(anonymous)).status_code == 200 and r, "readyz 200")
    assert response.json() == {"status": "ready"}
    # No job at all: rounds still run (every 0.3 s), and the gauge moves with them.
    admin = api(server.url, admin_token(data_dir))
    first = wait_until(lambda: last_round(admin), "the gauge")
    rounds = server.manager.rounds
    wait_until(lambda: server.manager.rounds >= rounds + 3, "three idle rounds", timeout=60)
    assert wait_until(lambda: (last_round(admin) or 0) > first, "the gauge to move")


def test_a_stuck_control_loop_turns_readyz_503_with_its_reason_while_healthz_stays_200(
    server: RunningServer,
) -> None:
    client = api(server.url, None)
    wait_until(lambda: ready(client).status_code == 200, "readyz 200")
    manager = server.manager
    stuck = threading.Event()
    free = threading.Event()

    def hold_the_lock() -> None:  # the loop's next round waits for this lock: it is stuck
        with manager.lock:
            stuck.set()
            free.wait(120)

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    try:
        assert stuck.wait(30)
        rounds = manager.rounds
        response = wait_until(
            lambda: (r := ready(client)).status_code == 503 and r, "readyz 503", timeout=60
        )
        body = response.json()
        assert body["status"] == "not ready"
        # "control loop: no scheduling round for 3 s (limit 2 s)": one line, the loop named
        assert re.fullmatch(
            r"control loop: no scheduling round for \d+ s \(limit 2 s\)", body["reason"]
        ), body
        assert client.get("/healthz").status_code == 200
        assert manager.rounds == rounds  # (indeed none ran)
    finally:
        free.set()
        holder.join()
    wait_until(lambda: ready(client).status_code == 200, "readyz 200 again", timeout=60)


def test_an_unreachable_store_turns_readyz_503_and_back_once_it_returns(
    postgres: PostgresServer, data_dir: Path
) -> None:
    options = ServerOptions(
        data_dir=data_dir,
        gpus=1,
        db_url=postgres.url,
        settings=fast_settings(**LIVENESS),
        single_user=True,
    )
    running = run_server(build_manager(options))
    try:
        client = api(running.url, None)
        wait_until(lambda: ready(client).status_code == 200, "readyz 200")
        postgres.halt()
        response = wait_until(
            lambda: (r := ready(client)).status_code == 503 and r, "readyz 503", timeout=60
        )
        reason = response.json()["reason"]
        # the trivial query is asked first: its failure is the reason (not the rebuild the
        # loop's own failed write starts, which follows)
        assert re.match(r"store: (unreachable: |no answer to a trivial query)", reason), reason
        assert "\n" not in reason
        assert client.get("/healthz").status_code == 200
        postgres.resume()
        wait_until(lambda: ready(client).status_code == 200, "readyz 200 again", timeout=120)
    finally:
        running.stop()
