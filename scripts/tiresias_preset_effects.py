"""What each setting of `--preset tiresias` does: the preset, then the preset with one setting put
back to corral's default, on one trace; average JCT, its ratio to the preset's, and preemptions.

Needs neither Tiresias nor Python 2 (corral only). From the repository root:

    .venv/bin/python scripts/tiresias_preset_effects.py [--trace jobs=2000,load=1.3,seed=3]
        [--cluster 16x4] [--out runs/preset-effects]

The trace is a Tiresias-format CSV, a path or a synthetic spec written by
`scripts/tiresias_compare.py`'s generator (default: its overloaded trace). Prints the Markdown
table of docs/policies.md.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiresias_compare import corral_simulate, write_synthetic  # noqa: E402

# (what is put back, the flags that put it back, the policies it applies to)
CHANGES: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("placement relax", ("--placement", "relax"), ("fifo", "las", "gittins")),
    ("spread slowdown", ("--spread-slowdown",), ("fifo", "las", "gittins")),
    ("restore 30 s", ("--restore-s", "30"), ("las", "gittins")),
    ("victims lowest", ("--victims", "lowest"), ("las", "gittins")),
    (
        "thresholds 3,600 / 36,000 GPU-s",
        ("--las-thresholds-gpu-s", "3600,36000", "--gittins-thresholds-gpu-s", "3600,36000"),
        ("las", "gittins"),
    ),
    ("las queue order: entered", ("--las-queue-order", "entered"), ("las",)),
    (
        "queue changes at their instant",
        ("--no-las-demote-at-rounds", "--no-gittins-demote-at-rounds"),
        ("las", "gittins"),
    ),
    ("gittins formula: the textbook one", ("--gittins-formula", "gittins"), ("gittins",)),
    (
        "gittins: the best quantum",
        ("--gittins-formula", "gittins", "--gittins-delta-gpu-s", "none"),
        ("gittins",),
    ),
    ("gittins: no LAS queues", ("--no-gittins-queues",), ("gittins",)),
    ("gittins: the trace's own sizes", ("HISTORY",), ("gittins",)),
)


def run(trace: Path, cluster: str, policy: str, extra: tuple[str, ...], out: Path) -> tuple:
    """(average JCT, preemptions) of the preset with `extra` flags."""
    flags = ("--policy", policy, "--preset", "tiresias", *extra)
    summary = corral_simulate(trace, cluster, out, *flags)[0]
    return float(summary["avg_jct_s"]), int(summary["preemptions"])


def own_history(trace: Path, path: Path) -> None:
    """The trace's own GPU-seconds per job, as a history file (what corral uses by default)."""
    with trace.open() as handle, path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["duration"])
        for row in csv.DictReader(handle):
            writer.writerow([int(row["num_gpu"]) * int(row["duration"])])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default="jobs=2000,load=1.3,seed=3")
    parser.add_argument("--cluster", default="16x4", help="NODESxGPUS")
    parser.add_argument("--out", type=Path, default=Path("runs/preset-effects"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    nodes, gpus = (int(x) for x in args.cluster.lower().split("x"))
    trace = Path(args.trace)
    if not trace.is_file():
        trace = args.out / "trace.csv"
        write_synthetic(args.trace, nodes * gpus, trace)
    history = args.out / "own-history.csv"
    own_history(trace, history)
    print("| put back to corral's default | fifo | las | gittins |")
    print("|---|---:|---:|---:|")
    base = {p: run(trace, args.cluster, p, (), args.out / p) for p in ("fifo", "las", "gittins")}
    cells = [f"{base[p][0]:,.0f} s ({base[p][1]:,})" for p in ("fifo", "las", "gittins")]
    print(f"| nothing: the preset | {' | '.join(cells)} |")
    for name, flags, policies in CHANGES:
        flags = tuple(
            a
            for f in flags
            for a in (("--gittins-history", str(history)) if f == "HISTORY" else (f,))
        )
        cells = []
        for policy in ("fifo", "las", "gittins"):
            if policy not in policies:
                cells.append("")
                continue
            jct, preemptions = run(trace, args.cluster, policy, flags, args.out / "change")
            cells.append(f"{jct:,.0f} s ({jct / base[policy][0]:.2f}; {preemptions:,})")
        print(f"| {name} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
