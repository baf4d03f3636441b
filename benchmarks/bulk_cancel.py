"""Cancelling many waiting jobs: one bulk call (POST /api/v1/jobs/cancel with a filter) against one
call per job (POST /api/v1/jobs/ID/cancel). Prints seconds; never fails on time.

A real manager (SQLite file, the FastAPI app under uvicorn on 127.0.0.1, httpx) over one GPU; its
executor starts nothing and never ends an attempt, so the first job runs and every later one
waits. The queue is filled in-process (`Manager.submit`, many threads: commits are grouped).

Run: python benchmarks/bulk_cancel.py [--jobs 20000] [--per-job 2000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from multiprocessing.pool import ThreadPool
from pathlib import Path

import httpx

from corral.core.cluster import Cluster
from corral.exec.local import AttemptEnded, AttemptLaunch
from corral.server import auth
from corral.server.boot import RunningServer
from corral.server.manager import Manager, ManagerSettings
from corral.server.spec import parse_job_spec
from corral.server.store import Store


class IdleExecutor:
    """Starts nothing; an attempt runs until it is stopped."""

    def __init__(self) -> None:
        self.stopped: list[AttemptEnded] = []

    def launch(self, launch: AttemptLaunch) -> None:
        pass

    def stop(self, job_id: str, attempt: int) -> None:
        ended = AttemptEnded(job_id, attempt, None, 15, True, "stopped", "", time.time())
        self.stopped.append(ended)

    def signal(self, job_id: str, attempt: int, number: int) -> None:
        pass

    def poll(self) -> list[AttemptEnded]:
        ended, self.stopped = self.stopped, []
        return ended

    def recover(self, job_id: str, attempt: int, attempt_dir: Path) -> str:
        return "lost"

    def leftover(self, job_id: str, attempt: int, attempt_dir: Path) -> int:
        return 0

    def close(self) -> None:
        pass


def fill(manager: Manager, first: int, count: int, name: str) -> None:
    def one(index: int) -> None:
        body = {"name": f"{name}-{index}", "gpus": 1, "command": "true"}
        manager.submit(parse_job_spec(body), "bench")

    with ThreadPool(16) as pool:
        pool.map(one, range(first, first + count))


def waiting(manager: Manager) -> int:
    with manager.lock:
        return manager.scheduler.pending_count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="waiting jobs cancelled at once")
    parser.add_argument("--per-job", type=int, default=2_000, help="cancelled one call each")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        store = Store(Store.sqlite_url(data_dir))
        auth.ensure_admin_token(store, data_dir)
        token = (data_dir / "admin.token").read_text().strip()
        manager = Manager(
            store, IdleExecutor(), Cluster.shorthand(1, 1), data_dir, settings=ManagerSettings()
        )
        server = RunningServer(manager).start()
        headers = {"Authorization": f"Bearer {token}"}
        try:
            with httpx.Client(base_url=server.url, headers=headers, timeout=600) as client:
                # The first job takes the GPU (it never ends); the others wait.
                fill(manager, 0, 1, "runner")
                began = time.perf_counter()
                fill(manager, 1, args.jobs, "sweep")
                print(f"queued {args.jobs:,} jobs in {time.perf_counter() - began:.1f} s")
                assert waiting(manager) >= args.jobs - 1, waiting(manager)
                began = time.perf_counter()
                answer = client.post("/api/v1/jobs/cancel", json={"state": "PENDING"})
                bulk_s = time.perf_counter() - began
                assert answer.status_code == 200, answer.text
                count = answer.json()["count"]
                assert waiting(manager) == 0, waiting(manager)
                print(f"bulk: {count:,} waiting jobs cancelled in one call: {bulk_s:.2f} s")

                fill(manager, 10**6, args.per_job, "single")
                ids = [row.id for row in store.list_jobs(status="PENDING")]
                began = time.perf_counter()
                for job_id in ids:
                    response = client.post(f"/api/v1/jobs/{job_id}/cancel")
                    assert response.status_code == 200, response.text
                single_s = time.perf_counter() - began
                rate = len(ids) / single_s
                print(
                    f"one call per job: {len(ids):,} cancelled in {single_s:.2f} s "
                    f"({rate:,.0f} jobs/s; {count:,} would take about {count / rate:.0f} s)"
                )
        finally:
            server.stop()


if __name__ == "__main__":
    main()
