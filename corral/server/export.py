"""`corral export-trace`: the manager's own job history as a trace `corral simulate` replays.

Two formats:

* corral's own (`*.corral.jsonl`, corral.core.tracefile), lossless: the cluster's nodes, and each
  job that ran as the core's JobSpec the manager queued (its model, GPU types, workers' unit,
  priority, deadline, elastic range, ...), its `duration_s` the work it did in ideal seconds
  (`job_work`), and what the manager decided its fate from outside the core (`job_replay`: its
  dependencies, array and cap, holds, failed attempts, measured restore), and every recorded
  change of a node at its instant (`node_change` lines): the operators' drains and resumes,
  the health checks' verdicts (unhealthy, healthy) and the nodes that joined, left, went
  offline or came back online. Beside it the store's
  measured throughputs (`NAME.throughputs.json`, Gavel's
  format: `Profiles.to_gavel`), which the replay's speeds come from, and the decisions the
  manager made (`NAME.decisions.jsonl`: `decision_log`), to compare with the replay's.
* Helios's `cluster_log.csv` (corral.sim.traces.helios reads it), one row per job that ran: its
  GPUs, VC, user, submit time and run time, the seconds its attempts ran (`executed_s`:
  preempted attempts included, so work a job redid after a checkpoint counts too).

Both leave out the jobs that never ran (cancelled while waiting: nothing to replay) and those
not finished yet. Beside either, `NAME.scheduler.yaml`: the scheduler config the manager ran with.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from corral.core.cluster import Cluster
from corral.core.framework import CoreOptions, config_from_mapping
from corral.core.gates import Gates
from corral.core.job import Job, JobSpec
from corral.core.nodes import CHANGE_STATES, NodeChange
from corral.core.tracefile import (
    JobReplay,
    RecordedFailure,
    RecordedReservation,
    decision_order,
    header_record,
    job_record,
    node_change_record,
    node_record,
    reservation_record,
)
from corral.server.factory import CONFIG_KEY, measured_spec, stored_nodes
from corral.server.nodes import DRAINING, RESUMED
from corral.server.spec import JobSpecModel, SpecError, array_tasks, parse_job_spec
from corral.server.store import AttemptRow, JobRow, ProgressRow, Store
from corral.server.telemetry import stored_profiles

#: What an `--out` of corral's format ends with; the files beside it drop it from their names.
CORRAL_SUFFIX = ".corral.jsonl"

COLUMNS = (
    "job_id",
    "user",
    "vc",
    "gpu_num",
    "cpu_num",
    "node_num",
    "state",
    "submit_time",
    "start_time",
    "end_time",
    "duration",
    "queue",
)
HELIOS_STATE = {"SUCCEEDED": "COMPLETED", "FAILED": "FAILED", "CANCELLED": "CANCELLED"}


def beside(out: Path, suffix: str) -> Path:
    """A file beside a trace: `h.corral.jsonl` or `h.csv` -> `h<suffix>`."""
    name = out.name
    stem = name[: -len(CORRAL_SUFFIX)] if name.endswith(CORRAL_SUFFIX) else out.stem
    return out.with_name(stem + suffix)


def config_path(out: Path) -> Path:
    """Where the scheduler config goes beside a trace: `trace.csv` -> `trace.scheduler.yaml`."""
    return beside(out, ".scheduler.yaml")


def export_config(store: Store, out: Path) -> Path | None:
    """Write the scheduler config the manager last ran with beside the trace (None: a store no
    manager of this version has run on)."""
    stored = store.get_meta(CONFIG_KEY)
    if stored is None:
        return None
    path = config_path(out)
    text = yaml.safe_dump({"scheduler": json.loads(stored)}, sort_keys=False)
    note = "# the scheduler config of the manager this trace comes from; replay its VCs with the\n"
    note += "# manager's own cluster config (corral simulate --config FILE)\n"
    path.write_text(note + text)
    return path


def export_trace(store: Store, out: Path) -> tuple[int, int]:
    """Write the finished jobs that ran; returns (written, left out)."""
    written = skipped = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = out.with_name(out.name + ".tmp")
    with temporary.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        for job in sorted(store.finished_jobs(), key=lambda j: (j.submitted_at, int(j.id))):
            if job.executed_s <= 0 or job.started_at is None or job.finished_at is None:
                skipped += 1
                continue
            writer.writerow(
                (
                    job.id,
                    job.user,
                    job.vc,
                    job.gpus,
                    0,
                    1,
                    HELIOS_STATE.get(job.status, job.status),
                    f"{job.submitted_at:.3f}",
                    f"{job.started_at:.3f}",
                    f"{job.finished_at:.3f}",
                    f"{job.executed_s:.3f}",
                    f"{job.started_at - job.submitted_at:.3f}",
                )
            )
            written += 1
    temporary.replace(out)
    return written, skipped


# -- corral's own format --------------------------------------------------------------------------

#: Attempt outcomes whose work the job kept: a checkpoint on preemption, the attempt that
#: succeeded, the one running when the job was cancelled. Failed and lost attempts lose theirs.
KEPT = ("succeeded", "preempted", "cancelled")


@dataclass(slots=True)
class CorralExport:
    """What `export_corral` wrote."""

    trace: Path
    throughputs: Path
    decisions: Path
    written: int = 0
    #: Jobs left out: never ran, not finished, or did no work (in their kept attempts).
    never_ran: int = 0
    unfinished: int = 0
    no_work: int = 0
    nodes: int = 0
    #: Jobs by final status, as written.
    statuses: dict[str, int] = field(default_factory=dict)
    #: When the first job written was submitted (the trace's times count from it).
    time_origin: float = 0.0


def restore_s_of(store: Store) -> float:
    """The restore stall (`restore_s`) of the config the manager ran with."""
    stored = store.get_meta(CONFIG_KEY)
    if stored is None:
        return CoreOptions().restore_s
    return config_from_mapping(json.loads(stored)).core.restore_s


def job_work(
    row: JobRow,
    spec: JobSpec,
    attempts: list[AttemptRow],
    speed: Callable[[Job, tuple[int, ...]], float],
    gpu_ids: dict[str, int],
    restore_s: float,
) -> float:
    """The work the job did, in the core's ideal seconds: each attempt's seconds of work (from its
    start to its end, less the restore stall the core gives every start after the first) at the
    speed `Profiles.speed_model` gives it on its GPUs, summed over the attempts whose work the job
    kept (KEPT): for a job that SUCCEEDED, the work it needed; for one CANCELLED, the work it did
    before. A job that FAILED kept none: it is written with the work of all its attempts (the
    replay fails each at the instant it failed live, `job_replay`). `restore_s`: the job's own
    (`measured_restore`)."""
    job = Job(spec=spec)
    total = 0.0
    for attempt in attempts:
        if row.status != "FAILED" and attempt.outcome not in KEPT:
            continue
        end = attempt.ended_at if attempt.ended_at is not None else row.finished_at
        if end is None:
            continue
        working = end - attempt.started_at - (restore_s if attempt.number > 1 else 0.0)
        gpus = [gpu_ids.get(str(name)) for name in attempt.gpus]
        known = tuple(g for g in gpus if g is not None)
        rate = speed(job, known) if len(known) == len(gpus) else 1.0
        total += rate * max(0.0, working)
    return total


def export_corral(store: Store, out: Path) -> CorralExport:
    """Write the finished jobs that ran in corral's format, the throughputs and the live
    decisions beside it (see the module's docstring)."""
    result = CorralExport(out, beside(out, ".throughputs.json"), beside(out, ".decisions.jsonl"))
    profiles = stored_profiles(store)
    nodes = stored_nodes(store)
    cluster = Cluster.from_nodes(nodes) if nodes else None
    speed = profiles.speed_model(cluster) if cluster is not None else (lambda job, gpus: 1.0)
    gpu_ids = {} if cluster is None else {n: g for g, n in enumerate(cluster.gpu_names())}
    restore_s = restore_s_of(store)
    specs: list[tuple[JobSpec, JobRow, JobSpecModel, list[AttemptRow], float]] = []
    for row in sorted(store.finished_jobs(), key=lambda j: (j.submitted_at, int(j.id))):
        attempts = store.attempts(row.id)
        if not attempts or row.started_at is None:
            result.never_ran += 1
            continue
        try:
            model = parse_job_spec(row.spec)
        except SpecError:
            result.no_work += 1  # a spec this version no longer reads: nothing to replay from
            continue
        if model.gpu_memory is not None:  # its share was settled when it ran: from `gpus`
            model = model.model_copy(update={"gpu_memory": None})
        spec = measured_spec(profiles, model, row.id, row.submitted_at, row.user)
        restore = measured_restore(attempts, store.progress(row.id), restore_s)
        work = job_work(row, spec, attempts, speed, gpu_ids, restore)
        if work <= 0:
            result.no_work += 1
            continue
        specs.append((dataclasses.replace(spec, duration_s=work), row, model, attempts, restore))
    result.unfinished = sum(
        count for status, count in store.job_counts().items() if status in ("PENDING", "RUNNING")
    )
    origin = min((spec.submit_time for spec, *_ in specs), default=0.0)
    result.time_origin = origin
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        header_record(
            origin,
            throughputs=result.throughputs.name,
            decisions=result.decisions.name,
            source="corral export-trace",
        )
    ]
    lines += [node_record(node) for node in nodes]
    names = {node.name for node in nodes}
    lines += [node_change_record(change) for change in node_changes(store, origin, names)]
    lines += [
        reservation_record(
            RecordedReservation(
                row.name, row.start - origin, row.duration, row.gpus, row.users, row.vcs
            )
        )
        for row in store.reservations()
    ]
    for spec, row, model, attempts, restore in specs:
        shifted = dataclasses.replace(
            spec,
            submit_time=spec.submit_time - origin,
            deadline=None if spec.deadline is None else spec.deadline - origin,
        )
        replay = job_replay(store, row, model, attempts, restore, origin)
        lines.append(job_record(shifted, replay, status=row.status, name=row.name))
        result.statuses[row.status] = result.statuses.get(row.status, 0) + 1
    result.written, result.nodes = len(specs), len(nodes)
    _write_lines(out, lines)
    _write_text(
        result.throughputs, json.dumps(profiles.to_gavel(), indent=1, sort_keys=True) + "\n"
    )
    _write_lines(result.decisions, decision_log(store, origin, [row.id for _, row, *_ in specs]))
    return result


