"""Fragmentation curves of a simulation, and FGD's packing experiment made of simulations.

After Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation
Gradient Descent", USENIX ATC'23, Sec. 6 (docs/fgd.md).

`FragmentationProbe` watches a simulation (`Simulation(observer=...)`, which `corral simulate`
attaches when jobs ask for shares of GPUs, CPU or memory, or the trace places or fails them, as
openb's does). On a grid of **arrived workload** (GPU requested so far, a share of the cluster's
GPU capacity) it records the state after every job that arrived while the request was at most
that share:

- `allocated_share` / `unallocated_share`: GPU capacity taken / still free;
- `frag_share`: the cluster's fragmentation F(M) (corral.core.fragmentation) over the capacity:
  free GPU that a task drawn from the target workload could not use; `frag_rate`: F(M) over the
  free GPU;
- `failed_task_share`, `failed_gpu_share`: jobs (and their GPU request) not placed when they
  arrived.

The record is exact when jobs arrive one per instant (openb's arrivals do); jobs arriving
together are recorded with the state after their round.

`corral fgd` (`run_experiment`) runs `corral simulate` on an openb trace for each placement and
each of `repeats` arrival orders (seeds `seed`, `seed+1`, ...); its curves are the median over
the orders, as the paper reports the median of its 10 repetitions.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from corral.core.cluster import MILLI, Cluster
from corral.core.fragmentation import Workload, state_of
from corral.core.job import Job, JobStatus
from corral.sim.workers import RunProgress, run_in_workers, worker_count

if TYPE_CHECKING:
    import numpy as np
    from rich.table import Table

METRICS = (
    "allocated_share",
    "unallocated_share",
    "frag_share",
    "frag_rate",
    "failed_task_share",
    "failed_gpu_share",
)
STEP = 0.01


def make_grid(target_load: float, step: float = STEP) -> list[float]:
    count = int(target_load / step + 1e-9)
    return [round(i * step, 10) for i in range(count + 1)]


def grid_for(requested_milli: int, capacity_milli: int, target_load: float | None) -> list[float]:
    """Up to the trace's target load, else up to the whole request (rounded up to the step)."""
    if target_load is None:
        share = requested_milli / capacity_milli if capacity_milli else 0.0
        target_load = max(STEP, math.ceil(share / STEP - 1e-9) * STEP)
    return make_grid(target_load)


