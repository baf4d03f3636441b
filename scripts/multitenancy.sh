#!/usr/bin/env bash
# Reproduce docs/multitenancy.md: the Gavel-MSR workload with one VC per trace file, VC cells sized
# from each VC's demand, under quota (YARN-CS with lending) and hived (cells with lending), with
# fifo, las and gittins inside the VCs, and fairshare with fifo, each against every VC alone on its
# own cells; then a fifth of the jobs opportunistic. Takes about 28 minutes on 2 cores.
# Run from the repository root after the README's first command: bash scripts/multitenancy.sh
set -euo pipefail
corral=${CORRAL:-.venv/bin/corral}
python=${PYTHON:-.venv/bin/python}
trace=gavel:../shared/data/gavel-msr/seed0
out=${1:-runs/multitenancy}
"$corral" vc-config --trace "$trace" --cluster 64x8 --racks 8 --out "$out/vcs.yaml"
for admission in quota hived; do
  # quota: lending idle quota (the default), in the queue's order (not --quota-lend-last,
  # which the documented run predates)
  "$corral" simulate --trace "$trace" --config "$out/vcs.yaml" --admission "$admission" \
    --no-quota-lend-last --placement consolidate --compare fifo,las,gittins --private-baseline \
    --out "$out/$admission"
done
# fairshare: shares by weight alone, as documented (0: no decayed usage; the default is 7 days)
"$corral" simulate --trace "$trace" --config "$out/vcs.yaml" --admission fairshare \
  --fairshare-half-life-s 0 --placement consolidate --policy fifo --private-baseline \
  --out "$out/fairshare"
"$corral" plot-vcs "$out/quota" "$out/hived" --out "$out/vc-queueing.png"
# Opportunistic jobs: a seeded fifth of the jobs marked opportunistic (--opportunistic-share 0.2),
# fifo, under quota (lending last, the default), fairshare (as above) and hived; and quota lending
# last with every job guaranteed, the same jobs all alike. Then each class's queueing in each run:
# the marked jobs and the others (in the runs without marks too).
"$corral" simulate --trace "$trace" --config "$out/vcs.yaml" --admission quota \
  --placement consolidate --policy fifo --private-baseline --out "$out/quota-lend-last"
for admission in quota hived; do
  "$corral" simulate --trace "$trace" --config "$out/vcs.yaml" --admission "$admission" \
    --opportunistic-share 0.2 --placement consolidate --policy fifo --private-baseline \
    --out "$out/$admission-opportunistic"
done
"$corral" simulate --trace "$trace" --config "$out/vcs.yaml" --admission fairshare \
  --fairshare-half-life-s 0 --opportunistic-share 0.2 --placement consolidate --policy fifo \
  --private-baseline --out "$out/fairshare-opportunistic"
"$python" - "$trace" "$out" <<'PY'
import csv
import sys
from pathlib import Path

from corral.core.framework import config_from_mapping
from corral.core.job import Priority
from corral.sim.perfmodel import PerfModel
from corral.sim.runner import RunSettings, assign_tenants, build_cluster, check_fits
from corral.sim.traces import load_trace

trace, out = sys.argv[1], Path(sys.argv[2])
# The jobs `simulate --opportunistic-share 0.2` marks (seed 0), drawn as the simulator draws them.
settings = RunSettings(
    trace=trace,
    config=out / "vcs.yaml",
    opportunistic_share=0.2,
    scheduler=config_from_mapping({"admission": "quota"}),
)
loaded = load_trace(trace, perf=PerfModel.default_for_durations(), seed=settings.seed)
cluster, vcs, _ = build_cluster(settings, loaded)
jobs, _ = check_fits(loaded, cluster, False)
marked = {s.id for s in assign_tenants(jobs, settings, vcs) if s.priority is Priority.OPPORTUNISTIC}
for run in ("quota", "quota-lend-last", "quota-opportunistic", "fairshare",
            "fairshare-opportunistic", "hived", "hived-opportunistic"):
    rows = list(csv.DictReader(open(out / run / "jobs-fifo-consolidate.csv")))
    line = []
    for name, mine in (("others", False), ("marked", True)):
        sel = [r for r in rows if (r["job_id"] in marked) == mine]
        queue = sum(float(r["queue_s"]) for r in sel) / len(sel) / 3600
        jct = sum(float(r["jct_s"]) for r in sel) / len(sel) / 3600
        line.append(f"{name} ({len(sel)}): queueing {queue:.1f} h, JCT {jct:.1f} h")
    print(f"{run}: " + "; ".join(line))
PY