def node_changes(store: Store, origin: float, names: set[str] | None = None) -> list[NodeChange]:
    """Every recorded change of a node (corral.core.nodes.CHANGE_STATES), at its instant since
    `origin` (one before the first job's submission, at 0: nothing ran before it). With `names`
    (the nodes the trace lists), only the changes of those nodes but the operators' own (a
    drain of a node the trace lacks is refused by the replay, naming it)."""
    changes = []
    for row in store.node_changes(CHANGE_STATES):
        at = max(0.0, row.at - origin)
        if row.state in (DRAINING, RESUMED):
            changes.append(NodeChange(at, row.node, row.state == DRAINING, row.reason, row.preempt))
        elif names is None or row.node in names:
            changes.append(NodeChange(at, row.node, False, row.reason, state=row.state))
    return changes


def measured_restore(
    attempts: list[AttemptRow], progress: list[ProgressRow], configured: float
) -> float:
    """The seconds the job restored on each resume, as far as its history shows: no resumed
    attempt (one after the first, whose work the job kept) restored longer than until it first
    reported progress, or than it ran; the scheduler's `restore_s` where nothing shows less. A
    job's work and its replay both count this, so its attempts end in the replay when they
    ended live whatever it is; with the configured 30 s, an attempt shorter than that did no
    work, and a job retried once after a failure did none at all."""
    first_report: dict[int, float] = {}
    for point in progress:
        first_report[point.attempt] = min(first_report.get(point.attempt, point.at), point.at)
    restore = configured
    for attempt in attempts:
        if attempt.number <= 1 or attempt.outcome not in KEPT or attempt.ended_at is None:
            continue
        until = attempt.ended_at - attempt.started_at
        if attempt.number in first_report:
            until = min(until, first_report[attempt.number] - attempt.started_at)
        restore = min(restore, max(0.0, until))
    return restore


