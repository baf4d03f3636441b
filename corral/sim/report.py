"""Write what `corral simulate` produced: summary.json, per-job CSVs, PNG plots, a rich table."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

from corral.core.text import count_noun
from corral.sim.metrics import JOB_COLUMNS, completion_times, job_values, summarize
from corral.sim.result import SimResult, TimelineTotals

if TYPE_CHECKING:
    import numpy as np
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

MAX_PLOT_POINTS = 2000


def format_duration(seconds: float | None) -> str:
    """Short human form: '12s', '4.5m', '45m', '3.2h', '12.5d'; '-' when undefined."""
    if seconds is None or math.isnan(seconds):
        return "-"
    if math.isinf(seconds):
        return "inf" if seconds > 0 else "-inf"
    if seconds < 0:
        return "-" + format_duration(-seconds)
    # Thresholds sit just below each unit's rollover so that 59.7 s reads '1.0m', not '60s'.
    if seconds < 59.5:
        if seconds >= 9.95 or seconds == int(seconds):
            return f"{seconds:.0f}s"
        return f"{seconds:.1f}s"
    if seconds < 59.5 * 60:
        minutes = seconds / 60
        return f"{minutes:.0f}m" if minutes >= 9.95 else f"{minutes:.1f}m"
    if seconds < 47.95 * 3600:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def format_hours(seconds: float | None) -> str:
    """Seconds as hours, the unit of every duration column of the printed tables (and of the
    README's): '561.8', '2.5', '0.25', '0.004', '<0.001'; '-' when undefined. One decimal from an hour on,
    three significant digits below (at least 0.001 h, 3.6 s), so short runs do not read 0.0."""
    if seconds is None or math.isnan(seconds):
        return "-"
    if math.isinf(seconds):
        return "inf" if seconds > 0 else "-inf"
    hours = seconds / 3600
    if abs(hours) >= 0.995 or hours == 0:
        return f"{hours:.1f}"
    if abs(hours) >= 0.0995:
        return f"{hours:.2f}"
    if abs(hours) < 0.0005:  # not zero, but under the 3.6 s the last decimal shows
        return "<0.001" if hours > 0 else ">-0.001"
    return f"{hours:.3f}"


#: Printed under every table with queueing and pending columns: the two differ for a policy that
#: preempts (las counts as queueing only the wait before a job's first start).
QUEUE_FOOTNOTE = (
    "queueing: from submission to the first start; pending: all the time spent waiting, "
    "including after each preemption"
)


def downsample_step(
    time_s: list[float] | np.ndarray,
    values: list[float] | list[int] | np.ndarray,
    max_points: int = MAX_PLOT_POINTS,
) -> tuple[np.ndarray, np.ndarray]:
    """Reduce a step function to at most `max_points` samples of the same kind.

    Input and output follow Timeline's convention: values[i] holds on [t[i], t[i+1]) and the last
    point only closes the span. Each output step is the time-weighted mean of the input over an
    equal-width time bucket, so the mean over the whole span is preserved exactly (up to rounding)
    and short spikes are averaged rather than dropped or kept at random.
    """
    import numpy as np

    times = np.asarray(time_s, dtype=float)
    vals = np.asarray(values, dtype=float)
    if times.size <= max(max_points, 2):
        return times.copy(), vals.copy()
    span = times[-1] - times[0]
    if span <= 0.0:
        return times[-1:].copy(), vals[-1:].copy()
    # The integral of a step function is piecewise linear, so interpolating it at bucket edges
    # gives each bucket's exact area.
    area = np.concatenate(([0.0], np.cumsum(vals[:-1] * np.diff(times))))
    edges = np.linspace(times[0], times[-1], max_points)
    means = np.diff(np.interp(edges, times, area)) / np.diff(edges)
    return edges, np.append(means, vals[-1])


def jobs_csv_name(policy: str, placement: str, taken: set[str]) -> str:
    """jobs-POLICY-PLACEMENT.csv, numbered where two runs of one pair (different options) would
    share it; added to `taken`."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", f"jobs-{policy}-{placement}")
    name, n = f"{stem}.csv", 1
    while name in taken:
        n += 1
        name = f"{stem}-{n}.csv"
    taken.add(name)
    return name