class FragmentationProbe:
    """The fragmentation curves of one simulation (see the module's doc)."""

    def __init__(self, cluster: Cluster, workload: Workload, grid: Sequence[float]) -> None:
        self.cluster = cluster
        self.workload = workload
        self.grid = list(grid)
        self.capacity = cluster.total_gpus * MILLI
        weighted = workload.weighted_fragment
        self._changed = cluster.watch()
        self._node_frag = [weighted(state_of(cluster, n)) for n in range(len(cluster.nodes))]
        self._frag_total = sum(self._node_frag)
        self._allocated = cluster.allocated_milli
        self._marks = [x * self.capacity for x in self.grid]
        self._point = 0
        self.arrived_milli = self.arrived = self.failed = self.failed_milli = 0
        self.first_failure: float | None = None
        self.curves: dict[str, list[float]] = {metric: [] for metric in METRICS}

    def after_round(self, now: float, arrived: Sequence[Job]) -> None:
        marks = self._marks
        for job in arrived:
            milli = job.spec.total_gpu_milli
            while self._point < len(marks) and marks[self._point] < self.arrived_milli + milli:
                self._record()
                self._point += 1
            self.arrived_milli += milli
            self.arrived += 1
            if job.status is not JobStatus.RUNNING and job.first_started_at is None:
                self.failed += 1
                self.failed_milli += milli
                if self.first_failure is None:
                    self.first_failure = self.arrived_milli / self.capacity
        changed = self._changed
        if changed:
            weighted = self.workload.weighted_fragment
            cluster = self.cluster
            for node in changed:
                new = weighted(state_of(cluster, node))
                self._frag_total += new - self._node_frag[node]
                self._node_frag[node] = new
            changed.clear()
            self._allocated = self.cluster.allocated_milli

    def _record(self) -> None:
        capacity = self.capacity
        allocated = self._allocated
        free = capacity - allocated
        frag = self._frag_total / self.workload.total_weight
        curves = self.curves
        curves["allocated_share"].append(allocated / capacity)
        curves["unallocated_share"].append(free / capacity)
        curves["frag_share"].append(frag / capacity)
        curves["frag_rate"].append(frag / free if free else 0.0)
        curves["failed_task_share"].append(self.failed / self.arrived if self.arrived else 0.0)
        curves["failed_gpu_share"].append(
            self.failed_milli / self.arrived_milli if self.arrived_milli else 0.0
        )

    def finish(self) -> None:
        """Record the grid points after the last arrival, and stop watching."""
        while self._point < len(self._marks):
            self._record()
            self._point += 1
        self.cluster.unwatch(self._changed)

    def result_curves(self) -> dict[str, list[float]]:
        return {"arrived_share": list(self.grid), **self.curves}

    def summary(self) -> dict[str, object]:
        """Summary entries: the metrics at 100% arrived (when the grid reaches it) and at the
        end, and the jobs not placed when they arrived."""
        out: dict[str, object] = {
            "arrived_jobs": self.arrived,
            "unplaced_jobs": self.failed,
            "first_unplaced_at": self.first_failure,
        }
        for metric in METRICS:
            values = self.curves[metric]
            if not values:
                continue
            if self.grid[-1] >= 1.0:
                out[f"{metric}_at_100"] = _at(values, self.grid, 1.0)
            out[f"{metric}_at_end"] = values[-1]
        return out


def _at(values: Sequence[float], grid: Sequence[float], x: float) -> float:
    index = min(range(len(grid)), key=lambda i: abs(grid[i] - x))
    return float(values[index])


def fragmentation_line(summary: dict[str, object]) -> str | None:
    """One line for `corral simulate`'s output, when the run was probed."""
    at = "100% arrived" if "unallocated_share_at_100" in summary else "the end"
    suffix = "_at_100" if at == "100% arrived" else "_at_end"
    unallocated, frag = (
        summary.get(f"unallocated_share{suffix}"),
        summary.get(f"frag_share{suffix}"),
    )
    failed = summary.get(f"failed_task_share{suffix}")
    if not isinstance(unallocated, float) or not isinstance(frag, float):
        return None
    first = summary.get("first_unplaced_at")
    return (
        f"{summary['policy']}/{summary['placement']}: at {at}, {unallocated:.1%} of GPU capacity "
        f"unallocated, {frag:.1%} fragmented; {failed:.1%} of jobs not placed on arrival"
        + (f" (the first at {first:.1%} arrived)" if isinstance(first, float) else "")
        + f"; {summary.get('allocated_share_at_end', 0.0):.1%} allocated at the end"
    )


# -- FGD's experiment: medians over arrival orders ---------------------------------------------


@dataclass(frozen=True, slots=True)
class ExperimentSettings:
    #: The placements compared (`--policies`: the paper calls them scheduling policies).
    policies: tuple[str, ...] = ("fgd", "best-fit", "random-fit", "gpu-packing")
    target_load: float = 1.3  # stop arrivals at this share of GPU capacity requested
    repeats: int = 3
    seed: int = 0
    coverage: float = 1.0  # FGD's target workload: the most popular task shapes covering this
    step: float = STEP  # the grid of arrived workload the curves are recorded on
    #: Runs side by side in this many processes (0: one per CPU; corral.sim.workers).
    workers: int = 1

    def problem(self) -> str | None:
        if not self.policies:
            return "--policies: none given"
        if not 0 < self.target_load <= 10:
            return f"--target-load: must be in (0, 10], got {self.target_load}"
        if self.repeats < 1:
            return f"--repeats: must be at least 1, got {self.repeats}"
        if not 0 < self.coverage <= 1:
            return f"--coverage: must be in (0, 1], got {self.coverage}"
        if self.seed < 0:
            return f"--seed: must not be negative, got {self.seed}"
        if self.workers < 0:
            return f"--workers: must not be negative, got {self.workers}"
        return None