def job_replay(
    store: Store,
    row: JobRow,
    model: JobSpecModel,
    attempts: list[AttemptRow],
    restore: float,
    origin: float,
) -> JobReplay:
    """What the manager decided the job's fate from besides its spec (`JobReplay`), times since
    `origin`: its gates (dependencies, its array and the array's cap), when it was held and
    released, its failed attempts as it reported them to the core's retry rule, its restore."""
    cap = array_tasks(model.array)[1] if model.array is not None else None
    gates = Gates(
        after=tuple(str(parent) for parent in model.after),
        array=row.array_id,
        cap=cap if row.array_id is not None else None,
    )
    holds: list[tuple[float, float | None]] = []
    for event in store.events(row.id):
        if event.kind == "held" and (not holds or holds[-1][1] is not None):
            holds.append((event.at - origin, None))
        elif event.kind == "released" and holds and holds[-1][1] is None:
            holds[-1] = (holds[-1][0], event.at - origin)
    failures = tuple(
        RecordedFailure(
            attempt=attempt.number,
            ran_s=attempt.ended_at - attempt.started_at,
            reason=attempt.reason,
            # As the manager reported it (Manager._attempt_ended): hang detection's own, else the
            # exit code and the detail.
            signature="hung"
            if attempt.reason.startswith("hung:")
            else (f"{attempt.exit_code}|{attempt.reason}"),
            infrastructure=attempt.outcome == "lost",
        )
        for attempt in attempts
        if attempt.outcome in ("failed", "lost") and attempt.ended_at is not None
    )
    return JobReplay(
        gates=gates,
        holds=tuple(holds),
        failures=failures,
        restore_s=restore,
        finished_at=None if row.finished_at is None else row.finished_at - origin,
        array_index=row.array_index if row.array_id is not None else None,
    )