def decisions_name(jobs_csv: str) -> str:
    """decisions-POLICY-PLACEMENT.jsonl beside the run's jobs-POLICY-PLACEMENT.csv."""
    return f"decisions-{jobs_csv.removeprefix('jobs-').removesuffix('.csv')}.jsonl"


def _write_jobs_csv(result: SimResult, path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(JOB_COLUMNS)
        measured = result.measured
        writer.writerows(
            job_values(job, measured is None or job.id in measured) for job in result.jobs
        )


def _write_decisions(result: SimResult, path: Path) -> None:
    """One JSON line per Start and Preempt (`SimResult.decision_records`): what `corral
    export-trace` writes from a live manager's history, to compare line by line."""
    with path.open("w") as handle:
        for record in result.decision_records():
            handle.write(json.dumps(record) + "\n")


def write_outputs(results: list[SimResult], out_dir: Path, plot: bool) -> list[dict[str, object]]:
    """Write summary.json, jobs-<policy>-<placement>.csv and decisions-<policy>-<placement>.jsonl
    per run and (plot=True) the PNGs."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summaries = [summarize(result) for result in results]
    with (out_dir / "summary.json").open("w") as handle:
        # default=str: options may hold values (paths, enums) that JSON has no type for.
        json.dump({"runs": summaries}, handle, indent=2, default=str)
        handle.write("\n")
    taken: set[str] = set()
    for result in results:
        if result.stats is not None:  # a streamed run wrote its files as it ran
            continue
        name = jobs_csv_name(result.policy, result.placement, taken)
        _write_jobs_csv(result, out_dir / name)
        if result.options.get("decisions"):
            _write_decisions(result, out_dir / decisions_name(name))
        if result.curves:
            from corral.sim.fragmentation import write_curves

            write_curves(result.curves, out_dir / f"curves-{name.removeprefix('jobs-')}")
    if plot:
        write_plots(results, out_dir)
    return summaries


def write_plots(results: list[SimResult], out_dir: Path) -> None:
    """jct_cdf.png, utilization.png and queue.png in out_dir (the last two not of streamed runs)."""
    import matplotlib

    matplotlib.use("Agg")  # headless: simulations run on servers and in CI
    import matplotlib.pyplot as plt

    def save(fig: Figure, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 5))
    _plot_jct_cdf(ax, results)
    save(fig, "jct_cdf.png")
    # A streamed run keeps its timeline as sums (TimelineTotals): nothing to draw over time.
    results = [r for r in results if not isinstance(r.timeline, TimelineTotals)]
    if not results:
        return

    origin = min((r.timeline.time_s[0] for r in results if r.timeline.time_s), default=0.0)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for result in results:
        timeline = result.timeline
        if not timeline.time_s:
            continue
        times, allocated = downsample_step(timeline.time_s, timeline.allocated_gpus)
        fraction = allocated / result.total_gpus if result.total_gpus > 0 else allocated * 0.0
        ax.step((times - origin) / 3600, fraction, where="post", label=_label(result), lw=1)
    ax.set_ylim(0, 1.05)
    _finish_time_axes(ax, "GPU utilisation over time", "GPUs allocated (fraction of cluster)")
    save(fig, "utilization.png")

    fig, ax = plt.subplots(figsize=(10, 4.5))
    for result in results:
        timeline = result.timeline
        if not timeline.time_s:
            continue
        times, pending = downsample_step(timeline.time_s, timeline.pending_jobs)
        ax.step((times - origin) / 3600, pending, where="post", label=_label(result), lw=1)
    ax.set_ylim(bottom=0)
    _finish_time_axes(ax, "Queue length over time", "Pending jobs")
    save(fig, "queue.png")


def _label(result: SimResult) -> str:
    return f"{result.policy}/{result.placement}"


def _plot_jct_cdf(ax: Axes, results: list[SimResult]) -> None:
    import numpy as np
    from matplotlib.ticker import LogFormatter

    class PlainLogFormatter(LogFormatter):
        """Matplotlib's choice of which log ticks to label, written "0.5" and "2", not "5e-01"."""

        def __call__(self, x: float, pos: int | None = None) -> str:
            return f"{x:g}" if super().__call__(x, pos) else ""

    plotted = False
    for result in results:
        hours = np.sort(completion_times(result)) / 3600
        hours = hours[hours > 0]  # a log axis cannot show zero-length jobs
        if hours.size == 0:
            continue
        fraction = np.arange(1, hours.size + 1) / hours.size
        if hours.size > MAX_PLOT_POINTS:
            keep = np.unique(np.linspace(0, hours.size - 1, MAX_PLOT_POINTS).astype(int))
            hours, fraction = hours[keep], fraction[keep]
        # Start each curve from 0 so the first job shows as a jump, like the others.
        hours = np.concatenate(([hours[0]], hours))
        fraction = np.concatenate(([0.0], fraction))
        ax.step(hours, fraction, where="post", label=_label(result), lw=1.2)
        plotted = True
    if plotted:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(PlainLogFormatter())
        ax.xaxis.set_minor_formatter(PlainLogFormatter(labelOnlyBase=False))
        ax.legend(loc="lower right")
    else:
        ax.text(0.5, 0.5, "no completed jobs", ha="center", va="center", transform=ax.transAxes)
    ax.set_ylim(0, 1.02)
    ax.set_title("Job completion time (CDF)")
    ax.set_xlabel("JCT (hours, log scale)")
    ax.set_ylabel("Fraction of completed jobs")
    ax.grid(True, which="both", alpha=0.3)


def _finish_time_axes(ax: Axes, title: str, ylabel: str) -> None:
    ax.set_title(title)
    ax.set_xlabel("Time since trace start (hours)")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best")


def percent_cell(fraction: object) -> str:
    return f"{100 * fraction:.1f}%" if isinstance(fraction, int | float) else "-"


def _duration_cell(value: object) -> str:
    return format_hours(float(value)) if isinstance(value, int | float) else "-"


def summary_table(summaries: list[dict[str, object]]) -> Table:
    """One row per run, one column per headline metric; runs side by side for --compare.
    Durations in hours, as the README's table."""
    from rich import box
    from rich.table import Table

    table = Table(
        title="Simulation summary (durations in hours)",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        caption=QUEUE_FOOTNOTE,
        caption_justify="left",
    )
    table.add_column("policy/placement", style="bold", no_wrap=True)
    for header in (
        "jobs",
        "avg JCT",
        "p50 JCT",
        "p95 JCT",
        "p99 JCT",
        "avg queueing",
        "avg pending",
        "makespan",
        "util",
        "util (wait)",
        "preempt",
    ):
        table.add_column(header, justify="right", no_wrap=True)
    for run in summaries:
        table.add_row(
            f"{run.get('policy', '-')}/{run.get('placement', '-')}",
            str(run.get("jobs", "-")),
            _duration_cell(run.get("avg_jct_s")),
            _duration_cell(run.get("p50_jct_s")),
            _duration_cell(run.get("p95_jct_s")),
            _duration_cell(run.get("p99_jct_s")),
            _duration_cell(run.get("avg_queue_s")),
            _duration_cell(run.get("avg_pending_s")),
            _duration_cell(run.get("makespan_s")),
            percent_cell(run.get("utilization")),
            percent_cell(run.get("utilization_while_waiting")),
            str(run.get("preemptions", "-")),
        )
    return table


def vc_table(summary: dict[str, object]) -> Table:
    """Per-VC queueing and shares of one run, with the private baseline when it was computed."""
    from rich import box
    from rich.table import Table

    per_vc = summary.get("per_vc")
    table = Table(
        title=f"Per VC: {summary.get('policy')}/{summary.get('placement')} (durations in hours)",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for header in (
        "vc",
        "jobs",
        "avg queueing",
        "private",
        "multi-GPU queueing",
        "private",
        "avg JCT",
        "GPU share",
        "preempted",
    ):
        table.add_column(header, justify="left" if header == "vc" else "right", no_wrap=True)
    anomalies = set(summary.get("sharing_anomaly_vcs") or [])  # type: ignore[call-overload]
    for name, row in (per_vc or {}).items():  # type: ignore[union-attr]
        table.add_row(
            f"{name} *" if name in anomalies else name,
            str(row.get("jobs", "-")),
            _duration_cell(row.get("avg_queue_s")),
            _duration_cell(row.get("private_avg_queue_s")),
            _duration_cell(row.get("multi_gpu_avg_queue_s")),
            _duration_cell(row.get("private_multi_gpu_avg_queue_s")),
            _duration_cell(row.get("avg_jct_s")),
            percent_cell(row.get("gpu_share")),
            str(row.get("preemptions_suffered", "-")),
        )
    table.caption = "queueing: from submission to the first start"
    if anomalies:
        table.caption += "\n* sharing anomaly: queues longer than on its private cluster"
    table.caption_justify = "left"
    return table


def plot_vc_queueing(runs: list[tuple[str, dict[str, object]]], out_png: Path) -> None:
    """Per VC, the average queueing delay under each run next to the VC alone on its own cells."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    vcs = sorted(
        {vc for _, summary in runs for vc in (summary.get("per_vc") or {})} - {"opportunistic"}
    )  # type: ignore[union-attr]
    fig, axes = plt.subplots(
        len(runs), 1, figsize=(11, 3.2 * len(runs)), sharex=True, squeeze=False
    )
    for ax, (label, summary) in zip(axes[:, 0], runs, strict=True):
        per_vc: dict[str, dict[str, object]] = summary.get("per_vc") or {}  # type: ignore[assignment]
        x = np.arange(len(vcs))

        def hours(key: str, per_vc: dict[str, dict[str, object]] = per_vc) -> list[float]:
            values = []
            for vc in vcs:
                value = per_vc.get(vc, {}).get(key)
                values.append(
                    max(float(value) / 3600, 1e-3) if isinstance(value, int | float) else np.nan
                )
            return values

        ax.bar(x - 0.2, hours("avg_queue_s"), width=0.4, label="shared")
        ax.bar(x + 0.2, hours("private_avg_queue_s"), width=0.4, label="alone on its own cells")
        anomalies = summary.get("sharing_anomaly_vcs") or []
        ax.set_yscale("log")
        ax.set_ylabel("avg queueing (h)")
        ax.set_title(
            f"{label}: {count_noun(len(anomalies), 'VC')} "  # type: ignore[arg-type]
            "with sharing anomaly"
            f"{' (' + ', '.join(anomalies) + ')' if anomalies else ''}"
        )  # type: ignore[arg-type]
        ax.grid(axis="y", alpha=0.3)
        ax.legend(loc="upper left")
    axes[-1, 0].set_xticks(np.arange(len(vcs)), vcs, rotation=45, ha="right")
    axes[-1, 0].set_xlabel("virtual cluster")
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=100)
    plt.close(fig)


class QuietProgress:
    """A progress bar that draws nothing, as rich's transient one draws nothing on a console
    that is no terminal (a pipe, a file): the same calls, without rich's thread or imports, and
    the one empty line rich's prints there as it stops."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.tasks = 0

    def __enter__(self) -> QuietProgress:
        return self

    def __exit__(self, *_: object) -> None:
        self.console.print()  # (rich's Progress.stop on a console that is not interactive)

    def add_task(self, description: str, *_: object, **__: object) -> int:
        self.tasks += 1
        return self.tasks - 1

    def update(self, task: int, **_: object) -> None:
        pass

    def advance(self, task: int, advance: float = 1) -> None:
        pass

    def start_task(self, task: int) -> None:
        pass


def progress_bar(console: Console) -> Progress | QuietProgress:
    """The transient progress bar long runs show while they work (one task per run); on a
    console that is no terminal, where it would show nothing, one that shows nothing without
    rich (a `corral simulate` piped starts some 40 M instructions sooner)."""
    if not (console.is_terminal or console.is_interactive or console.is_jupyter):
        return QuietProgress(console)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