@dataclass(slots=True)
class RunOutcome:
    """One placement on one arrival order."""

    curves: dict[str, list[float]]
    tasks: int
    failed: int
    first_failure_share: float | None  # arrived share when the first task failed
    seconds: float


@dataclass(slots=True)
class PolicyResult:
    policy: str
    runs: list[RunOutcome] = field(default_factory=list)

    def median(self, metric: str) -> np.ndarray:
        import numpy as np

        return np.median(np.array([run.curves[metric] for run in self.runs]), axis=0)


@dataclass(slots=True)
class Experiment:
    settings: ExperimentSettings
    grid: list[float]
    capacity_gpus: float
    nodes: int
    trace_tasks: int
    workload: Workload
    results: list[PolicyResult]


def outcome(
    curves: dict[str, list[float]], summary: dict[str, object], seconds: float
) -> RunOutcome:
    """A simulation's probe record as one run of the experiment."""
    first = summary.get("first_unplaced_at")
    arrived, failed = summary.get("arrived_jobs"), summary.get("unplaced_jobs")
    assert isinstance(arrived, int) and isinstance(failed, int)
    return RunOutcome(
        curves={metric: curves[metric] for metric in METRICS},
        tasks=arrived,
        failed=failed,
        first_failure_share=first if isinstance(first, float) else None,
        seconds=seconds,
    )


def summarize(experiment: Experiment) -> dict[str, object]:
    """Headline numbers per placement (medians over repeats) at 100% arrived and at the end."""
    import numpy as np

    grid = experiment.grid
    runs: list[dict[str, object]] = []
    for result in experiment.results:
        firsts = [r.first_failure_share for r in result.runs if r.first_failure_share is not None]
        row: dict[str, object] = {
            "policy": result.policy,
            "tasks": int(np.median([r.tasks for r in result.runs])),
            "failed_tasks": int(np.median([r.failed for r in result.runs])),
            "first_failure_at": float(np.median(firsts)) if firsts else None,
            "seconds": round(sum(r.seconds for r in result.runs), 2),
        }
        for metric in METRICS:
            curve = result.median(metric)
            if 1.0 <= grid[-1]:
                row[f"{metric}_at_100"] = _at(list(curve), grid, 1.0)
            row[f"{metric}_at_end"] = float(curve[-1])
        runs.append(row)
    workload = experiment.workload
    return {
        "experiment": "fgd-packing",
        "nodes": experiment.nodes,
        "gpus": experiment.capacity_gpus,
        "trace_tasks": experiment.trace_tasks,
        "settings": {k: v for k, v in asdict(experiment.settings).items() if k != "workers"},
        "workload_types": [
            {"shape": shape.describe(), "probability": weight / workload.total_weight}
            for shape, weight in workload.types
        ],
        "runs": runs,
    }


def write_outputs(experiment: Experiment, out_dir: Path, plot: bool) -> dict[str, object]:
    """summary.json, curves.csv (median curves) and, with plot, fgd.png in out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(experiment)
    with (out_dir / "summary.json").open("w") as handle:
        json.dump(summary, handle, indent=2)
        handle.write("\n")
    with (out_dir / "curves.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["policy", "arrived_share", *METRICS])
        for result in experiment.results:
            medians = [result.median(metric) for metric in METRICS]
            for i, x in enumerate(experiment.grid):
                writer.writerow([result.policy, x, *(f"{float(m[i]):.6f}" for m in medians)])
    if plot:
        plot_curves(experiment, out_dir / "fgd.png")
    return summary


def write_curves(curves: dict[str, list[float]], path: Path) -> None:
    """One simulation's curves (`corral simulate`): a row per grid point."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        columns = ["arrived_share", *METRICS]
        writer.writerow(columns)
        for i, x in enumerate(curves["arrived_share"]):
            writer.writerow([x, *(f"{curves[m][i]:.6f}" for m in METRICS)])


