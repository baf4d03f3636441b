"""The manager's control plane without processes: submissions/s through the API, and scheduling
rounds with 10,000 waiting jobs on 1,000 declared 8-GPU nodes. Prints figures; never fails on time.

The executor is replaced by one that starts nothing and reports each attempt ended after a random
run time, so that every round has ends to collect and starts to record, as a busy cluster has.
Everything else is real: the FastAPI app under uvicorn on 127.0.0.1, httpx clients, the SQLite file,
the core's Scheduler (las, relax placement).

Run: python benchmarks/control_plane.py [--nodes 1000] [--pending 10000] [--seconds 30]
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import re
import shutil
import subprocess
import tempfile
import time
from multiprocessing.pool import ThreadPool
from multiprocessing.queues import Queue
from pathlib import Path

import httpx
import numpy as np

from corral.core.cluster import Cluster
from corral.exec.local import AttemptEnded, AttemptLaunch
from corral.server import auth
from corral.server.boot import RunningServer
from corral.server.manager import Manager, ManagerSettings
from corral.server.spec import parse_job_spec
from corral.server.store import Store

SIZES = (1, 1, 1, 1, 2, 2, 4, 8)  # GPUs per job, most jobs small as in Philly


class NullExecutor:
    """Starts nothing; an attempt 'runs' for a random time and then ends with exit code 0."""

    def __init__(self, run_s: tuple[float, float], seed: int = 0) -> None:
        self.run_s = run_s
        self.random = random.Random(seed)
        self.ends: list[tuple[float, str, int]] = []
        self.launched = 0

    def launch(self, launch: AttemptLaunch) -> None:
        self.launched += 1
        ends_at = time.time() + self.random.uniform(*self.run_s)
        self.ends.append((ends_at, launch.job_id, launch.attempt))

    def stop(self, job_id: str, attempt: int) -> None:
        self.ends.append((time.time(), job_id, attempt))

    def poll(self) -> list[AttemptEnded]:
        now = time.time()
        due = [e for e in self.ends if e[0] <= now]
        if not due:
            return []
        self.ends = [e for e in self.ends if e[0] > now]
        return [AttemptEnded(j, a, 0, None, False, "exit code 0", "", t) for t, j, a in due]

    def recover(self, job_id: str, attempt: int, attempt_dir: Path) -> str:
        return "never-started"

    def close(self) -> None:
        pass


def spec(index: int, rng: random.Random) -> dict[str, object]:
    return {"name": f"bench-{index}", "gpus": rng.choice(SIZES), "command": "true"}


WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer TOKEN"
local sizes = {1, 1, 1, 1, 2, 2, 4, 8}
local n = 0
request = function()
  n = n + 1
  local body = string.format('{"name": "wrk-%d", "gpus": %d, "command": "true"}', n, sizes[n % 8 + 1])
  return wrk.format(nil, nil, nil, body)
end
"""


def _client_process(url: str, token: str, bodies: list[dict[str, object]], out: Queue) -> None:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as c:
        for body in bodies:
            response = c.post("/api/v1/jobs", json=body)
            assert response.status_code == 201, response.text
    out.put(len(bodies))


