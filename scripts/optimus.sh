#!/usr/bin/env bash
# Reproduce docs/optimus.md: optimus (remaining time estimated online from a loss-curve fit) against
# oracle srtf and las on Gavel-MSR; optimus again with 5x noisier loss samples and with no samples
# at all (its prior alone); the estimator's error at 25/50/75 % of each job's work; and the two
# figures docs/img/optimus-*.png. Takes about 5 minutes of CPU (11 minutes on 2 busy cores).
# Run from the repository root after the README's first command: bash scripts/optimus.sh
set -euo pipefail
corral=${CORRAL:-.venv/bin/corral}
python=${PYTHON:-.venv/bin/python}
trace=gavel:../shared/data/gavel-msr/seed0
out=${1:-runs/optimus}
common=(--trace "$trace" --cluster 64x8 --racks 8 --seed 0)
"$corral" simulate "${common[@]}" --compare optimus,srtf,las --out "$out/main"
"$corral" simulate "${common[@]}" --policy optimus --optimus-noise 0.1 --out "$out/noise0.1"

OUT="$out" "$python" - <<'PYTHON'
"""The prior-only ablation, the estimator's error, the tables and the figures."""
import csv
import json
import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from corral.core.cluster import Cluster
from corral.core.estimate import fit_loss_curve, thin
from corral.core.job import Job
from corral.core.placement import make_placement
from corral.core.scheduler import Scheduler
from corral.core.policy.optimus import Optimus, no_progress
from corral.sim.engine import Simulation
from corral.sim.metrics import summarize
from corral.sim.perfmodel import PerfModel
from corral.sim.progress import LossCurveModel, estimation_errors
from corral.sim.traces import load_trace

out = Path(os.environ["OUT"])
img = Path("docs/img")
trace = load_trace(
    "gavel:../shared/data/gavel-msr/seed0", perf=PerfModel.default_for_durations(), seed=0
)
length_h = {spec.id: spec.duration_s / 3600 for spec in trace.jobs}

# Optimus fed no progress at all, its prior alone (the settings of `corral simulate` above).
cluster = Cluster.shorthand(64, 8, 8, "v100")
ablation = Simulation(
    trace.jobs,
    Scheduler(
        cluster,
        Optimus(no_progress),
        make_placement("relax", relax_after_s=600.0),
        speed_model=trace.perf.speed_model(cluster),
        restore_s=30.0,
    ),
).run()

summaries, jcts = {}, {}
for label, folder, policy in [
    ("srtf (oracle)", "main", "srtf"),
    ("optimus, noise 0.02", "main", "optimus"),
    ("optimus, noise 0.1", "noise0.1", "optimus"),
    ("las", "main", "las"),
]:
    runs = json.loads((out / folder / "summary.json").read_text())["runs"]
    summaries[label] = next(r for r in runs if r["policy"] == policy)
    with (out / folder / f"jobs-{policy}-relax.csv").open() as handle:
        rows = csv.DictReader(handle)
        jcts[label] = {r["job_id"]: float(r["jct_s"]) / 3600 for r in rows if r["jct_s"]}
summaries["optimus, prior only"] = summarize(ablation)
jcts["optimus, prior only"] = {
    j.id: (j.finished_at - j.spec.submit_time) / 3600 for j in ablation.jobs if j.finished_at
}
order = ["srtf (oracle)", "optimus, noise 0.02", "optimus, noise 0.1", "optimus, prior only", "las"]

print("| policy | avg JCT | p50 JCT | p95 JCT | avg queueing | preemptions |")
print("|---|---:|---:|---:|---:|---:|")
for label in order:
    s = summaries[label]
    print(
        f"| {label} | {s['avg_jct_s'] / 3600:.1f} h | {s['p50_jct_s'] / 3600:.1f} h | "
        f"{s['p95_jct_s'] / 3600:.1f} h | {s['avg_queue_s'] / 3600:.2f} h | {s['preemptions']:,} |"
    )

# Figure 1: JCT CDF; the mean JCT of each tenth of the jobs by length, relative to srtf (las,
# 1.5 to 20 times srtf there, is left out of that panel so the optimus variants can be told apart).
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
styles = {
    "srtf (oracle)": "k-",
    "optimus, noise 0.02": "C0-",
    "optimus, noise 0.1": "C0--",
    "optimus, prior only": "C1-",
    "las": "C3-",
}
for label in order:
    values = np.sort(list(jcts[label].values()))
    left.plot(values, np.arange(1, values.size + 1) / values.size, styles[label], label=label)
