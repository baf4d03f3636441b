"""What the Ray executor costs, next to the local executor, on a Ray cluster on this machine.

Starts a loopback-only Ray cluster (a CPU-only head and NODES nodes of 4 declared GPUs, in a
network namespace of this process's own: run as root) and a manager over it, then prints:

- latency: submit -> SUCCEEDED of a trivial 1-GPU job, one at a time (p50 and max), with the
  Ray executor and with the local executor on the same machine;
- throughput: JOBS trivial 1-GPU jobs submitted at once, until the last one ended (jobs/s);
- a 2-worker job on two nodes: submit -> both workers' first output line at the API;
- node failure: SIGKILL of a node's Ray processes -> the job's attempt ended (lost) and requeued.

    python benchmarks/ray_executor.py [--nodes 2] [--jobs 40] [--samples 10]

Figures depend on the machine; on 2 cores the Ray cluster's own daemons take a good share.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.netns import isolate_network  # noqa: E402

TRIVIAL = [sys.executable, "-c", "pass"]
FIRST_LINE = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--samples", type=int, default=10)
    args = parser.parse_args()
    if not isolate_network():
        sys.exit("benchmarks/ray_executor.py: needs root (or `unshare -rn`) for its own network")

    from tests.exec.ray_cluster import RayCluster, processes_of, use_token_auth

    work = Path(tempfile.mkdtemp(prefix="corral-bench-ray-"))
    use_token_auth(work)  # before Ray is imported: it reads RAY_AUTH_MODE once

    from corral.exec.ray import RayExecutor
    from corral.server.boot import RunningServer, ServerOptions, build_manager
    from corral.server.executors.ray import ray_namespace
    from tests.server.helpers import admin_token, api, fast_settings, submit, wait_for

    names = tuple(f"n{i + 1}" for i in range(args.nodes))
    cluster = RayCluster(gpus_per_node=4, node_names=names, head="head")
    cluster.start()
    print(f"ray cluster: head + {args.nodes} x 4 GPUs, started in {cluster.started_in_s:.1f} s")

    def serve(executor: str) -> RunningServer:
        data_dir = Path(tempfile.mkdtemp(prefix=f"{executor}-", dir=work))
        # Single-user: the figures are the executors' costs; the jobs run as the benchmark's user.
        options = ServerOptions(
            data_dir=data_dir, settings=fast_settings(), executor=executor, single_user=True
        )
        if executor == "ray":
            options.executor_options = {"address": cluster.address}
            return RunningServer(
                build_manager(options, RayExecutor(cluster.address, ray_namespace(data_dir)))
            ).start()
        options.gpus = 4 * args.nodes
        return RunningServer(build_manager(options)).start()

    try:
        for executor in ("local", "ray"):
            server = serve(executor)
            try:
                client = api(server.url, admin_token(server.manager.data_dir))
                spec = {"name": "t", "gpus": 1, "command": TRIVIAL}
                took = []
                for _ in range(args.samples):
                    began = time.perf_counter()
                    wait_for(client, submit(client, **spec), timeout=60)
                    took.append(time.perf_counter() - began)
                print(
                    f"{executor:5}  submit -> SUCCEEDED, one 1-GPU job at a time: "
                    f"p50 {statistics.median(took) * 1000:.0f} ms, max {max(took) * 1000:.0f} ms"
                )
                began = time.perf_counter()
                ids = [submit(client, **spec) for _ in range(args.jobs)]
                for job_id in ids:
                    wait_for(client, job_id, timeout=300)
                elapsed = time.perf_counter() - began
                print(
                    f"{executor:5}  {args.jobs} jobs at once on {4 * args.nodes} GPUs: "
                    f"{elapsed:.1f} s, {args.jobs / elapsed:.1f} jobs/s"
                )
            finally:
                server.stop()
        server = serve("ray")
        try:
            client = api(server.url, admin_token(server.manager.data_dir))
            began = time.perf_counter()
            wide = submit(client, name="w", gpus=8, workers=2, command=FIRST_LINE, grace_seconds=1)
            for rank in (0, 1):
                while "up" not in client.get(f"/api/v1/jobs/{wide}/logs?rank={rank}").text:
                    time.sleep(0.02)
            print(
                f"ray    2 workers on 2 nodes: submit -> both first lines at the API "
                f"{time.perf_counter() - began:.2f} s (logs are copied about once a second)"
            )
            on = client.get(f"/api/v1/jobs/{wide}").json()["placement"][-1].split("/")[0]
            began = time.perf_counter()
            cluster.kill_node(on)
            while processes_of(on, jobs=True):
                time.sleep(0.02)
            print(
                f"ray    node {on}'s Ray killed -> its job processes gone (their guard): "
                f"{time.perf_counter() - began:.2f} s"
            )
            wait_for(client, wide, ["PENDING"], timeout=120)
            print(
                f"ray    node {on}'s Ray killed -> attempt lost, job requeued: "
                f"{time.perf_counter() - began:.2f} s (Ray's health check: 0.5 s x 3 here)"
            )
            client.post(f"/api/v1/jobs/{wide}/cancel")
        finally:
            server.stop()
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
