"""Simulate a preemption-heavy Philly-like workload and print the simulator's CPU time and memory.

The workload (generated here, streamed, so that `--jobs 1000000` fits in bounded memory):

* GPU counts drawn from the Gavel/MSR Philly-derived mix, 1 to 64 GPUs
  (`corral.sim.traces.synthetic.GAVEL_MSR_GPU_COUNTS`).
* Run times drawn, with replacement, from the Philly run times of `philly_runtime.csv`
  (../shared/data/philly), heavy-tailed (median 20 min), cut at `--cap-h` hours (48): a 100,000-job
  trace spans about two weeks, and an uncut 53-day job would outlive it and leave the cluster idle.
* Arrivals Poisson with a daily cycle: rate(t) = r (1 + A sin(2 pi t / 1 day)), A = `--diurnal`
  (0.9), drawn by thinning; r makes the mean offered GPU-seconds per second `--load` (0.85) of
  the cluster, with the population means of size and (cut) run time. At the daily peak the
  offered load is 1.6 times the cluster, so queues build every day and drain at night: `las`
  then preempts often (jobs that cross a queue threshold give way to newcomers).
* Sizes, run times and arrivals each come from their own numpy stream of `--seed` (0), drawn in
  chunks of 10,000 jobs: the same options give the same trace, whatever the number of jobs read.

The cluster is 312 nodes x 8 GPUs in 13 racks, placement `relax`, restore cost 30 s. Each policy
(`--policies`, default las and gittins; gittins learns its size distribution from 10,000 jobs
drawn the same way with another seed) runs in its own process, so that each peak RSS is its own.

The run is streamed: jobs are generated as the simulation reaches their arrival, each job's
result is taken as it ends (counted here) and the job is then dropped, and the timeline is kept
as sums (`Simulation(keep_ended=False, on_end=..., timeline=TimelineTotals(...))`), so memory
stays bounded by the jobs waiting or running. The CPU time then includes generating the jobs.
`--keep` runs the ordinary way instead (the whole trace generated first, outside the timing, and
every job and round kept), as `corral simulate` does.

Prints CPU seconds, jobs/s, preemptions and peak RSS, and whether the core is the compiled build
(setup.py) or the Python sources; never passes or fails on time.

Run: python benchmarks/sim_preemption_heavy.py [--jobs N] [--policies las,gittins] [--keep]
"""

from __future__ import annotations

import argparse
import math
import resource
import subprocess
import sys
import time
from collections.abc import Iterator

import numpy as np

from corral.core import Cluster, Scheduler
from corral.core.compiled import compiled_core
from corral.core.job import Job, JobSpec
from corral.core.placement import make_placement
from corral.core.policy import make_policy
from corral.sim.engine import Simulation
from corral.sim.metrics import utilization
from corral.sim.result import TimelineTotals
from corral.sim.traces.synthetic import GAVEL_MSR_GPU_COUNTS, _runtime_path, _runtime_pool

DAY_S = 86_400.0
CHUNK = 10_000


def runtime_pool(cap_s: float) -> np.ndarray:
    path = _runtime_path(None)
    return np.minimum(_runtime_pool(str(path.resolve()), path.stat().st_mtime_ns), cap_s)


