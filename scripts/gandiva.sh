#!/usr/bin/env bash
# Reproduce docs/gandiva.md: Gandiva's time-slicing, packing and migration against fifo and las on
# the busiest Gavel-MSR virtual cluster (6214e9: 2,000 jobs of 1 to 8 GPUs, 1.17 times the
# capacity of 16 x 8 V100 over its 48 days of arrivals), consolidated placement, 30 s restore.
# Takes about 2 minutes on 2 cores. Writes runs/gandiva/ (or $1), the table on stdout and
# docs/img/gandiva.png.
# Run from the repository root after the README's first command: bash scripts/gandiva.sh
set -euo pipefail
corral=${CORRAL:-.venv/bin/corral}
python=${PYTHON:-.venv/bin/python}
out=${1:-runs/gandiva}
common=(--trace gavel:../shared/data/gavel-msr/seed0/6214e9.trace --cluster 16x8
  --placement consolidate --restore-s 30)
"$corral" simulate "${common[@]}" --compare fifo,las,timeslice --timeslice-quantum-s 600 --out "$out/base"
"$corral" simulate "${common[@]}" --policy las --stages packing --out "$out/las+packing"
"$corral" simulate "${common[@]}" --policy las --stages migration --out "$out/las+migrate"
"$corral" simulate "${common[@]}" --policy las --stages packing,migration --out "$out/las+packing+migrate"

"$python" - "$out" docs/img/gandiva.png <<'EOF'
"""The comparison table (markdown) and docs/img/gandiva.png from the four runs above."""
import csv
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

out, image = Path(sys.argv[1]), Path(sys.argv[2])
rows = []
for folder in ("base", "las+packing", "las+migrate", "las+packing+migrate"):
    for run in json.loads((out / folder / "summary.json").read_text())["runs"]:
        name = run["policy"] if folder == "base" else folder
        with (out / folder / f"jobs-{run['policy']}-{run['placement']}.csv").open() as handle:
            jct = [float(r["jct_s"]) / 3600 for r in csv.DictReader(handle) if r["jct_s"]]
        rows.append((name, run, np.sort(jct)))


def hours(value):
    return f"{value / 3600:.1f} h"


print("| run | avg JCT | p50 JCT | p95 JCT | makespan | utilisation | useful util. | util. while waiting | fragmentation | preemptions | packed GPU-h | migrations |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for name, run, _ in rows:
    print(
        f"| {name} | {hours(run['avg_jct_s'])} | {hours(run['p50_jct_s'])} | "
        f"{hours(run['p95_jct_s'])} | {run['makespan_s'] / 86400:.1f} d | "
        f"{run['utilization']:.1%} | {run['useful_utilization']:.1%} | "
        f"{run['utilization_while_waiting']:.1%} | {run['fragmentation']:.1%} | "
        f"{run['preemptions']:,} | {run.get('packed_gpu_hours', 0):,.0f} | "
        f"{run.get('migrations', 0)} |"
    )

fig, (cdf, bars) = plt.subplots(1, 2, figsize=(12, 4.5))
for index, (name, _, jct) in enumerate(rows):  # the las variants overlap: dashed, dotted
    style = {"las+migrate": "--", "las+packing+migrate": ":"}.get(name, "-")
    shares = np.arange(1, len(jct) + 1) / len(jct)
    cdf.step(jct, shares, where="post", label=name, color=f"C{index}", linestyle=style)
cdf.set_xscale("log")
cdf.set_xlabel("job completion time (hours, log scale)")
cdf.set_ylabel("share of jobs")
cdf.set_title("JCT distribution")
cdf.grid(alpha=0.3)
cdf.legend(loc="lower right", fontsize=8)
names = [name for name, _, _ in rows]
means = [run["avg_jct_s"] / 3600 for _, run, _ in rows]
drawn = bars.barh(names, means, color=[f"C{i}" for i in range(len(rows))])
bars.bar_label(drawn, [f"{m:.0f} h" for m in means], padding=3, fontsize=8)
bars.invert_yaxis()
bars.set_xlabel("average JCT (hours)")
bars.set_title("Average JCT")
bars.set_xlim(0, max(means) * 1.15)
fig.suptitle("Gavel-MSR VC 6214e9 (2,000 jobs) on 16 x 8 V100, consolidated placement")
fig.tight_layout()
image.parent.mkdir(parents=True, exist_ok=True)
fig.savefig(image, dpi=110)
print(f"\nwrote {image}")
EOF