left.set_xscale("log")
left.set_xlabel("job completion time (hours, log scale)")
left.set_ylabel("fraction of jobs")
left.set_title("JCT, Gavel-MSR (15,264 jobs, 64x8 V100)")
left.grid(True, alpha=0.3)
left.legend(fontsize=8)
deciles = np.array_split(np.array(sorted(length_h, key=length_h.get)), 10)
for label in order[1:-1]:
    ratio = [
        np.mean([jcts[label][i] for i in chunk])
        / np.mean([jcts["srtf (oracle)"][i] for i in chunk])
        for chunk in deciles
    ]
    right.plot(range(1, 11), ratio, styles[label], marker="o", ms=3, label=label)
right.axhline(1.0, color="k", lw=1)
right.set_xticks(range(1, 11))
right.set_xlabel("tenth of the jobs by length (1 = shortest)")
right.set_ylabel("mean JCT / srtf's mean JCT")
right.set_title("who pays for not knowing the lengths")
right.grid(True, alpha=0.3)
right.legend(fontsize=8)
fig.tight_layout()
fig.savefig(img / "optimus-jct.png", dpi=110)

# The estimator's error at 25/50/75 % of each job's work, on every 5th job of the trace.
jobs = trace.jobs[::5]
fractions = (0.25, 0.5, 0.75)
errors = {}
print(f"\nestimator on {len(jobs)} jobs (every 5th of the trace)")
print("| noise | progress | median rel. error of remaining | p90 | jobs left to the prior |")
print("|---:|---:|---:|---:|---:|")
for noise in (0.02, 0.1):
    model = LossCurveModel(0, noise=noise)
    errors[noise] = estimation_errors(jobs, model, Optimus(model), fractions)
    for fraction, (values, prior) in errors[noise].items():
        print(
            f"| {noise} | {fraction:.0%} | {np.median(values):.1%} | "
            f"{np.percentile(values, 90):.1%} | {prior} |"
        )

# Figure 2: one job's logged losses and fits; the CDF of the estimator's relative error.
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
spec = next(s for s in jobs if 10 * 3600 < s.duration_s < 20 * 3600)
model = LossCurveModel(0, noise=0.02)
policy = Optimus(model)
hidden = model.hidden(spec)
samples = list(model(Job(spec=spec, work_done_s=spec.duration_s), 0.0).samples)
steps = np.array([s for s, _ in samples])
left.plot(steps, [v for _, v in samples], ".", ms=2, color="0.6", label="logged loss (noise 0.02)")
for fraction, colour in ((0.25, "tab:orange"), (0.5, "tab:green")):
    seen = [s for s in samples if s[0] <= fraction * hidden.total_steps]
    curve = fit_loss_curve(thin(seen, policy.max_points))
    predicted = curve.converged_step(policy.converge_fraction)
    grid = np.linspace(steps[0], max(steps[-1], predicted), 200)
    left.plot(
        grid,
        [curve.loss(k) for k in grid],
        color=colour,
        label=f"fit at {fraction:.0%}: converges at step {predicted:,.0f}",
    )
    left.axvline(fraction * hidden.total_steps, color=colour, ls=":", lw=1)
left.axvline(hidden.total_steps, color="k", lw=1, label=f"true end: step {hidden.total_steps:,.0f}")
left.set_xlabel("step")
left.set_ylabel("training loss")
left.set_title(f"one job ({spec.model}, {spec.duration_s / 3600:.1f} h)")
left.legend(fontsize=8)
for noise, style in ((0.02, "-"), (0.1, "--")):
    for fraction, colour in zip(fractions, ("tab:orange", "tab:green", "tab:red")):
        values = np.sort(errors[noise][fraction][0])
        right.plot(
            values,
            np.arange(1, values.size + 1) / values.size,
            style,
            color=colour,
            label=f"noise {noise}, at {fraction:.0%}",
        )
right.set_xscale("log")
right.set_xlim(1e-3, 10)
right.set_xlabel("|estimated - true| / true remaining work (log scale)")
right.set_ylabel("fraction of jobs with a fit")
right.set_title("estimator error by progress")
right.grid(True, alpha=0.3)
right.legend(fontsize=8)
fig.tight_layout()
fig.savefig(img / "optimus-estimate.png", dpi=110)
print(f"\nwrote {img / 'optimus-jct.png'} and {img / 'optimus-estimate.png'}")
PYTHON