def submissions(url: str, token: str, count: int, clients: int) -> tuple[float, str]:
    """Jobs/s the API accepts (201, stored) from `clients` concurrent connections. With wrk
    (Debian's package; C, so the load generator takes little of this 2-core machine) for
    count/1000 seconds, else with Python client processes (httpx; heavier, so the figure is
    lower than what the server can do)."""
    if shutil.which("wrk"):
        with tempfile.NamedTemporaryFile("w", suffix=".lua") as script:
            script.write(WRK_SCRIPT.replace("TOKEN", token))
            script.flush()
            seconds = max(2, count // 1000)
            command = ["wrk", "-t2", f"-c{clients}", f"-d{seconds}s", "-s", script.name]
            output = subprocess.run(
                [*command, f"{url}/api/v1/jobs"], capture_output=True, text=True, check=True
            ).stdout
        if "Non-2xx" in output:
            raise SystemExit(f"some submissions were refused:\n{output}")
        rate = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))  # type: ignore[union-attr]
        return rate, f"wrk, {clients} connections, {seconds} s"
    rng = random.Random(1)
    bodies = [spec(i, rng) for i in range(count)]
    context = multiprocessing.get_context("spawn")
    done: Queue = context.Queue()
    workers = [
        context.Process(target=_client_process, args=(url, token, bodies[i::clients], done))
        for i in range(clients)
    ]
    for worker in workers:  # started before the clock: a spawned interpreter takes a while
        worker.start()
    began = time.perf_counter()
    accepted = sum(done.get() for _ in workers)
    elapsed = time.perf_counter() - began
    for worker in workers:
        worker.join()
    return accepted / elapsed, f"{accepted:,} jobs from {clients} httpx client processes"


def main() -> None:

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--submit", type=int, default=5000, help="jobs sent through the API")
    parser.add_argument("--clients", type=int, default=8, help="concurrent connections")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        store = Store(Store.sqlite_url(data_dir))
        auth.ensure_admin_token(store, data_dir)
        token = (data_dir / "admin.token").read_text().strip()
        cluster = Cluster.shorthand(args.nodes, 8, racks=max(1, args.nodes // 32))
        executor = NullExecutor(run_s=(5.0, 60.0))
        manager = Manager(store, executor, cluster, data_dir, settings=ManagerSettings(tick_s=0.05))
        server = RunningServer(manager).start()
        try:
            # 1. Submissions through the API while the cluster fills (every job starts at once).
            rate, how = submissions(server.url, token, args.submit, args.clients)
            print(f"API submissions, empty cluster: {rate:,.0f} jobs/s ({how})")
            # 2. Fill the queue to the backlog asked for (many threads: commits are grouped).
            rng = random.Random(2)
            missing = args.pending - manager.scheduler.pending_count
            with ThreadPool(16) as pool:
                pool.map(
                    lambda i: manager.submit(parse_job_spec(spec(i, rng)), "bench"),
                    range(args.submit, args.submit + missing),
                )
            index = args.submit + missing + 10**6  # clear of the names the API runs chose
            with manager.lock:
                manager.round_seconds.clear()
                rounds_before = manager.rounds
                launched_before = executor.launched
            # 3. Steady state: attempts end, rounds start others; keep the backlog topped up.
            began = time.perf_counter()
            backlog: list[int] = []
            while time.perf_counter() - began < args.seconds:
                missing = args.pending - manager.scheduler.pending_count
                for _ in range(max(0, missing)):
                    manager.submit(parse_job_spec(spec(index, rng)), "bench")
                    index += 1
                backlog.append(manager.scheduler.pending_count)
                time.sleep(0.5)
            with manager.lock:
                latest = np.array(manager.round_seconds) * 1000
                rounds = manager.rounds - rounds_before
                launched = executor.launched - launched_before
                busy = cluster.total_gpus - cluster.free_gpus
            # 4. Submissions through the API to the full cluster with its backlog waiting.
            full_rate, full_how = submissions(server.url, token, args.submit, args.clients)
        finally:
            server.stop()
    print(
        f"API submissions, full cluster, {args.pending:,} waiting: {full_rate:,.0f} jobs/s "
        f"({full_how})"
    )
    print(
        f"cluster: {args.nodes:,} nodes x 8 GPUs; waiting jobs {min(backlog):,}-{max(backlog):,}; "
        f"GPUs busy at the end {busy:,}"
    )
    print(
        f"scheduling rounds over {args.seconds:.0f} s: {rounds:,} rounds, {launched:,} starts; "
        f"round latency p50 {np.percentile(latest, 50):.1f} ms, p99 {np.percentile(latest, 99):.1f} ms, "
        f"max {latest.max():.1f} ms"
    )


if __name__ == "__main__":
    main()
