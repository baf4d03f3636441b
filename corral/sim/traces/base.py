"""What every trace reader shares: the Trace it returns, its one-line errors, field parsers."""

from __future__ import annotations

import csv
import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from corral.core.cluster import NodeDef
from corral.core.fragmentation import Workload
from corral.core.job import JobSpec
from corral.core.nodes import NodeChange
from corral.core.profiles import Profiles
from corral.core.tracefile import JobReplay, RecordedReservation
from corral.sim.perfmodel import PerfModel

TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S"


class TraceError(ValueError):
    """A trace that cannot be read. The message is one line naming the file, record and field."""


@dataclass(slots=True)
class Trace:
    """Jobs sorted by submit time (file order breaks ties), the first submitted at 0."""

    jobs: list[JobSpec]
    source: str
    notes: list[str] = field(default_factory=list)
    # The performance model the reader used, when it differs from the one passed in (a gavel
    # trace loads its throughput table): give this one's speed_model to the simulator.
    perf: PerfModel | None = None
    #: The cluster the trace ran on (openb's node list): it replaces `--cluster`.
    nodes: list[NodeDef] | None = None
    #: `--config` may replace `nodes` (a corral trace's record of the cluster it ran on; a
    #: config brings VCs too); openb's nodes are the experiment itself and refuse it.
    config_replaces_nodes: bool = False
    #: Measured throughputs the jobs' speeds come from (a corral trace's table): the simulator
    #: gives their `speed_model`, as the live manager's, instead of `perf`'s.
    profiles: Profiles | None = None
    #: The task types and their counts the jobs were drawn from (FGD's target workload); the
    #: simulator learns them from the jobs when None.
    workload: Workload | None = None
    #: Each job is placed when it arrives or never (FGD's packing experiment): one the
    #: scheduler cannot place in its arrival's round is given up.
    place_or_fail: bool = False
    #: The arrivals ask for this share of the cluster's GPU capacity in all (openb's inflated
    #: arrivals): the fragmentation curves run up to it.
    target_load: float | None = None
    #: What a live manager decided each job's fate from besides its spec (a corral trace from
    #: `corral export-trace`: gates, holds, failures, restores), by job id: the replay honours it.
    replay: dict[str, JobReplay] = field(default_factory=dict)
    #: The live manager's decisions (a corral trace's `decisions` file), which a replay under the
    #: manager's own policy is compared with.
    decision_log: Path | None = None
    #: Operators' drains and resumes of nodes, in time order (a corral trace's node_change
    #: lines): the replay applies each at its instant (corral.core.nodes).
    node_changes: list[NodeChange] = field(default_factory=list)
    #: The reservations the live manager held (a corral trace's reservation lines), made in the
    #: replay's scheduler (corral.core.reservations).
    reservations: list[RecordedReservation] = field(default_factory=list)


@dataclass(slots=True)
class TraceStream:
    """A trace read as the simulation reaches each job (`corral simulate --stream`), for traces
    too long to hold: the jobs in submission order, the first submitted at 0."""

    jobs: Iterator[JobSpec]
    source: str


#: A streaming reader: the jobs in file order, each with where it is in the file ("line 7"). Every
#: job must have its run time: a streamed run tells the policies that lengths are known.
Streamer = Callable[..., Iterator[tuple[str, JobSpec]]]


def in_order(
    records: Iterator[tuple[str, JobSpec]], file: str, arrival_scale: float
) -> Iterator[JobSpec]:
    """A streamed trace's jobs as `finish` gives a whole one: the first submitted at 0, the gaps
    scaled. The file must be in submission order (a stream cannot be sorted): a job submitted
    before the one above it is refused, naming its line."""
    check_arrival_scale(arrival_scale)
    first: float | None = None
    last, last_where = -math.inf, ""
    for where, spec in records:
        if spec.submit_time < last:
            raise TraceError(
                f"{file}: {where}: submit_time: {spec.submit_time:g} is before the one at "
                f"{last_where} ({last:g}); a streamed trace must be in submission order "
                "(sort the file, or leave out --stream)"
            )
        last, last_where = spec.submit_time, where
        if first is None:
            first = spec.submit_time
        if first != 0.0 or arrival_scale != 1.0:
            spec = _moved(spec, (spec.submit_time - first) * arrival_scale)
        yield spec
    if first is None:
        raise TraceError(f"{file}: the trace has no jobs")


# A reader turns a location (path, or the synthetic generator's KEY=VAL list) into jobs in file
# order with their submit times as the file gives them; `finish` sorts, shifts and scales them.
Reader = Callable[..., Trace]