def plot_curves(experiment: Experiment, out_png: Path) -> None:
    """Unallocated GPU, fragmentation and failed tasks against arrived workload, a line per
    placement."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = 100 * np.array(experiment.grid)
    # The unallocated and failed curves only part ways once the cluster is nearly full: zoom in
    # there (the paper's Fig. 9a does the same); fragmentation differs all along.
    start = max(0.0, min(70.0, x[-1] - 60.0))
    panels = (
        ("unallocated_share", "unallocated GPU (% of capacity)", start),
        ("frag_share", "fragmented GPU (% of capacity)", 0.0),
        ("failed_task_share", "tasks that could not be placed (%)", start),
    )
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    for ax, (metric, label, left) in zip(axes, panels, strict=True):
        shown = x >= left
        top = 0.0
        for index, result in enumerate(experiment.results):
            values = 100 * result.median(metric)
            top = max(top, float(values[shown].max()))
            # Dashes keep curves that coincide (fgd and gpu-packing-cpu often do) both visible.
            style = ("-", "--", "-.", (0, (1, 1)), (0, (5, 1, 1, 1)))[index % 5]
            ax.plot(x[shown], values[shown], label=result.policy, linewidth=2, linestyle=style)
        if metric == "unallocated_share":
            ideal = np.clip(100 - x[shown], 0, None)
            ax.plot(x[shown], ideal, linestyle=":", color="grey", label="ideal (no fragments)")
        ax.set_xlabel("arrived workload (% of cluster GPU capacity)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.set_xlim(left, x[-1])
        ax.set_ylim(0, 1.05 * top if top > 0 else 1)
    axes[0].legend(loc="upper right")
    settings = experiment.settings
    fig.suptitle(
        f"{experiment.nodes} nodes, {experiment.capacity_gpus:.0f} GPUs; "
        + (
            f"median of {settings.repeats} arrival orders"
            if settings.repeats > 1
            else "one arrival order"
        )
    )
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)


def summary_table(summary: dict[str, object]) -> Table:
    from rich import box
    from rich.table import Table

    from corral.sim.report import percent_cell  # report imports this module

    table = Table(
        title="GPU-sharing placement (FGD experiment)", box=box.SIMPLE_HEAD, pad_edge=False
    )
    table.add_column("placement", style="bold", no_wrap=True)
    for header in (
        "unalloc@100%",
        "frag@100%",
        "frag rate@100%",
        "failed@100%",
        "first fail at",
        "alloc@end",
        "failed@end",
        "time",
    ):
        table.add_column(header, justify="right", no_wrap=True)
    runs = summary["runs"]
    assert isinstance(runs, list)
    for run in runs:
        table.add_row(
            str(run["policy"]),
            percent_cell(run.get("unallocated_share_at_100")),
            percent_cell(run.get("frag_share_at_100")),
            percent_cell(run.get("frag_rate_at_100")),
            percent_cell(run.get("failed_task_share_at_100")),
            percent_cell(run.get("first_failure_at")),
            percent_cell(run.get("allocated_share_at_end")),
            percent_cell(run.get("failed_task_share_at_end")),
            f"{run['seconds']:.0f}s",
        )
    return table


def openb_trace(nodes: Path | str, pods: Path | str, target_load: float) -> str:
    """The `--trace` of `corral simulate` for an openb node list and pod list."""
    return f"openb:{nodes},{pods},load={target_load:g}"


class _Ended(RunProgress):
    """A run of the experiment that ended in a worker, told to `run_experiment`'s `on_run`."""

    def __init__(self, on_run: Callable[[str, int], None] | None, placement: str, repeat: int):
        self.on_run, self.placement, self.repeat = on_run, placement, repeat

    def advance(self, done: int, total: int) -> None:
        if self.on_run is not None:
            self.on_run(self.placement, self.repeat)


