"""Simulate a Philly-scale workload and print how fast the simulator ran and how much memory it took.

100,000 jobs from the Philly-calibrated synthetic generator on 312 nodes x 8 GPUs (39 racks of 8
nodes), policy las, placement relax, as the issue asks. Prints figures; never passes or fails on
time. Run: python benchmarks/sim_philly_scale.py [--jobs N] [--load L] [--policy P]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

from corral.core import Cluster, Scheduler
from corral.core.placement import make_placement
from corral.core.policy import make_policy
from corral.sim.engine import Simulation
from corral.sim.metrics import summarize
from corral.sim.perfmodel import PerfModel
from corral.sim.traces import load_trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--nodes", type=int, default=312)
    parser.add_argument("--racks", type=int, default=39)
    parser.add_argument("--load", type=float, default=0.9)
    parser.add_argument("--policy", default="las")
    parser.add_argument("--placement", default="relax")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    gpus = args.nodes * 8
    load_started = time.perf_counter()
    trace = load_trace(
        f"synthetic:jobs={args.jobs},load={args.load},gpus={gpus},seed={args.seed}",
        perf=PerfModel.default_for_durations(),
    )
    load_s = time.perf_counter() - load_started
    cluster = Cluster.shorthand(args.nodes, 8, racks=args.racks)
    options = {}
    if args.policy == "gittins":
        options["service_samples_gpu_s"] = [s.gpus * (s.duration_s or 0) for s in trace.jobs]
    simulation = Simulation(
        trace.jobs,
        Scheduler(
            cluster,
            make_policy(args.policy, **options),
            make_placement(args.placement),
            speed_model=PerfModel.default_for_durations().speed_model(cluster),
            restore_s=30.0,
        ),
    )
    started = time.perf_counter()
    result = simulation.run()
    wall = time.perf_counter() - started
    summary = summarize(result)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"workload      : {len(trace.jobs)} jobs, synthetic Philly load {args.load}, "
        f"{cluster.describe()}"
    )
    print(f"policy        : {args.policy} + {args.placement}")
    print(f"trace load    : {load_s:.2f} s")
    print(
        f"simulation    : {wall:.2f} s wall, {len(trace.jobs) / wall:,.0f} jobs/s, "
        f"{result.rounds:,} scheduling rounds ({result.rounds / wall:,.0f} rounds/s)"
    )
    print(f"peak memory   : {peak_mib:,.0f} MiB (max RSS of the process)")
    print(
        f"outcome       : {summary['jobs']} jobs done, avg JCT {summary['avg_jct_s'] / 3600:.2f} h, "
        f"utilization {summary['utilization']:.1%}, {summary['preemptions']} preemptions, "
        f"{summary['relaxed_jobs']} relaxed"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
