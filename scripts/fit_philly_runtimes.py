"""Fit the run-time distribution that `synthetic` draws from, to Philly's job run times.

Reads `philly_runtime.csv` (one column `runtime`, seconds; 83,154 jobs of Microsoft's Philly
cluster, published by alibaba/clusterdata as cluster-trace-gpu-v2020/analysis/philly_runtime.csv,
https://github.com/alibaba/clusterdata, from the Philly traces of Jeon et al., "Analysis of
Large-Scale Multi-Tenant GPU Clusters for DNN Training Workloads", USENIX ATC 2019,
https://github.com/msr-fiddle/philly-traces), keeps the positive ones, and writes their empirical
quantile table into `corral/sim/traces/philly_runtimes.py`: the run time at each probability of
a fixed grid, finer in the heavy tail. `synthetic` samples it by inverse transform, interpolating
log(run time) linearly between grid points, so a generated trace needs no data file.

Prints how the fitted distribution compares with the data (mean, percentiles, the largest gap
between the two CDFs). From the repository root:

    .venv/bin/python scripts/fit_philly_runtimes.py [../shared/data/philly/philly_runtime.csv]
        [--check]   # compare only; fail if the module's table differs from a new fit
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
MODULE = REPO / "corral" / "sim" / "traces" / "philly_runtimes.py"
DEFAULT_DATA = Path("..") / "shared" / "data" / "philly" / "philly_runtime.csv"


def grid() -> list[float]:
    """0, 0.5 %, 1 %, ..., 99 % in steps of 0.5 %, then 99.1 % ... 99.9 %, 99.95 %, 99.99 %, 1."""
    body = [i / 200 for i in range(199)]
    tail = [0.99 + i / 1000 for i in range(1, 10)]
    return [*body, *tail, 0.9995, 0.9999, 1.0]


def read_runtimes(path: Path) -> np.ndarray:
    with path.open(newline="") as handle:
        values = [float(row["runtime"]) for row in csv.DictReader(handle)]
    data = np.array(values)
    return np.sort(data[data > 0])


def fit(data: np.ndarray) -> tuple[list[float], list[float]]:
    probabilities = grid()
    # The "inverted CDF" quantile: every value is one the data holds (whole seconds).
    quantiles = np.quantile(data, probabilities, method="inverted_cdf")
    return probabilities, [float(q) for q in quantiles]


def sample(probabilities: list[float], quantiles: list[float], u: np.ndarray) -> np.ndarray:
    return np.exp(np.interp(u, probabilities, np.log(quantiles)))


def compare(data: np.ndarray, probabilities: list[float], quantiles: list[float]) -> list[str]:
    drawn = np.sort(sample(probabilities, quantiles, np.random.default_rng(0).random(2_000_000)))
    points = np.unique(data)
    cdf_data = np.searchsorted(data, points, side="right") / data.size
    cdf_fit = np.searchsorted(drawn, points, side="right") / drawn.size
    lines = [f"{'':>10} {'data':>12} {'fitted':>12}"]
    lines.append(f"{'mean':>10} {data.mean():12,.0f} {drawn.mean():12,.0f}")
    for p in (10, 25, 50, 75, 90, 95, 99, 99.9):
        lines.append(
            f"{f'p{p:g}':>10} {np.percentile(data, p):12,.0f} {np.percentile(drawn, p):12,.0f}"
        )
    lines.append(f"largest CDF gap (KS): {np.max(np.abs(cdf_data - cdf_fit)):.4f}")
    return lines


def module_text(
    n: int, probabilities: list[float], quantiles: list[float], fitness: list[str]
) -> str:
    table = "\n".join(fitness)
    rows = ",\n".join(
        f"    ({p!r}, {q:.0f})" for p, q in zip(probabilities, quantiles, strict=True)
    )
    return f'''"""Philly's job run times as an empirical quantile table (generated: do not edit).

Written by `scripts/fit_philly_runtimes.py` from the {n:,} positive run times of
`philly_runtime.csv` (alibaba/clusterdata, cluster-trace-gpu-v2020/analysis/philly_runtime.csv,
https://github.com/alibaba/clusterdata), the jobs of Microsoft's Philly cluster analysed by Jeon et
al., "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN Training Workloads", USENIX ATC
2019 (trace: https://github.com/msr-fiddle/philly-traces). Each row is (probability p, run time in
seconds at quantile p); `corral.sim.traces.synthetic` samples it by inverse transform with
log(run time) linear between rows. Rerun the script to refit. The fit against the data (seconds;
2,000,000 draws):

{table}
"""

from __future__ import annotations

#: (cumulative probability, run time in seconds), both non-decreasing.
PHILLY_RUNTIME_QUANTILES: tuple[tuple[float, float], ...] = (
{rows},
)
'''


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", nargs="?", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--check", action="store_true", help="compare only, fail if it moved")
    args = parser.parse_args()
    if not args.data.is_file():
        print(
            f"{args.data}: no such file (the Philly run times; see the docstring)", file=sys.stderr
        )
        return 2
    data = read_runtimes(args.data)
    probabilities, quantiles = fit(data)
    fitness = compare(data, probabilities, quantiles)
    print("\n".join(fitness))
    text = module_text(data.size, probabilities, quantiles, fitness)
    if args.check:
        if MODULE.read_text() != text:
            print(f"{MODULE}: differs from a new fit of {args.data}", file=sys.stderr)
            return 1
        print(f"{MODULE}: up to date")
        return 0
    MODULE.write_text(text)
    print(f"wrote {MODULE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