def workload(
    jobs: int, *, load: float, gpus: int, diurnal: float, cap_s: float, seed: int
) -> Iterator[JobSpec]:
    """The benchmark's jobs in arrival order, generated as they are read."""
    pool = runtime_pool(cap_s)
    sizes = np.array(sorted(GAVEL_MSR_GPU_COUNTS))
    weights = np.array([GAVEL_MSR_GPU_COUNTS[s] for s in sizes], dtype=float)
    weights /= weights.sum()
    rate = load * gpus / (float(np.dot(sizes, weights)) * float(pool.mean()))
    size_rng, runtime_rng, arrival_rng = (
        np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(k,))) for k in range(3)
    )
    peak = rate * (1.0 + diurnal)
    clock = 0.0
    made = 0
    while made < jobs:
        count = min(CHUNK, jobs - made)
        job_gpus = size_rng.choice(sizes, size=count, p=weights)
        job_runtimes = runtime_rng.choice(pool, size=count)
        submits: list[float] = []
        while len(submits) < count:  # thinning: candidates at the peak rate, kept by the cycle
            candidates = clock + np.cumsum(arrival_rng.exponential(1.0 / peak, size=2 * count))
            keep = arrival_rng.random(candidates.size) * (1.0 + diurnal) < 1.0 + diurnal * np.sin(
                2.0 * math.pi * candidates / DAY_S
            )
            clock = float(candidates[-1])
            submits.extend(candidates[keep].tolist())
        clock = submits[count - 1]
        for i in range(count):
            yield JobSpec(
                id=f"ph-{made + i:07d}",
                submit_time=submits[i],
                gpus=int(job_gpus[i]),
                duration_s=float(job_runtimes[i]),
            )
        made += count


def run_one(args: argparse.Namespace, policy: str) -> None:
    cluster = Cluster.shorthand(args.nodes, 8, racks=args.racks)
    shape = dict(
        load=args.load,
        gpus=cluster.total_gpus,
        diurnal=args.diurnal,
        cap_s=args.cap_h * 3600.0,
    )
    options: dict[str, object] = {}
    if policy == "gittins":
        history = workload(10_000, seed=args.seed + 1, **shape)  # type: ignore[arg-type]
        options["service_samples_gpu_s"] = [s.gpus * (s.duration_s or 0) for s in history]
    jobs = workload(args.jobs, seed=args.seed, **shape)  # type: ignore[arg-type]
    ended = [0, 0.0]  # jobs ended, sum of their JCTs

    def on_end(job: Job) -> None:
        ended[0] += 1
        ended[1] += (job.finished_at or 0.0) - job.spec.submit_time

    core = Scheduler(
        cluster, make_policy(policy, **options), make_placement(args.placement), restore_s=30.0
    )
    if args.keep:
        simulation = Simulation(list(jobs), core, on_end=on_end)
    else:
        totals = TimelineTotals(total_gpus=cluster.total_gpus)
        simulation = Simulation(jobs, core, on_end=on_end, keep_ended=False, timeline=totals)
    cpu = time.process_time()
    result = simulation.run()
    cpu = time.process_time() - cpu
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"{policy:8} + {args.placement}: {cpu:6.2f} s CPU, {args.jobs / cpu:9,.0f} jobs/s, "
        f"{result.preemptions:7,} preemptions, {result.rounds:9,} rounds, "
        f"peak RSS {peak_mib:5,.0f} MiB, avg JCT {ended[1] / max(1, ended[0]) / 3600:.2f} h, "
        f"utilization {utilization(result.timeline, cluster.total_gpus):.1%}, "
        + ("compiled core" if compiled_core() else "pure Python core")
    )
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--nodes", type=int, default=312)
    parser.add_argument("--racks", type=int, default=13)
    parser.add_argument("--load", type=float, default=0.85)
    parser.add_argument("--diurnal", type=float, default=0.9)
    parser.add_argument("--cap-h", type=float, default=48.0)
    parser.add_argument("--policies", default="las,gittins")
    parser.add_argument("--placement", default="relax")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep every job (no streaming)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child process's policy
    args = parser.parse_args()
    if args.one:
        run_one(args, args.one)
        return
    print(
        f"workload: {args.jobs:,} jobs, Philly sizes and run times (cut at {args.cap_h:g} h), "
        f"load {args.load:g}, daily cycle {args.diurnal:g}, seed {args.seed}; "
        f"{args.nodes} x 8 GPUs in {args.racks} racks; "
        + ("every job kept" if args.keep else "streamed")
    )
    sys.stdout.flush()
    for policy in args.policies.split(","):
        subprocess.run([sys.executable, *sys.argv, "--one", policy], check=True)


if __name__ == "__main__":
    main()
