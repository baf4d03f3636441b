"""The store fails under a running manager (a real `corral up` process): PostgreSQL stopped, or the
disk of SQLite's data directory full. Every change asked meanwhile is answered 503 in JSON with
`Retry-After` and changes nothing, the jobs keep running, and the same call succeeds once the
store is back; an attempt that ended meanwhile is recorded then.

On the old manager a cancel during the outage answered a plain-text 500 after marking the job
cancelled in memory only: no stop was ever sent, and later cancels answered 200 with the job
still RUNNING and its processes alive.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from tests.server.helpers import Corral, alive, job, kill_jobs_of, submit, wait_for, wait_until
from tests.server.postgres import PostgresServer

# Writes its pid, then runs until the file named by its argument exists.
GATED = (
    "import os, pathlib, sys, time\n"
    "pathlib.Path(sys.argv[2]).write_text(str(os.getpid()))\n"
    "while not pathlib.Path(sys.argv[1]).exists():\n"
    "    time.sleep(0.05)\n"
)


def gated(name: str, gate: Path, pid_file: Path, gpus: int = 1) -> dict[str, Any]:
    command = [sys.executable, "-c", GATED, str(gate), str(pid_file)]
    return {"name": name, "gpus": gpus, "command": command, "grace_seconds": 2}


def pid_of(pid_file: Path) -> int:
    return int(wait_until(lambda: pid_file.is_file() and pid_file.read_text(), "the job's pid"))


def assert_unavailable(response: httpx.Response) -> None:
    """A store failure as the API documents it: JSON 503 with Retry-After."""
    assert response.status_code == 503, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.json()["detail"].startswith("the store is unavailable")
    assert int(response.headers["retry-after"]) > 0


def until_answered(call: Any, what: str) -> httpx.Response:
    """Repeat a call, as a client told Retry-After would, until the store takes it."""

    def answered() -> httpx.Response | None:
        response = call()
        return None if response.status_code == 503 else response

    response: httpx.Response = wait_until(answered, what)
    return response


def stored(url: str, query: str) -> list[tuple[Any, ...]]:
    """Ask PostgreSQL itself what it holds."""
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.exec_driver_sql(query)]
    finally:
        engine.dispose()


def test_changes_asked_while_postgresql_is_down_are_refused_and_taken_after(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    corral = Corral(tmp_path / "corral", "--gpus", "2", "--db", postgres.url)
    try:
        client = corral.start()
        running_pid, ending_pid = tmp_path / "running.pid", tmp_path / "ending.pid"
        ends = tmp_path / "ends"
        running = submit(client, **gated("running", tmp_path / "never", running_pid))
        ending = submit(client, **gated("ending", ends, ending_pid))
        waiting = submit(client, **gated("waiting", tmp_path / "never", tmp_path / "w.pid", 2))
        for job_id in (running, ending):
            wait_for(client, job_id, ["RUNNING"])
        pid = pid_of(running_pid)
        pid_of(ending_pid)

        postgres.halt()
        try:
            assert_unavailable(client.post(f"/api/v1/jobs/{running}/cancel"))
            assert_unavailable(client.post(f"/api/v1/jobs/{waiting}/hold"))
            refused = gated("refused", tmp_path / "never", tmp_path / "refused.pid")
            assert_unavailable(client.post("/api/v1/jobs", json=refused))
            # (a token verified within the last second is not looked up again)
            wait_until(
                lambda: client.get("/api/v1/whoami").status_code == 503, "whoami to need the store"
            )
            assert_unavailable(client.get("/api/v1/whoami"))
            ends.touch()  # `ending` exits 0 while nothing can be written
            wait_until(
                (corral.data_dir / "jobs" / ending / "attempt-1" / "result.json").is_file,
                "the ending job's supervisor to write its result",
            )
            assert alive(pid)  # the refused cancel stopped nothing
        finally:
            postgres.resume()

        # The same calls again, as their Retry-After says: each now takes effect, once.
        held = until_answered(
            lambda: client.post(f"/api/v1/jobs/{waiting}/hold"), "the hold to be taken"
        )
        assert held.status_code == 200 and held.json()["held_by"] == "admin", held.text
        cancelled = client.post(f"/api/v1/jobs/{running}/cancel")
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json()["status"] == "CANCELLED"
        wait_until(lambda: not alive(pid), "the cancelled job's process to end")
        late = submit(client, **gated("late", tmp_path / "now", tmp_path / "late.pid"))
        (tmp_path / "now").touch()
        assert wait_for(client, late)["status"] == "SUCCEEDED"
        # What ended during the outage is recorded now, as it happened.
        done = wait_for(client, ending)
        assert (done["status"], done["attempts"], done["exit_code"]) == ("SUCCEEDED", 1, 0)
        assert job(client, waiting)["status"] == "PENDING"
        # Nothing was stored twice, and nothing refused was stored.
        names = stored(postgres.url, "SELECT name FROM jobs ORDER BY id")
        assert [name for (name,) in names] == ["running", "ending", "waiting", "late"]
        attempts = stored(postgres.url, "SELECT job_id, number FROM attempts ORDER BY job_id")
        assert attempts == [(int(running), 1), (int(ending), 1), (int(late), 1)]
    finally:
        try:
            corral.stop()
        finally:
            kill_jobs_of(corral.data_dir)


@contextlib.contextmanager
def small_disk(size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted on a new directory (root only), unmounted afterwards."""
    base = Path(tempfile.mkdtemp(prefix="corral-full-"))
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(base)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        base.rmdir()
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        yield base
    finally:
        kill_jobs_of(base / "corral")
        subprocess.run(["umount", "-l", str(base)], capture_output=True)
        base.rmdir()


def fill(directory: Path) -> Path:
    """Write a file until the disk under `directory` is full; return it."""
    filler = directory / "filler"
    chunk = b"\0" * (1 << 16)
    with filler.open("wb", buffering=0) as out:
        while True:
            try:
                out.write(chunk)
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
                break
    with filler.open("ab", buffering=0) as out:  # the last bytes a smaller write still fits
        for size in (4096, 512, 1):
            with contextlib.suppress(OSError):
                while True:
                    out.write(b"\0" * size)
    return filler


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_cancel_on_a_full_disk_is_refused_and_taken_once_there_is_room(tmp_path: Path) -> None:
    with small_disk("48m") as disk:
        corral = Corral(disk / "corral", "--gpus", "2")
        try:
            client = corral.start()
            pid_file = tmp_path / "running.pid"
            running = submit(client, **gated("running", tmp_path / "never", pid_file))
            wait_for(client, running, ["RUNNING"])
            pid = pid_of(pid_file)
            filler = fill(disk)
            try:
                assert_unavailable(client.post(f"/api/v1/jobs/{running}/cancel"))
                assert alive(pid)
                # Reads still work (SQLite reads need no room) and show the truth.
                assert job(client, running)["status"] == "RUNNING"
                assert_unavailable(client.post(f"/api/v1/jobs/{running}/cancel"))
            finally:
                filler.unlink()
            cancelled = until_answered(
                lambda: client.post(f"/api/v1/jobs/{running}/cancel"), "the cancel to be taken"
            )
            assert cancelled.status_code == 200, cancelled.text
            assert cancelled.json()["status"] == "CANCELLED"
            wait_until(lambda: not alive(pid), "the cancelled job's process to end")
            assert wait_for(client, running)["status"] == "CANCELLED"
        finally:
            corral.stop()
