"""How often LAS preempts one large job that small jobs keep passing, with and without a minimum
run time before preemption (`preempt_exempt_s`, Slurm's PreemptExemptTime). Simulated: exact and
repeatable, the same decisions the live manager makes.

One node of 8 GPUs; an 8-GPU job of 2 hours arrives first; a 1-GPU job of 60 s arrives every 90 s
for 4 hours. LAS (its default queues, split at 3,600 and 36,000 GPU-s) demotes the 8-GPU job
after 450 s, and from then on every small job (queue 0) preempts it; it resumes, restoring for 30 s,
once the small job ends. Prints, per exemption: preemptions of the large job, all preemptions,
the large job's completion time, and the small jobs' mean completion time.

Run: python benchmarks/sim_preempt_exempt.py [--exempt 0 60 300]
"""

from __future__ import annotations

import argparse

from corral.core import Cluster, JobSpec, Scheduler
from corral.core.placement import make_placement
from corral.core.policy import make_policy
from corral.sim.engine import Simulation


def trace(hours: float = 4.0, gap_s: float = 90.0) -> list[JobSpec]:
    jobs = [JobSpec(id="big", submit_time=0.0, gpus=8, duration_s=7200.0)]
    count = int(hours * 3600 / gap_s)
    for i in range(count):
        at = 10.0 + i * gap_s
        jobs.append(JobSpec(id=f"s{i}", submit_time=at, gpus=1, duration_s=60.0))
    return jobs


def run(exempt_s: float) -> dict[str, float]:
    core = Scheduler(
        Cluster.shorthand(1, 8),
        make_policy("las"),
        make_placement("any"),
        restore_s=30.0,
        preempt_exempt_s=exempt_s,
    )
    result = Simulation(trace(), core).run()
    by_id = {job.id: job for job in result.jobs}
    big = by_id["big"]
    small = [job for job in result.jobs if job.id != "big"]
    assert big.finished_at is not None
    return {
        "big_preemptions": big.preemptions,
        "preemptions": result.preemptions,
        "big_jct_s": big.finished_at - big.spec.submit_time,
        "small_jct_s": sum(j.finished_at - j.spec.submit_time for j in small) / len(small),  # type: ignore[operator]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exempt", type=float, nargs="+", default=[0.0, 60.0, 300.0, 600.0])
    args = parser.parse_args()
    print(
        "| preempt_exempt_s | preemptions of the 8-GPU job | all | its JCT (s) | 1-GPU jobs' mean JCT (s) |"
    )
    print("|---:|---:|---:|---:|---:|")
    for exempt in args.exempt:
        got = run(exempt)
        print(
            f"| {exempt:g} | {got['big_preemptions']:.0f} | {got['preemptions']:.0f} | "
            f"{got['big_jct_s']:.0f} | {got['small_jct_s']:.1f} |"
        )


if __name__ == "__main__":
    main()
