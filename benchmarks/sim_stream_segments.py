"""Where a streamed run's time goes as the trace gets longer: CPU, rounds and preemptions of
each stretch of `--every` jobs read, in one `corral simulate --stream` run.

The trace is `sim_philly_preempt.py`'s (its workload and seed, written once into `--workdir`;
a longer trace starts with the jobs of a shorter one), and the run is the command that
benchmark times with `--million`:

    corral simulate --trace tiresias:TRACE --cluster 312x8 --racks 13 --policy las
        --placement relax --stream

run in this process, with the trace's reader counted and the scheduler read at each round.
Each time another `--every` jobs have been read, it prints the stretch: the CPU the process
used over it (user + system), the jobs read, rounds and preemptions, and each per job, and
CPU per 1,000 rounds and per preemption. A cost per job that grows while rounds and
preemptions per job stay flat would be something growing in the simulator; one that follows
them is the workload. Never passes or fails on time.

Run: python benchmarks/sim_stream_segments.py [--jobs N] [--every K] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sim_philly_preempt import GPUS_PER_NODE, NODES, RACKS, RUNS, simulate_args, trace_for

from corral.cli.main import tool_environment


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300_000)
    parser.add_argument("--every", type=int, default=100_000)
    parser.add_argument("--load", type=float, default=0.85)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "corral-bench-philly",
        help="where the trace is kept and the run writes (default: the system's temp dir)",
    )
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    trace = trace_for(args.workdir, args.jobs, args.load, args.seed)
    tool_environment("simulate")  # as `corral simulate` sets it, before it imports the simulator
    import corral.sim.runner as runner

    read = [0]  # jobs the run has read from the trace
    streamed = runner.stream_trace

    def counted(*given: Any, **options: Any) -> Any:
        stream = streamed(*given, **options)
        jobs = stream.jobs
        read[0] = 0

        def each() -> Iterator[Any]:
            for spec in jobs:
                read[0] += 1
                yield spec

        stream.jobs = each()
        return stream

    made = runner.Simulation
    running: list[Any] = []

    class Watched:  # the run's Simulation, kept to read its scheduler
        def __init__(self, *given: Any, **options: Any) -> None:
            running.append(made(*given, **options))

        def __getattr__(self, name: str) -> Any:
            return getattr(running[-1], name)

        def run(self) -> Any:
            mark[:] = [time.process_time(), 0, 0, 0]
            return running[-1].run()

    mark: list[float] = [0.0, 0, 0, 0]  # at the stretch's start: CPU, jobs read, rounds, preempts
    totals = runner.TimelineTotals
    print(
        f"{args.jobs:,} jobs streamed, las + relax, {NODES} x {GPUS_PER_NODE} GPUs in {RACKS} "
        f"racks, load average {os.getloadavg()[0]:.2f}\n"
        "jobs read            CPU s   rounds/job  preemptions/job  us/job  ms/1k rounds  "
        "ms/preemption",
        flush=True,
    )

    def stretch(final: bool) -> None:
        scheduler = running[-1].scheduler
        cpu, jobs = time.process_time(), read[0]
        rounds, preempts = scheduler.rounds, scheduler.preemptions
        d_cpu, d_jobs = cpu - mark[0], jobs - mark[1]
        d_rounds, d_pre = rounds - mark[2], preempts - mark[3]
        per_pre = f"{d_cpu / d_pre * 1e3:13.3f}" if d_pre else f"{'-':>13}"
        if d_jobs <= 0:  # the rounds after the last job was read, and writing the results
            if final:
                print(
                    f"{'the rest':19} {d_cpu:8.1f} ({d_rounds:,} rounds, {d_pre:,} preemptions)",
                    flush=True,
                )
            return
        print(
            f"{int(mark[1]):>9,}-{jobs:<9,} {d_cpu:8.1f} {d_rounds / d_jobs:12.2f} "
            f"{d_pre / d_jobs:16.3f} {d_cpu / d_jobs * 1e6:7.0f} "
            f"{d_cpu / max(d_rounds, 1) * 1e6:13.1f} {per_pre}",
            flush=True,
        )
        mark[:] = [cpu, jobs, rounds, preempts]

    class Stretches(totals):  # type: ignore[misc,valid-type]
        __slots__ = ()

        def record(self, *point: Any) -> None:
            if read[0] - mark[1] >= args.every:
                stretch(False)
            totals.record(self, *point)

    runner.stream_trace = counted
    runner.Simulation = Watched
    runner.TimelineTotals = Stretches
    from corral.cli.main import app

    out = args.workdir / f"run-segments-{args.jobs}"
    sys.argv = ["corral", *simulate_args(trace, out, (*RUNS["las"], "--stream"))]
    try:
        app(standalone_mode=False)
    finally:
        if running:
            stretch(True)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
