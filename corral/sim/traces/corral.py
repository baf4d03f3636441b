"""corral's own trace format (`corral:PATH`, or any path ending `.corral.jsonl`): JSON lines holding
a header, the cluster's nodes and every job as the core's `JobSpec` (corral.core.tracefile has the
fields). `corral export-trace` writes it from a live manager's history, so that `corral simulate`
replays it losslessly:

- the nodes are the cluster (`Trace.nodes`; `--config` may replace them, to bring its VCs);
- each job keeps every field the live manager gave the core, its `duration_s` being the work the
  job did there, in ideal seconds;
- the header's `throughputs` (a Gavel-format table beside the trace: the live manager's measured
  profiles) gives the jobs the speeds the live manager's `Profiles` gave them (`Trace.profiles`).

Errors are one line naming the file, the line and the field.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from corral.core.cluster import NodeDef
from corral.core.job import JobSpec
from corral.core.nodes import NodeChange
from corral.core.tracefile import (
    JobReplay,
    RecordedReservation,
    RecordError,
    header_decisions,
    kind_of,
    read_header,
    read_job,
    read_job_replay,
    read_node,
    read_node_change,
    read_reservation,
)
from corral.sim.perfmodel import PerfModel, PerfModelError, load_throughputs
from corral.sim.traces.base import (
    Trace,
    TraceError,
    TraceFormat,
    check_unique_ids,
    existing_path,
    no_options,
)

SUFFIX = ".corral.jsonl"


def read(location: str, *, perf: PerfModel | None = None, seed: int = 0, **options: Any) -> Trace:
    no_options("corral", options)
    path = existing_path(location, "corral")
    name = str(location)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{name}: cannot read: {' '.join(str(exc).split())}") from None
    jobs: list[JobSpec] = []
    where_of: list[str] = []
    nodes: list[NodeDef] = []
    node_line: dict[str, int] = {}
    statuses: Counter[str] = Counter()
    throughputs: str | None = None
    decisions: str | None = None
    replay: dict[str, JobReplay] = {}
    node_changes: list[NodeChange] = []
    reservations: list[RecordedReservation] = []
    origin: float | None = None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{name}: line {number}"
        try:
            record = json.loads(line, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
            kind = kind_of(record)
            if origin is None:
                if kind != "trace":
                    raise RecordError('kind: the first line must be the header {"kind": "trace"}')
                origin, throughputs = read_header(record)
                decisions = header_decisions(record)
            elif kind == "trace":
                raise RecordError("kind: a second header")
            elif kind == "node":
                node = read_node(record)
                if node.name in node_line:
                    raise RecordError(
                        f"name: duplicate node {node.name!r} (first at line {node_line[node.name]})"
                    )
                node_line[node.name] = number
                nodes.append(node)
            elif kind == "node_change":
                node_changes.append(read_node_change(record))
            elif kind == "reservation":
                reservations.append(read_reservation(record))
            else:
                jobs.append(read_job(record))
                facts = read_job_replay(record)
                if facts is not None:
                    replay[jobs[-1].id] = facts
                where_of.append(f"line {number}")
                statuses[record.get("status") or "(no status)"] += 1
        except RecordError as exc:
            raise TraceError(f"{where}: {exc}") from None
        except (ValueError, RecursionError) as exc:
            raise TraceError(f"{where}: not a JSON object: {' '.join(str(exc).split())}") from None
    if origin is None:
        raise TraceError(f'{name}: empty (expected a header line {{"kind": "trace", ...}})')
    check_unique_ids(jobs, where_of, name)
    notes = []
    if statuses:
        notes.append(
            "jobs by status where they ran: "
            + ", ".join(f"{n} {status}" for status, n in statuses.most_common())
        )
    profiles = None
    if throughputs is not None:
        table = path.parent / throughputs
        if not table.is_file():
            raise TraceError(f"{name}: line 1: throughputs: no such file {table}")
        try:
            profiles = load_throughputs(table)
        except PerfModelError as exc:
            raise TraceError(str(exc)) from None
        notes.append(f"speeds from {table} ({len(profiles)} measured shapes)")
    decision_log = None
    if decisions is not None:
        decision_log = path.parent / decisions
        if not decision_log.is_file():
            notes.append(f"no decision log {decision_log}: the replay is compared with nothing")
            decision_log = None
    note = replay_note(replay)
    if note is not None:
        notes.append(note)
    if reservations:
        notes.append(f"reservations made as the manager held them: {len(reservations)}")
    if node_changes:
        kinds = Counter(change.kind for change in node_changes)
        counted = ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items()))
        notes.append(f"node changes replayed at their instants: {counted}")
    return Trace(
        jobs=jobs,
        source=f"corral:{location}",
        notes=notes,
        nodes=nodes or None,
        config_replaces_nodes=True,
        profiles=profiles,
        replay=replay,
        decision_log=decision_log,
        node_changes=sorted(node_changes, key=lambda change: change.at),
        reservations=reservations,
    )


def replay_note(replay: dict[str, JobReplay]) -> str | None:
    """What the replay honours besides the specs, counted (None: nothing): the note `corral
    simulate` prints."""
    facts = list(replay.values())
    counts = [
        (len({f.gates.array for f in facts if f.gates.capped}), "capped array(s)"),
        (sum(bool(f.gates.after) for f in facts), "job(s) with dependencies"),
        (sum(len(f.holds) for f in facts), "hold(s)"),
        (sum(len(f.failures) for f in facts), "failed attempt(s)"),
    ]
    parts = [f"{count} {what}" for count, what in counts if count]
    return "replayed as the manager decided them: " + ", ".join(parts) if parts else None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for key, value in pairs:
        if key in record:
            raise RecordError(f"{key}: given twice")
        record[key] = value
    return record


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def is_corral_path(location: str) -> bool:
    return Path(location).name.endswith(SUFFIX)


FORMAT = TraceFormat(
    "corral",
    "corral's own JSON lines, written by `corral export-trace` from a live manager",
    "corral:PATH",
    read=read,
)