@dataclass(frozen=True, slots=True)
class TraceFormat:
    """A trace format, as its registry entry (`corral.sim.traces.FORMATS`) declares it: its name,
    what it is in one line, how `--trace` names it, and how it is read: a loader (`read`, the
    whole trace), a streaming reader (`stream`, for `corral simulate --stream`), or both. A
    format that gives only a streaming reader is loaded by collecting what it streams
    (`load`); one that gives only a loader is not streamed, and `--stream` says so."""

    name: str
    #: One line: what the format is (`corral config plugins`, the docs' table).
    summary: str
    #: How `--trace` names it: `tiresias:PATH`, `synthetic:jobs=N,load=L,gpus=G`.
    usage: str
    read: Reader | None = None
    stream: Streamer | None = None

    def __post_init__(self) -> None:
        if self.read is None and self.stream is None:
            raise TypeError(f"trace format {self.name}: give a loader (read), a stream, or both")

    @property
    def streams(self) -> bool:
        return self.stream is not None

    def load(self, location: str, **kwargs: Any) -> Trace:
        """The whole trace, in file order (`finish` sorts it): the loader's, or every job the
        streaming reader gives, with duplicate ids refused."""
        if self.read is not None:
            return self.read(location, **kwargs)
        assert self.stream is not None
        jobs: list[JobSpec] = []
        where_of: list[str] = []
        for where, spec in self.stream(location, **kwargs):
            jobs.append(spec)
            where_of.append(where)
        check_unique_ids(jobs, where_of, location)
        return Trace(jobs=jobs, source=f"{self.name}:{location}")


def finish(trace: Trace, arrival_scale: float) -> Trace:
    """Sort by submit time (stable: file order breaks ties), start at 0, scale the gaps. A
    deadline keeps its distance from its job's submission."""
    if not trace.jobs:
        skipped = f" ({'; '.join(trace.notes)})" if trace.notes else ""
        raise TraceError(f"{trace.source}: the trace has no jobs{skipped}")
    check_arrival_scale(arrival_scale)
    jobs = sorted(trace.jobs, key=lambda spec: spec.submit_time)
    first = jobs[0].submit_time
    replay = trace.replay
    if first != 0.0 or arrival_scale != 1.0:
        jobs = [_moved(spec, (spec.submit_time - first) * arrival_scale) for spec in jobs]
        replay = {job: _moved_replay(f, first, arrival_scale) for job, f in replay.items()}
    return dataclasses.replace(trace, jobs=jobs, notes=list(trace.notes), replay=replay)


def _moved_replay(facts: JobReplay, first: float, scale: float) -> JobReplay:
    """A job's replay facts on the moved clock: its holds and end as its arrival moved."""

    def moved(at: float | None) -> float | None:
        return None if at is None else (at - first) * scale

    holds = tuple((float(moved(start) or 0.0), moved(end)) for start, end in facts.holds)
    return dataclasses.replace(facts, holds=holds, finished_at=moved(facts.finished_at))


def check_arrival_scale(arrival_scale: float) -> None:
    if (
        isinstance(arrival_scale, bool)
        or not isinstance(arrival_scale, (int, float))
        or not (math.isfinite(arrival_scale) and arrival_scale > 0)
    ):
        raise TraceError(f"arrival_scale: must be a positive number, got {arrival_scale!r}")


def _moved(spec: JobSpec, submit_time: float) -> JobSpec:
    """The spec submitted at `submit_time`, its deadline as far from it as before."""
    deadline = spec.deadline
    if deadline is not None:
        deadline = submit_time + (deadline - spec.submit_time)
    if type(spec) is not JobSpec:
        return dataclasses.replace(spec, submit_time=submit_time, deadline=deadline)
    # What `dataclasses.replace` gives, without its look at each field (a streamed trace moves
    # every job): 2.0 us against 2.7 us for a copy of each slot, in pure Python.
    return spec.moved(submit_time, deadline)


def check_unique_ids(jobs: list[JobSpec], where: list[str], file: str) -> None:
    """Refuse two records with the same job id; `where[i]` names record i ("line 7")."""
    seen: dict[str, int] = {}
    for i, spec in enumerate(jobs):
        first = seen.setdefault(spec.id, i)
        if first != i:
            raise TraceError(
                f"{file}: {where[i]}: id: duplicate job id {spec.id!r} (first at {where[first]})"
            )


def no_options(fmt: str, options: dict[str, object]) -> None:
    if options:
        raise TraceError(f"{fmt}: unknown option(s) {', '.join(sorted(options))}")


def count_note(counter: dict[str, int], what: str) -> str:
    """'replayed 3 Pass, 1 Failed jobs' style summary, largest first."""
    ranked = sorted(counter.items(), key=lambda kv: -kv[1])
    parts = [f"{n} {name or '(blank)'}" for name, n in ranked]
    return f"{what}: {', '.join(parts)}"


# -- files ---------------------------------------------------------------------------------------


def existing_path(location: str, fmt: str) -> Path:
    if not location:
        raise TraceError(f"{fmt}: no path given (expected {fmt}:PATH)")
    path = Path(location).expanduser()
    if not path.exists():
        raise TraceError(f"{location}: no such file or directory")
    return path