_PREEMPTED_BY = re.compile(r"preempted by (?:job (\S+)|(drain of node \S+))")


def decision_log(store: Store, origin: float, job_ids: list[str]) -> list[dict[str, object]]:
    """The manager's decisions about these jobs, from the store: each attempt's start (`at` its
    start, GPUs by name, `resumed` after the first) and each preemption (`at` the instant decided,
    the preempted attempt's GPUs, `by` the job it made room for), times since `origin`, in
    `decision_order`: the records `corral simulate` writes in
    `decisions-<policy>-<placement>.jsonl` (`SimResult.decision_records`)."""
    records: list[dict[str, object]] = []
    for job_id in job_ids:
        attempts = store.attempts(job_id)
        for attempt in attempts:
            records.append(
                {
                    "at": attempt.started_at - origin,
                    "action": "start",
                    "job": job_id,
                    "gpus": [str(name) for name in attempt.gpus],
                    "resumed": attempt.number > 1,
                }
            )
        # Each preemption stopped one attempt, in order (a start preempted before it ran was
        # never an attempt, and is no event either).
        stopped = iter([a for a in attempts if a.outcome == "preempted"])
        for event in store.events(job_id):
            if event.kind != "preempted":
                continue
            attempt = next(stopped, None)
            found = _PREEMPTED_BY.search(event.message)
            records.append(
                {
                    "at": event.at - origin,
                    "action": "preempt",
                    "job": job_id,
                    "gpus": [] if attempt is None else [str(name) for name in attempt.gpus],
                    "by": (found.group(1) or found.group(2)) if found else None,
                }
            )
    return sorted(records, key=decision_order)


def _write_lines(path: Path, records: list[dict[str, object]]) -> None:
    _write_text(path, "".join(json.dumps(record) + "\n" for record in records))


def _write_text(path: Path, text: str) -> None:
    """Whole or not at all: a reader never sees half a file."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    temporary.replace(path)
