#!/usr/bin/env bash
# Reproduce docs/elasticflow.md: ElasticFlow (admission control, minimum satisfactory shares,
# resizing) against edf, las and fifo on two Gavel-MSR virtual clusters (ee9e8c and 6c71a0, 2,000
# jobs each) on 16 x 8 V100, relax placement, 30 s restore, deadlines = submit + U(0.5, 1.5) x
# duration (seed 0); then the same on ee9e8c with tighter and looser deadlines, and on fewer GPUs.
# Takes about 3 minutes on 2 cores. Writes runs/elasticflow/ (or $1), the tables on stdout and
# docs/img/elasticflow.png.
# Run from the repository root after the README's first command: bash scripts/elasticflow.sh
set -euo pipefail
corral=${CORRAL:-.venv/bin/corral}
python=${PYTHON:-.venv/bin/python}
out=${1:-runs/elasticflow}
traces=../shared/data/gavel-msr/seed0
common=(--placement relax --restore-s 30 --seed 0 --compare elasticflow,edf,las,fifo)
for vc in ee9e8c 6c71a0; do
  "$corral" simulate --trace "gavel:$traces/$vc.trace" --cluster 16x8 "${common[@]}" --out "$out/$vc"
done
for factor in 0.25:0.75 1.0:1.5 1.5:2.0 2.0:3.0; do
  "$corral" simulate --trace "gavel:$traces/ee9e8c.trace" --cluster 16x8 "${common[@]}" \
    --deadline-factor "$factor" --out "$out/ee9e8c-$factor"
done
for nodes in 4 8; do
  "$corral" simulate --trace "gavel:$traces/ee9e8c.trace" --cluster "${nodes}x8" "${common[@]}" \
    --out "$out/ee9e8c-${nodes}x8"
done

"$python" - "$out" docs/img/elasticflow.png <<'EOF'
"""The comparison tables (markdown) and docs/img/elasticflow.png from the runs above."""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

out, image = Path(sys.argv[1]), Path(sys.argv[2])
POLICIES = ["elasticflow", "edf", "las", "fifo"]


def runs(folder):
    return {r["policy"]: r for r in json.loads((out / folder / "summary.json").read_text())["runs"]}


def hours(seconds):
    return f"{seconds / 3600:.1f} h"


print("| VC | policy | deadlines met | admitted | refused: alone / contention | avg JCT | p95 JCT | utilisation | preemptions | grows / shrinks / suspensions | migrations |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
main = {}
for vc in ("ee9e8c", "6c71a0"):
    main[vc] = runs(vc)
    for name in POLICIES:
        r = main[vc][name]
        resizes = f"{r['grows']:,} / {r['shrinks']:,} / {r['suspensions']:,}" if "grows" in r else "-"
        refused = f"{r['refused_alone']} / {r['refused'] - r['refused_alone']}" if "grows" in r else "-"
        print(
            f"| {vc} | {name} | {r['deadline_met_share']:.1%} ({r['deadlines_met']:,}) | "
            f"{r['admitted']:,} | {refused} | {hours(r['avg_jct_s'])} | {hours(r['p95_jct_s'])} | "
            f"{r['utilization']:.1%} | {r['preemptions']:,} | {resizes} | {r.get('migrations', '-')} |"
        )

factors = ["0.25:0.75", "0.5:1.5", "1.0:1.5", "1.5:2.0", "2.0:3.0"]
sweep = {f: (main["ee9e8c"] if f == "0.5:1.5" else runs(f"ee9e8c-{f}")) for f in factors}
print("\n| deadline factor | " + " | ".join(POLICIES) + " | elasticflow admitted |")
print("|---|" + "---:|" * (len(POLICIES) + 1))
for f in factors:
    cells = " | ".join(f"{sweep[f][p]['deadline_met_share']:.1%}" for p in POLICIES)
    print(f"| U({f.replace(':', ', ')}) | {cells} | {sweep[f]['elasticflow']['admitted']:,} |")

sizes = {"4x8": runs("ee9e8c-4x8"), "8x8": runs("ee9e8c-8x8"), "16x8": main["ee9e8c"]}
print("\n| cluster (VC ee9e8c) | " + " | ".join(POLICIES) + " | elasticflow admitted | refused: alone / contention |")
print("|---|" + "---:|" * (len(POLICIES) + 2))
for size, r in sizes.items():
    cells = " | ".join(f"{r[p]['deadline_met_share']:.1%}" for p in POLICIES)
    ef = r["elasticflow"]
    print(f"| {size} | {cells} | {ef['admitted']:,} | {ef['refused_alone']} / {ef['refused'] - ef['refused_alone']} |")

fig, (bars, lines, load) = plt.subplots(1, 3, figsize=(16, 4.6))
width = 0.2
x = np.arange(len(main))
for i, name in enumerate(POLICIES):
    shares = [100 * main[vc][name]["deadline_met_share"] for vc in main]
    drawn = bars.bar(x + (i - 1.5) * width, shares, width, label=name, color=f"C{i}")
    bars.bar_label(drawn, [f"{s:.0f}" for s in shares], padding=2, fontsize=8)
admitted = [100 * main[vc]["elasticflow"]["admitted"] / main[vc]["elasticflow"]["deadline_jobs"] for vc in main]
bars.scatter(x - 1.5 * width, admitted, marker="_", s=300, color="black", label="elasticflow: admitted")
bars.set_xticks(x, [f"VC {vc}" for vc in main])
bars.set_ylabel("deadlines met (% of all jobs submitted)")
bars.set_ylim(0, 105)
bars.set_title("Deadlines met, deadline = submit + U(0.5, 1.5) x duration")
bars.legend(loc="upper right", fontsize=8)
bars.grid(axis="y", alpha=0.3)
labels = [f"U({f.replace(':', ', ')})" for f in factors]
for i, name in enumerate(POLICIES):
    lines.plot(labels, [100 * sweep[f][name]["deadline_met_share"] for f in factors], marker="o", label=name, color=f"C{i}")
lines.set_xlabel("deadline factor lambda (deadline = submit + lambda x duration)")
lines.set_ylabel("deadlines met (%)")
lines.set_ylim(0, 105)
lines.set_title("VC ee9e8c: tighter to looser deadlines")
lines.legend(loc="lower right", fontsize=8)
lines.grid(alpha=0.3)
gpus = [int(size.split("x")[0]) * 8 for size in sizes]
for i, name in enumerate(POLICIES):
    load.plot(gpus, [100 * r[name]["deadline_met_share"] for r in sizes.values()], marker="o", label=name, color=f"C{i}")
load.plot(gpus, [100 * r["elasticflow"]["admitted"] / r["elasticflow"]["deadline_jobs"] for r in sizes.values()], linestyle="--", color="C0", label="elasticflow: admitted")
load.set_xscale("log", base=2)
load.set_xticks(gpus, [str(g) for g in gpus])
load.set_xlabel("GPUs in the cluster (V100, 8 per node)")
load.set_ylabel("deadlines met (%)")
load.set_ylim(0, 105)
load.set_title("VC ee9e8c, U(0.5, 1.5): smaller clusters")
load.legend(loc="upper left", fontsize=8)
load.grid(alpha=0.3)
fig.suptitle("ElasticFlow vs edf, las, fifo on Gavel-MSR (2,000 jobs per VC), 16 x 8 V100 unless noted, 30 s restore")
fig.tight_layout()
image.parent.mkdir(parents=True, exist_ok=True)
fig.savefig(image, dpi=110)
print(f"\nwrote {image}")
EOF
