"""Gavel's Philly-derived traces (stanford-futuredata/gavel, scheduler/traces/msr/).

A directory of `<vc>.trace` files (or one such file): tab-separated, 7 columns, no header:
job_type, command, steps_flag, needs_data_dir, total_steps, arrival_time_s, scale_factor (GPUs).
A job's duration is its steps over its measured throughput on consolidated v100s. The throughput
table is, in this order: the `table=PATH` option; the `perf` passed in, if it has throughputs;
`simulation_throughputs.json` in the directory above the traces (where Gavel keeps it). A `perf`
without throughputs (e.g. `default_for_durations()` with user overrides) still lends its slowdown
table. The returned Trace carries the model used in `perf`, for the simulator's speed model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from corral.core.job import JobSpec
from corral.sim.perfmodel import GAVEL_REFERENCE_TYPE, PerfModel, PerfModelError
from corral.sim.traces.base import (
    Trace,
    TraceError,
    TraceFormat,
    check_unique_ids,
    existing_path,
    integer,
    no_options,
    number,
)

COLUMNS = 7
TABLE_NAME = "simulation_throughputs.json"


def read(location: str, *, perf: PerfModel | None = None, seed: int = 0, **options: Any) -> Trace:
    table = options.pop("table", None)
    no_options("gavel", options)
    path = existing_path(location, "gavel")
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix == ".trace" and p.is_file())
        if not files:
            raise TraceError(f"{location}: no .trace files in this directory")
        table_default = path.parent / TABLE_NAME
    else:
        files = [path]
        table_default = path.parent.parent / TABLE_NAME
    perf = _perf_model(perf, table, table_default)
    jobs: list[JobSpec] = []
    where_of: list[str] = []
    for file in files:
        label = str(file) if path.is_dir() else str(location)
        for line, spec in _read_file(file, label, perf):
            jobs.append(spec)
            where_of.append(f"{file.name}: line {line}")
    check_unique_ids(jobs, where_of, str(location))
    notes = [
        f"durations from {perf.source or 'the given throughput table'} "
        f"({GAVEL_REFERENCE_TYPE}, consolidated)"
    ]
    return Trace(jobs=jobs, source=f"gavel:{location}", notes=notes, perf=perf)


def _perf_model(perf: PerfModel | None, table: object, table_default: Path) -> PerfModel:
    """The `perf` given if it has throughputs; else the table loaded, keeping `perf`'s slowdowns."""
    if table is None and perf is not None and perf.has_throughputs:
        return perf
    path = Path(str(table)) if table is not None else table_default
    if table is None and not path.exists():
        raise TraceError(f"gavel: throughput table {path} not found; pass table=PATH")
    try:
        loaded = PerfModel.from_gavel_table(path)
    except PerfModelError as exc:
        raise TraceError(str(exc)) from None
    return loaded if perf is None else loaded.with_slowdowns(perf.slowdowns)


def _read_file(file: Path, label: str, perf: PerfModel) -> list[tuple[int, JobSpec]]:
    vc = file.stem
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{label}: cannot read: {' '.join(str(exc).split())}") from None
    result: list[tuple[int, JobSpec]] = []
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{label}: line {line_no}"
        fields = line.split("\t")
        if len(fields) != COLUMNS:
            raise TraceError(
                f"{where}: expected {COLUMNS} tab-separated columns, got {len(fields)}"
            )
        job_type = fields[0].strip()
        steps = number(fields[4], where, "total_steps", positive=True)
        arrival = number(fields[5], where, "arrival_time_s")
        gpus = integer(fields[6], where, "scale_factor", positive=True)
        thr = perf.throughput(job_type, gpus, GAVEL_REFERENCE_TYPE)
        if thr is None:
            raise TraceError(
                f"{where}: job_type: no {GAVEL_REFERENCE_TYPE} throughput for "
                f"{job_type!r} in the throughput table"
            )
        result.append(
            (
                line_no,
                JobSpec(
                    id=f"{vc}-{line_no}",
                    submit_time=arrival,
                    gpus=gpus,
                    vc=vc,
                    model=job_type,
                    duration_s=steps / thr,
                    total_steps=steps,
                    spread_slowdown=perf.spread_slowdown(job_type, gpus, GAVEL_REFERENCE_TYPE),
                ),
            )
        )
    return result


FORMAT = TraceFormat(
    "gavel",
    "Gavel's Philly-derived `VC.trace` files; lengths from steps and measured throughputs",
    "gavel:PATH",
    read=read,
)
