"""FGD's packing experiment (Weng et al., USENIX ATC'23, Sec. 6) replayed on corral's sharing core.

The trace has no usable durations for this, so, as in the paper's artifact
(hkust-adsl/kubernetes-scheduler-simulator, `-tune 1.3 --shuffle-pod`), the workload is inflated
and shuffled: every task of the trace, plus tasks drawn from it with replacement until the next
draw would take the total GPU request above `target_load` x the cluster's GPU capacity, in a random
order (seeded). Tasks arrive one by one, are placed or fail at once, and never leave. As the
requested GPUs grow, the replay records, on a grid of arrived workload (share of GPU capacity
requested so far):

- `allocated_share` / `unallocated_share`: GPU capacity taken / still free;
- `frag_share`: the cluster's fragmentation F(M) (corral.core.sharing) over the capacity: free GPU
  that a task drawn from the workload could not use; `frag_rate`: F(M) over the free GPU;
- `failed_task_share`, `failed_gpu_share`: tasks (and their GPU request) that fit nowhere.

Each policy replays the same arrival sequences (one per repeat, seeds `seed`, `seed+1`, ...);
curves are the median over repeats, as the paper reports the median of its 10 repetitions.
"""

from __future__ import annotations

import csv
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from rich import box
from rich.table import Table

from corral.core.sharing import (
    PLACERS,
    GpuNode,
    SharingCluster,
    SharingError,
    SharingTask,
    Workload,
    make_placer,
)

METRICS = (
    "allocated_share",
    "unallocated_share",
    "frag_share",
    "frag_rate",
    "failed_task_share",
    "failed_gpu_share",
)


@dataclass(frozen=True, slots=True)
class ExperimentSettings:
    policies: tuple[str, ...] = ("fgd", "best-fit", "random-fit", "packing")
    target_load: float = 1.3  # stop arrivals at this share of GPU capacity requested
    repeats: int = 3
    seed: int = 0
    coverage: float = 1.0  # FGD's target workload: the most popular task shapes covering this
    step: float = 0.01  # grid of arrived workload the curves are recorded on

    def check(self) -> None:
        if not self.policies:
            raise SharingError("policies: none given")
        if not 0 < self.target_load <= 10:
            raise SharingError(f"target_load: must be in (0, 10], got {self.target_load}")
        if self.repeats < 1:
            raise SharingError(f"repeats: must be at least 1, got {self.repeats}")
        if not 0 < self.step <= self.target_load:
            raise SharingError(f"step: must be in (0, target_load], got {self.step}")
        if not 0 < self.coverage <= 1:
            raise SharingError(f"coverage: must be in (0, 1], got {self.coverage}")


@dataclass(slots=True)
class RunOutcome:
    """One policy on one arrival sequence."""

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


def arrival_sequence(
    tasks: Sequence[SharingTask], capacity_milli: int, target_load: float, rng: random.Random
) -> list[SharingTask]:
    """The trace's tasks topped up (or cut down) to `target_load` x capacity of GPU request,
    shuffled. Drawn tasks keep the name of the task they copy, with a `~k` suffix; cutting down
    drops random tasks that ask for GPUs."""
    if not tasks:
        raise SharingError("no tasks")
    target = target_load * capacity_milli
    sequence = list(tasks)
    requested = sum(t.shape.total_gpu_milli for t in sequence)
    if requested > target:  # drop random GPU tasks (CPU-only ones do not change the request)
        rng.shuffle(sequence)
        for index in range(len(sequence) - 1, -1, -1):
            if requested <= target:
                break
            if sequence[index].shape.total_gpu_milli:
                requested -= sequence.pop(index).shape.total_gpu_milli
    else:
        copies = 0
        while True:
            drawn = tasks[rng.randrange(len(tasks))]
            if requested + drawn.shape.total_gpu_milli > target:
                break
            copies += 1
            sequence.append(SharingTask(f"{drawn.name}~{copies}", drawn.shape))
            requested += drawn.shape.total_gpu_milli
    rng.shuffle(sequence)
    return sequence