def _no_setup() -> None:
    return None


def _run_one(
    trace_spec: str, settings: ExperimentSettings, state: None, number: int, progress: RunProgress
) -> tuple[RunOutcome, list[float]]:
    """The experiment's run `number` (placement by placement, each for every arrival order) and
    its grid of arrived shares; says it ended through `progress` (a worker's word)."""
    from rich.console import Console

    from corral.core.framework import config_from_mapping
    from corral.sim.runner import RunSettings, simulate_results

    placement = settings.policies[number // settings.repeats]
    repeat = number % settings.repeats
    config = config_from_mapping(
        {"policy": "fifo", "placement": placement, "fgd": {"coverage": settings.coverage}}
    )
    run_settings = RunSettings(
        trace=trace_spec, policies=["fifo"], scheduler=config, seed=settings.seed + repeat
    )
    [run] = simulate_results(run_settings, Console(quiet=True))
    progress.advance(1, 1)
    grid = run.curves["arrived_share"]
    return outcome(run.curves, run.annotations, run.wall_s), grid


def run_experiment(
    nodes: Path | str,
    pods: Path | str,
    settings: ExperimentSettings,
    on_run: Callable[[str, int], None] | None = None,
) -> Experiment:
    """`corral simulate --trace openb:NODES,PODS,load=L --policy fifo --placement P --seed S`,
    for every placement P and S in seed, seed+1, ...; on_run(placement, repeat) after each (as
    each ends, in `settings.workers` processes)."""
    from corral.core.placement import PLACEMENTS
    from corral.sim.runner import SimulationError
    from corral.sim.traces import load_trace

    problem = settings.problem()
    if problem is not None:
        raise SimulationError(problem)
    sharing = [name for name, cls in PLACEMENTS.items() if cls.shares]
    unknown = [name for name in settings.policies if name not in sharing]
    if unknown:
        raise SimulationError(
            f"--policies: unknown placement {unknown[0]!r} for jobs that share GPUs; choose "
            f"from {', '.join(sharing)}"
        )
    trace_spec = openb_trace(nodes, pods, settings.target_load)
    try:
        trace = load_trace(trace_spec, seed=settings.seed)
    except ValueError as error:
        raise SimulationError(str(error)) from None
    assert trace.nodes is not None and trace.workload is not None
    runs = [
        (placement, repeat) for placement in settings.policies for repeat in range(settings.repeats)
    ]
    one_run = partial(_run_one, trace_spec, settings)
    ended = [_Ended(on_run, placement, repeat) for placement, repeat in runs]
    workers = worker_count(settings.workers, len(runs))
    if workers <= 1:
        outcomes = [one_run(None, number, ended[number]) for number in range(len(runs))]
    else:
        labels = [f"{placement}, order {repeat + 1}" for placement, repeat in runs]
        outcomes = run_in_workers(_no_setup, one_run, labels, workers, ended)
    results = [PolicyResult(placement) for placement in settings.policies]
    for number, (run, _) in enumerate(outcomes):
        results[number // settings.repeats].runs.append(run)
    grid = outcomes[-1][1]  # every run's: the trace's target load sets it
    return Experiment(
        settings=settings,
        grid=grid,
        capacity_gpus=float(sum(node.gpus for node in trace.nodes)),
        nodes=len(trace.nodes),
        trace_tasks=trace.workload.total_weight,
        workload=trace.workload.covering(settings.coverage),
        results=results,
    )
