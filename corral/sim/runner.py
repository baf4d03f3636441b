"""`corral simulate`: load a trace, build the cluster, run each policy, write and print results."""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from corral.core.cluster import Cluster, ClusterError
from corral.core.config import ConfigError
from corral.core.job import JobSpec
from corral.core.placement import make_placement
from corral.core.policy import POLICIES, make_policy
from corral.core.policy.base import Policy
from corral.sim.engine import FailureModel, Simulation
from corral.sim.perfmodel import PerfModel, PerfModelError, load_slowdowns
from corral.sim.report import summary_table, write_outputs
from corral.sim.result import SimResult
from corral.sim.traces import Trace, TraceError, load_trace


class SimulationError(ValueError):
    """A bad trace, config or option: reported as one line."""


@dataclass(slots=True)
class RunSettings:
    trace: str
    nodes: int = 16
    gpus_per_node: int = 8
    racks: int = 1
    gpu_type: str = "v100"
    gpus_per_switch: int | None = None
    config: Path | None = None
    policies: list[str] = field(default_factory=lambda: ["las"])
    placement: str = "relax"
    backfill: bool = False
    las_thresholds: list[float] = field(default_factory=lambda: [3600.0, 36000.0])
    starvation_factor: float | None = None
    gittins_history: Path | None = None
    relax_after_s: float = 600.0
    profile_threshold: float = 1.1
    restore_s: float = 30.0
    failure_rate: float = 0.0
    max_retries: int = 3
    arrival_scale: float = 1.0
    window: tuple[int, int] | None = None
    skip_oversized: bool = False
    slowdowns: Path | None = None
    seed: int = 0


def build_cluster(settings: RunSettings) -> Cluster:
    if settings.config is not None:
        from corral.config_file import load_cluster_config

        return load_cluster_config(settings.config).cluster
    return Cluster.shorthand(
        settings.nodes,
        settings.gpus_per_node,
        settings.racks,
        settings.gpu_type,
        settings.gpus_per_switch,
    )


def check_fits(trace: Trace, cluster: Cluster, skip: bool) -> tuple[list[JobSpec], int]:
    """Refuse (or, with skip, drop) jobs that no placement on this cluster could ever hold."""
    kept: list[JobSpec] = []
    dropped = 0
    for position, spec in enumerate(trace.jobs):
        capacity = cluster.capacity_for(spec.gpu_types)
        if spec.gpus <= capacity:
            kept.append(spec)
            continue
        if not skip:
            raise SimulationError(
                f"{trace.source}: job {spec.id} (number {position + 1} by arrival): gpus={spec.gpus} exceeds "
                f"the {capacity} GPUs the cluster has for it; use a bigger cluster or --skip-oversized"
            )
        dropped += 1
    return kept, dropped


def service_history(settings: RunSettings, jobs: list[JobSpec]) -> list[float]:
    """GPU-seconds per job that Gittins takes as the distribution of job sizes."""
    if settings.gittins_history is None:
        return [s.gpus * s.duration_s for s in jobs if s.duration_s]
    path = settings.gittins_history
    samples: list[float] = []
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        if reader.fieldnames is None or "duration" not in reader.fieldnames:
            raise SimulationError(f"{path}: line 1: needs a 'duration' column (GPU-seconds)")
        for line, row in enumerate(reader, start=2):
            try:
                value = float(row["duration"])
            except (TypeError, ValueError):
                raise SimulationError(
                    f"{path}: line {line}: duration: not a number: {row['duration']!r}"
                ) from None
            if value > 0:
                samples.append(value)
    if not samples:
        raise SimulationError(f"{path}: no positive durations")
    return samples


def make_ordering(name: str, settings: RunSettings, jobs: list[JobSpec]) -> Policy:
    if name not in POLICIES:
        raise SimulationError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    if name == "las":
        return make_policy(
            name,
            thresholds_gpu_s=settings.las_thresholds,
            starvation_factor=settings.starvation_factor,
        )
    if name == "gittins":
        return make_policy(
            name,
            service_samples_gpu_s=service_history(settings, jobs),
            thresholds_gpu_s=settings.las_thresholds,
        )
    if name in ("sjf", "srtf") and any(s.duration_s is None for s in jobs):
        raise SimulationError(f"{name} needs every job's duration, and this trace lacks some")
    return make_policy(name)


def placement_options(settings: RunSettings) -> dict[str, float]:
    if settings.placement == "relax":
        return {"relax_after_s": settings.relax_after_s}
    if settings.placement == "profile":
        return {"sensitive_above": settings.profile_threshold}
    return {}


def run_simulations(
    settings: RunSettings, *, out: Path, plot: bool, console: Console
) -> list[dict[str, object]]:
    try:
        return _run(settings, out=out, plot=plot, console=console)
    except (TraceError, ClusterError, ConfigError, PerfModelError) as error:
        raise SimulationError(str(error)) from None


def _run(
    settings: RunSettings, *, out: Path, plot: bool, console: Console
) -> list[dict[str, object]]:
    perf = PerfModel.default_for_durations()
    if settings.slowdowns is not None:
        perf = perf.with_overrides(load_slowdowns(settings.slowdowns))
    trace = load_trace(
        settings.trace, perf=perf, seed=settings.seed, arrival_scale=settings.arrival_scale
    )
    cluster = build_cluster(settings)
    jobs, dropped = check_fits(trace, cluster, settings.skip_oversized)
    measured = None
    if settings.window is not None:
        start, end = settings.window
        if start >= len(jobs):
            raise SimulationError(f"--window: the trace has only {len(jobs)} jobs")
        measured = {spec.id for spec in jobs[start:end]}
    console.print(
        f"[bold]{trace.source}[/]: {len(jobs)} jobs on {cluster.describe()}"
        + (f"; dropped {dropped} jobs larger than the cluster" if dropped else "")
    )
    for note in trace.notes:
        console.print(f"  note: {note}")
    failures = (
        FailureModel(settings.failure_rate, settings.max_retries)
        if settings.failure_rate > 0
        else None
    )
    orderings = [make_ordering(name, settings, jobs) for name in settings.policies]
    results: list[SimResult] = []
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        for ordering in orderings:
            task = progress.add_task(f"{ordering.name}/{settings.placement}", total=len(jobs))
            run_cluster = build_cluster(settings)
            simulation = Simulation(
                jobs,
                run_cluster,
                ordering,
                make_placement(settings.placement, **placement_options(settings)),
                backfill=settings.backfill,
                speed_model=(trace.perf or perf).speed_model(run_cluster),
                restore_s=settings.restore_s,
                failures=failures,
                seed=settings.seed,
                measured=measured,
                on_progress=lambda done, total, task=task: progress.update(task, completed=done),
                options={
                    "trace": settings.trace,
                    "backfill": settings.backfill,
                    "seed": settings.seed,
                },
            )
            results.append(simulation.run())
    summaries = write_outputs(results, out, plot)
    console.print(summary_table(summaries))
    console.print(f"wrote {out / 'summary.json'}" + (" and plots" if plot else ""))
    return summaries
