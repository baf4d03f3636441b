"""Print a hash of every decision (start and preemption, with its instant) for 24 simulations, to
check that a change meant to be decision-neutral (a speed-up) is: run it before and after the
change (e.g. with PYTHONPATH pointing at `git archive` copies of each commit's `corral/`) and diff
the outputs.

The runs: policies las, gittins and fifo x placements any, consolidate, relax and yarn x load 0.6
and 1.2; 4,000 jobs of benchmarks/sim_preemption_heavy.py's Philly-like workload (seed 3; gittins
learns from 2,000 jobs of seed 9) on 40 nodes x 8 GPUs in 5 racks, restore cost 30 s. About two
minutes on one core.

Run: .venv/bin/python scripts/decision_hashes.py > hashes.txt
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from sim_preemption_heavy import workload  # noqa: E402

from corral.core import Cluster, Scheduler  # noqa: E402
from corral.core.placement import make_placement  # noqa: E402
from corral.core.policy import make_policy  # noqa: E402
from corral.sim.engine import Simulation  # noqa: E402


def main() -> None:
    for policy in ("las", "gittins", "fifo"):
        for placement in ("relax", "consolidate", "any", "yarn"):
            for load in (0.6, 1.2):
                cluster = Cluster.shorthand(40, 8, racks=5)
                shape = dict(load=load, gpus=cluster.total_gpus, diurnal=0.9, cap_s=48 * 3600.0)
                options: dict[str, object] = {}
                if policy == "gittins":
                    history = workload(2000, seed=9, **shape)  # type: ignore[arg-type]
                    options["service_samples_gpu_s"] = [
                        s.gpus * (s.duration_s or 0) for s in history
                    ]
                jobs = list(workload(4000, seed=3, **shape))  # type: ignore[arg-type]
                core = Scheduler(
                    cluster,
                    make_policy(policy, **options),
                    make_placement(placement),
                    restore_s=30.0,
                )
                result = Simulation(jobs, core, record_decisions=True).run()
                digest = hashlib.sha1(repr(result.decisions).encode()).hexdigest()[:12]
                print(
                    f"{policy} {placement} {load}: {len(result.decisions)} decisions, "
                    f"{result.preemptions} preemptions, {digest}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