def replay(
    nodes: Sequence[GpuNode],
    arrivals: Sequence[SharingTask],
    policy: str,
    workload: Workload,
    grid: Sequence[float],
    seed: int = 0,
    on_task: Callable[[int], None] | None = None,
) -> RunOutcome:
    """Place `arrivals` in order on a fresh cluster; record the metrics at each grid point x
    (the state after every task that arrived while the requested GPUs were at most x x capacity)."""
    started = time.perf_counter()
    cluster = SharingCluster(nodes)
    placer = make_placer(policy, workload, seed)
    capacity = cluster.capacity_gpu_milli
    if capacity == 0:
        raise SharingError("the cluster has no GPUs")
    weighted = workload.weighted_fragment
    node_frag = [weighted(cluster.state(i)) for i in range(len(nodes))]
    frag_total = sum(node_frag)
    curves: dict[str, list[float]] = {metric: [] for metric in METRICS}
    arrived_milli = arrived_tasks = failed = failed_milli = 0
    first_failure: float | None = None
    marks = [x * capacity for x in grid]

    def record() -> None:
        free = capacity - cluster.allocated_gpu_milli
        frag = frag_total / workload.total_weight
        curves["allocated_share"].append(cluster.allocated_gpu_milli / capacity)
        curves["unallocated_share"].append(free / capacity)
        curves["frag_share"].append(frag / capacity)
        curves["frag_rate"].append(frag / free if free else 0.0)
        curves["failed_task_share"].append(failed / arrived_tasks if arrived_tasks else 0.0)
        curves["failed_gpu_share"].append(failed_milli / arrived_milli if arrived_milli else 0.0)

    point = 0
    for index, task in enumerate(arrivals):
        shape = task.shape
        while point < len(marks) and marks[point] < arrived_milli + shape.total_gpu_milli:
            record()
            point += 1
        arrived_milli += shape.total_gpu_milli
        arrived_tasks += 1
        placement = placer.choose(cluster, shape)
        if placement is None:
            failed += 1
            failed_milli += shape.total_gpu_milli
            if first_failure is None:
                first_failure = arrived_milli / capacity
        else:
            cluster.allocate(shape, placement)
            node = placement.node
            new = weighted(cluster.state(node))
            frag_total += new - node_frag[node]
            node_frag[node] = new
        if on_task is not None:
            on_task(index + 1)
    while point < len(marks):
        record()
        point += 1
    return RunOutcome(
        curves=curves,
        tasks=len(arrivals),
        failed=failed,
        first_failure_share=first_failure,
        seconds=time.perf_counter() - started,
    )


def make_grid(target_load: float, step: float) -> list[float]:
    count = int(target_load / step + 1e-9)
    return [round(i * step, 10) for i in range(count + 1)]


def run_experiment(
    nodes: Sequence[GpuNode],
    tasks: Sequence[SharingTask],
    settings: ExperimentSettings,
    on_progress: Callable[[str, int, int, int], None] | None = None,
) -> Experiment:
    """Every policy on `settings.repeats` arrival sequences; on_progress(policy, repeat, done, total)."""
    settings.check()
    unknown = [name for name in settings.policies if name not in PLACERS]
    if unknown:
        raise SharingError(
            f"unknown placement policy {unknown[0]!r}; choose from {', '.join(PLACERS)}"
        )
    if not tasks:
        raise SharingError("no tasks")
    workload = Workload.from_shapes((t.shape for t in tasks), settings.coverage)
    capacity = SharingCluster(nodes).capacity_gpu_milli
    if capacity == 0:
        raise SharingError("the cluster has no GPUs")
    grid = make_grid(settings.target_load, settings.step)
    sequences = [
        arrival_sequence(tasks, capacity, settings.target_load, random.Random(settings.seed + r))
        for r in range(settings.repeats)
    ]
    results = []
    for policy in settings.policies:
        result = PolicyResult(policy)
        for repeat, arrivals in enumerate(sequences):

            def progress(
                done: int, policy: str = policy, repeat: int = repeat, n: int = len(arrivals)
            ) -> None:
                if on_progress is not None and (done % 200 == 0 or done == n):
                    on_progress(policy, repeat, done, n)

            result.runs.append(
                replay(nodes, arrivals, policy, workload, grid, settings.seed + repeat, progress)
            )
        results.append(result)
    return Experiment(
        settings=settings,
        grid=grid,
        capacity_gpus=capacity / 1000,
        nodes=len(nodes),
        trace_tasks=len(tasks),
        workload=workload,
        results=results,
    )


def _at(values: np.ndarray, grid: Sequence[float], x: float) -> float:
    index = min(range(len(grid)), key=lambda i: abs(grid[i] - x))
    return float(values[index])


def summarize(experiment: Experiment) -> dict[str, object]:
    """Headline numbers per policy (medians over repeats) at 100% arrived and at the end."""
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
                row[f"{metric}_at_100"] = _at(curve, grid, 1.0)
            row[f"{metric}_at_end"] = float(curve[-1])
        runs.append(row)
    workload = experiment.workload
    return {
        "experiment": "fgd-packing",
        "nodes": experiment.nodes,
        "gpus": experiment.capacity_gpus,
        "trace_tasks": experiment.trace_tasks,
        "settings": asdict(experiment.settings),
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


def plot_curves(experiment: Experiment, out_png: Path) -> None:
    """Unallocated GPU, fragmentation and failed tasks against arrived workload, one line a policy."""
    import matplotlib

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
            # Dashes keep curves that coincide (fgd and packing-cpu often do) both visible.
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


def _pct(value: object) -> str:
    return f"{100 * value:.1f}%" if isinstance(value, int | float) else "-"


def summary_table(summary: dict[str, object]) -> Table:
    table = Table(
        title="GPU-sharing placement (FGD experiment)", box=box.SIMPLE_HEAD, pad_edge=False
    )
    table.add_column("policy", style="bold", no_wrap=True)
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
            _pct(run.get("unallocated_share_at_100")),
            _pct(run.get("frag_share_at_100")),
            _pct(run.get("frag_rate_at_100")),
            _pct(run.get("failed_task_share_at_100")),
            _pct(run.get("first_failure_at")),
            _pct(run.get("allocated_share_at_end")),
            _pct(run.get("failed_task_share_at_end")),
            f"{run['seconds']:.0f}s",
        )
    return table