def csv_records(
    path: Path,
    required: tuple[str, ...],
    label: str | None = None,
    one_of: tuple[tuple[str, ...], ...] = (),
) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row) for each non-blank row of a CSV file with a header line.

    The header must hold every column of `required`, and all the columns of at least one of the
    alternatives in `one_of` when it is given.
    """
    name = label or str(path)
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"{name}: cannot open: {exc.strerror or exc}") from None
    with handle:
        reader = csv.reader(handle)
        try:
            header = next(reader, None)
            if header is None:
                raise TraceError(f"{name}: empty file (expected a header line)")
            header = [column.strip() for column in header]
            missing = [column for column in required if column not in header]
            if missing:
                raise TraceError(f"{name}: line 1: header: missing column(s) {', '.join(missing)}")
            if one_of and not any(all(c in header for c in group) for group in one_of):
                wanted = " or ".join(" and ".join(group) for group in one_of)
                raise TraceError(f"{name}: line 1: header: missing column(s) {wanted}")
            for row in reader:
                if not row or all(not cell.strip() for cell in row):
                    continue
                if len(row) != len(header):
                    raise TraceError(
                        f"{name}: line {reader.line_num}: expected {len(header)} "
                        f"columns, got {len(row)}"
                    )
                yield reader.line_num, dict(zip(header, map(str.strip, row), strict=True))
        except csv.Error as exc:
            raise TraceError(f"{name}: line {reader.line_num}: {exc}") from None
        except UnicodeDecodeError:
            raise TraceError(f"{name}: not a UTF-8 text file") from None


# -- fields --------------------------------------------------------------------------------------


def _show(raw: object) -> str:
    text = repr(raw)
    return text if len(text) <= 40 else text[:37] + "..."


def number(raw: object, where: str, name: str, *, positive: bool = False) -> float:
    """A finite number >= 0 (> 0 with positive=True); TraceError naming `where` and `name`."""
    kind = "a positive number" if positive else "a non-negative number"
    value = _to_float(raw)
    if value is None or not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise TraceError(f"{where}: {name}: must be {kind}, got {_show(raw)}")
    return value


def integer(raw: object, where: str, name: str, *, positive: bool = False) -> int:
    """A whole number >= 0 (> 0 with positive=True); "4.0" is accepted as 4."""
    kind = "a positive integer" if positive else "a non-negative integer"
    value = _to_float(raw)
    if (
        value is None
        or not math.isfinite(value)
        or value != int(value)
        or value < 0
        or (positive and value == 0)
    ):
        raise TraceError(f"{where}: {name}: must be {kind}, got {_show(raw)}")
    return int(value)


def timestamp(raw: object, where: str, name: str) -> float:
    """Seconds since the epoch of a "YYYY-MM-DD HH:MM:SS" time, read as UTC.

    The traces give local times without a zone; reading them as UTC keeps every difference exact
    (no daylight-saving jumps), and only differences matter once the trace is shifted to start at 0.
    """
    if isinstance(raw, str):
        try:
            moment = datetime.strptime(raw.strip(), TIMESTAMP_FORMAT)
        except ValueError:
            pass
        else:
            return moment.replace(tzinfo=UTC).timestamp()
    raise TraceError(f"{where}: {name}: must be a time like 2017-10-03 14:05:00, got {_show(raw)}")


def number_or_timestamp(raw: object, where: str, name: str) -> float:
    """Seconds as a plain number, or a "YYYY-MM-DD HH:MM:SS" time."""
    value = _to_float(raw)
    if value is None and isinstance(raw, str):
        try:
            return timestamp(raw, where, name)
        except TraceError:
            pass
    if value is None or not math.isfinite(value) or value < 0:
        raise TraceError(
            f"{where}: {name}: must be a non-negative number of seconds or a time "
            f"like 2020-04-01 08:00:00, got {_show(raw)}"
        )
    return value


def text(raw: object, where: str, name: str, *, default: str | None = None) -> str:
    if raw is None or raw == "":
        if default is not None:
            return default
        raise TraceError(f"{where}: {name}: missing")
    if isinstance(raw, bool) or not isinstance(raw, (str, int)):
        raise TraceError(f"{where}: {name}: must be a string, got {_show(raw)}")
    return str(raw)


def _to_float(raw: object) -> float | None:
    if type(raw) is str:  # first: every cell of a CSV file
        try:
            return float(raw.strip())
        except ValueError:
            return None
    if isinstance(raw, bool):
        return None
    if isinstance(raw, (int, float)):
        return float(raw)
    if isinstance(raw, str):
        try:
            return float(raw.strip())
        except ValueError:
            return None
    return None


def default_perf(perf: PerfModel | None) -> PerfModel:
    return perf if perf is not None else PerfModel.default_for_durations()
