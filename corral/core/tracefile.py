"""corral's own trace format: a cluster's jobs as the core's `JobSpec`s and its nodes, losslessly.

One JSON object per line (files named `*.corral.jsonl`). The first line is the header, then nodes
and jobs in any order:

    {"kind": "trace", "version": 1, "time_origin": 1760000000.0, "throughputs": "h.throughputs.json"}
    {"kind": "node", "name": "a1", "gpus": 4, "gpu_type": "a100", "rack": "r0", ...}
    {"kind": "job", "id": "7", "submit_time": 12.0, "gpus": 2, "duration_s": 340.0, ...}
    {"kind": "node_change", "at": 95.0, "node": "a1", "state": "draining", "reason": "...", "preempt": false}

A job line holds every field of `JobSpec` (`job_record` writes them all; a reader needs only
`id`, `submit_time` and `gpus`, the others default as in `JobSpec`), times in seconds since the
header's `time_origin` (`submit_time`, `deadline`, `holds`, `finished_at`), plus what the writer knew of it that the core
does not use (`status`, `name`), and what a replay needs to decide as the live manager did
(`JobReplay`, all optional): the gates it waited at outside the core (`after`: the jobs that had to
succeed first; `array`: `{"id", "index", "cap"}`; `holds`: `[[held_at, released_at], ...]`,
`released_at` null when it never was), its failed attempts (`failures`: `[{"attempt", "ran_s",
"reason", "signature", "infrastructure"}, ...]`, each after `ran_s` seconds of its attempt), the
seconds it restored on each resume (`restore_s`, measured) and when it ended (`finished_at`). A node line holds a `NodeDef`. The header may name the
throughput table the jobs' speeds come from (`throughputs`: a Gavel-format file, a path relative
to the trace's own directory; `corral.core.profiles.Profiles.from_gavel` reads it) and the
live manager's decision log (`decisions`, the same way), which a replay compares its own with.
A node_change line is an operator's drain (`state` "draining", `preempt` whether its attempts
were preempted) or resume (`state` "resumed") of a node at `at` (corral.core.nodes.NodeChange),
a health check's verdict (`state` "unhealthy", with the check's reason, or "healthy") or what
the live manager saw of its cluster (`state` "joined", "left", "offline", "online"): the replay
applies it at that instant.

`corral export-trace` writes this format (corral.server.export) and `corral simulate` reads it
(corral.sim.traces.corral): both go through the functions here, so a field means the same in
both. Pure: records are dicts; the callers read and write the lines. A bad record raises
`RecordError` naming the field.

Both shells also write their decisions as records, one JSON line each, in `decision_order`:
`{"at", "action": "start", "job", "gpus", "resumed"}` and `{"at", "action": "preempt", "job",
"gpus", "by"}`, GPUs by name (`node/device`), `at` on the trace's clock: the live manager's from
its history (`NAME.decisions.jsonl` beside an exported trace), the simulator's from its run
(`decisions-POLICY-PLACEMENT.jsonl`), so that the two files compare line by line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from corral.core.cluster import NodeDef
from corral.core.gates import Gates
from corral.core.job import Elastic, JobSpec, Priority
from corral.core.nodes import CHANGE_STATES, DRAINING, NodeChange

VERSION = 1
#: Fields of a job record that are not the core's: what the shell that wrote it knew.
JOB_EXTRAS = ("status", "name")
#: Fields of a job record a replay decides from besides the spec (`JobReplay`).
REPLAY_FIELDS = ("after", "array", "holds", "failures", "restore_s", "finished_at")
RESERVATION_FIELDS = ("kind", "name", "start", "duration", "gpus", "users", "vcs")
NODE_CHANGE_FIELDS = ("kind", "at", "node", "state", "reason", "preempt")
NODE_CHANGE_STATES = CHANGE_STATES
HEADER_FIELDS = ("kind", "version", "time_origin", "throughputs", "decisions", "source")
NODE_FIELDS = (
    "kind",
    "name",
    "gpus",
    "gpu_type",
    "rack",
    "gpus_per_switch",
    "cpu_milli",
    "memory_mib",
)
JOB_FIELDS = (
    "kind",
    "id",
    "submit_time",
    "gpus",
    "gpus_per_worker",
    "user",
    "vc",
    "model",
    "gpu_types",
    "priority",
    "max_retries",
    "duration_s",
    "total_steps",
    "deadline",
    "elastic",
    "spread_slowdown",
    "checkpoint_every_s",
    "gpu_milli",
    "cpu_milli",
    "memory_mib",
    "level",
    "precheck_s",
    "time_limit_s",
    *JOB_EXTRAS,
    *REPLAY_FIELDS,
)


class RecordError(ValueError):
    """A record that is not a valid header, node or job: `field: problem`, one line."""


@dataclass(frozen=True, slots=True)
class RecordedFailure:
    """An attempt that failed live: its number, how long it ran, and what the live manager
    reported to the core's retry rule (`FailureReport`'s reason, signature, infrastructure)."""

    attempt: int
    ran_s: float
    reason: str
    signature: str | None = None
    infrastructure: bool = False


@dataclass(frozen=True, slots=True)
class JobReplay:
    """What the live manager decided a job's fate from besides its spec (times on the trace's
    clock): its gates, the intervals it was held (`holds`: released at None = never), its failed
    attempts, the seconds it restored on a resume (`restore_s`; None: not known, the scheduler's
    `restore_s`), when it ended, and its index in its array."""

    gates: Gates = field(default_factory=Gates)
    holds: tuple[tuple[float, float | None], ...] = ()
    failures: tuple[RecordedFailure, ...] = ()
    restore_s: float | None = None
    finished_at: float | None = None
    array_index: int | None = None

    def held_at(self, now: float) -> bool:
        return any(start <= now and (end is None or now < end) for start, end in self.holds)


# -- writing --------------------------------------------------------------------------------------


def header_record(
    time_origin: float,
    *,
    throughputs: str | None = None,
    source: str | None = None,
    decisions: str | None = None,
) -> dict[str, Any]:
    record: dict[str, Any] = {"kind": "trace", "version": VERSION, "time_origin": time_origin}
    if throughputs is not None:
        record["throughputs"] = throughputs
    if decisions is not None:
        record["decisions"] = decisions
    if source is not None:
        record["source"] = source
    return record


def node_record(node: NodeDef) -> dict[str, Any]:
    return {
        "kind": "node",
        "name": node.name,
        "gpus": node.gpus,
        "gpu_type": node.gpu_type,
        "rack": node.rack,
        "gpus_per_switch": node.gpus_per_switch,
        "cpu_milli": node.cpu_milli,
        "memory_mib": node.memory_mib,
    }


def node_change_record(change: NodeChange) -> dict[str, Any]:
    return {
        "kind": "node_change",
        "at": change.at,
        "node": change.node,
        "state": change.kind,
        "reason": change.reason,
        "preempt": change.preempt,
    }


def job_record(spec: JobSpec, replay: JobReplay | None = None, **extras: Any) -> dict[str, Any]:
    """Every field of the spec (times as they are: the caller makes them relative to the
    origin), then `extras` (`status`, `name`), then what `replay` holds (its fields at their
    defaults left out)."""
    unknown = sorted(set(extras) - set(JOB_EXTRAS))
    if unknown:
        raise RecordError(f"{unknown[0]}: not a field of a job record")
    elastic = spec.elastic
    return {
        "kind": "job",
        "id": spec.id,
        "submit_time": spec.submit_time,
        "gpus": spec.gpus,
        "gpus_per_worker": spec.gpus_per_worker,
        "user": spec.user,
        "vc": spec.vc,
        "model": spec.model,
        "gpu_types": None if spec.gpu_types is None else sorted(spec.gpu_types),
        "priority": spec.priority.value,
        "max_retries": spec.max_retries,
        "duration_s": spec.duration_s,
        "total_steps": spec.total_steps,
        "deadline": spec.deadline,
        "elastic": None
        if elastic is None
        else {
            "min_gpus": elastic.min_gpus,
            "max_gpus": elastic.max_gpus,
            "base_gpus": elastic.base_gpus,
        },
        "spread_slowdown": spec.spread_slowdown,
        "checkpoint_every_s": spec.checkpoint_every_s,
        "gpu_milli": spec.gpu_milli,
        "cpu_milli": spec.cpu_milli,
        "memory_mib": spec.memory_mib,
        "level": spec.level,
        "precheck_s": spec.precheck_s,
        "time_limit_s": spec.time_limit_s,
        **{key: value for key, value in extras.items() if value is not None},
        **({} if replay is None else replay_fields(replay)),
    }


def replay_fields(replay: JobReplay) -> dict[str, Any]:
    """The fields of a job record that hold `replay` (those at their defaults left out)."""
    gates = replay.gates
    record: dict[str, Any] = {}
    if gates.after:
        record["after"] = list(gates.after)
    if gates.array is not None:
        record["array"] = {"id": gates.array, "index": replay.array_index, "cap": gates.cap}
    if replay.holds:
        record["holds"] = [[start, end] for start, end in replay.holds]
    if replay.failures:
        record["failures"] = [
            {
                "attempt": failure.attempt,
                "ran_s": failure.ran_s,
                "reason": failure.reason,
                "signature": failure.signature,
                "infrastructure": failure.infrastructure,
            }
            for failure in replay.failures
        ]
    if replay.restore_s is not None:
        record["restore_s"] = replay.restore_s
    if replay.finished_at is not None:
        record["finished_at"] = replay.finished_at
    return record


def decision_order(record: Mapping[str, Any]) -> tuple[float, int, str]:
    """Decisions in time; at one instant preemptions first, then by job. (Within a round the
    live manager records a start once the GPUs it needs have drained, the simulator in the
    round's order: this order is the one both can give.)"""
    return (float(record["at"]), 0 if record["action"] == "preempt" else 1, str(record["job"]))


# -- reading --------------------------------------------------------------------------------------


def kind_of(record: object) -> str:
    """The record's `kind`: trace, node, job, node_change or reservation."""
    if not isinstance(record, Mapping):
        raise RecordError(f"record: expected a JSON object, got {_show(record)}")
    kind = record.get("kind")
    if kind not in ("trace", "node", "job", "node_change", "reservation"):
        raise RecordError(
            f"kind: must be trace, node, job, node_change or reservation, got {_show(kind)}"
        )
    return str(kind)


def read_header(record: Mapping[str, Any]) -> tuple[float, str | None]:
    """(time_origin, throughputs) of a header record (`header_decisions`: its decision log)."""
    _known(record, HEADER_FIELDS)
    version = record.get("version")
    if version != VERSION or isinstance(version, bool):
        raise RecordError(f"version: this corral reads version {VERSION}, got {_show(version)}")
    _opt_text(record, "source", None)
    origin = _opt_number(record, "time_origin", 0.0, kind=ANY)
    _opt_text(record, "decisions", None)
    return origin or 0.0, _opt_text(record, "throughputs", None)


def header_decisions(record: Mapping[str, Any]) -> str | None:
    """The decision log a (checked) header names, if any."""
    return _opt_text(record, "decisions", None)


def read_node(record: Mapping[str, Any]) -> NodeDef:
    _known(record, NODE_FIELDS)
    name = _req_text(record, "name")
    gpus = _req_int(record, "gpus", positive=True)
    per_switch = _opt_int(record, "gpus_per_switch", None, positive=True)
    if per_switch is not None and per_switch > gpus:
        raise RecordError(f"gpus_per_switch: must be at most gpus ({gpus}), got {per_switch}")
    return NodeDef(
        name=name,
        gpus=gpus,
        gpu_type=(_opt_text(record, "gpu_type", None) or "v100").lower(),
        rack=_opt_text(record, "rack", None) or "rack-0",
        gpus_per_switch=per_switch,
        cpu_milli=_opt_int(record, "cpu_milli", None),
        memory_mib=_opt_int(record, "memory_mib", None),
    )


@dataclass(frozen=True, slots=True)
class RecordedReservation:
    """A reservation the live manager held (corral.core.reservations): its GPUs by name
    ("node/device"), its window on the trace's clock, whom it served."""

    name: str
    start: float
    duration: float
    gpus: tuple[str, ...]
    users: tuple[str, ...] = ()
    vcs: tuple[str, ...] = ()


def reservation_record(reservation: RecordedReservation) -> dict[str, Any]:
    return {
        "kind": "reservation",
        "name": reservation.name,
        "start": reservation.start,
        "duration": reservation.duration,
        "gpus": list(reservation.gpus),
        "users": list(reservation.users),
        "vcs": list(reservation.vcs),
    }


def read_reservation(record: Mapping[str, Any]) -> RecordedReservation:
    _known(record, RESERVATION_FIELDS)
    lists: dict[str, tuple[str, ...]] = {}
    for name in ("gpus", "users", "vcs"):
        value = record.get(name) or []
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise RecordError(f"{name}: must be a list of names, got {_show(value)}")
        lists[name] = tuple(value)
    if not lists["gpus"]:
        raise RecordError("gpus: must name at least one GPU")
    duration = _req_number(record, "duration")
    if not duration > 0:
        raise RecordError(f"duration: must be positive, got {duration!r}")
    return RecordedReservation(
        _req_text(record, "name"),
        _req_number(record, "start"),
        duration,
        lists["gpus"],
        lists["users"],
        lists["vcs"],
    )


def read_node_change(record: Mapping[str, Any]) -> NodeChange:
    """The drain or resume a node_change record holds (`at` on the trace's clock)."""
    _known(record, NODE_CHANGE_FIELDS)
    at = _req_number(record, "at")
    node = _req_text(record, "node")
    state = record.get("state")
    if state not in NODE_CHANGE_STATES:
        raise RecordError(f"state: must be one of {', '.join(CHANGE_STATES)}, got {_show(state)}")
    preempt = record.get("preempt", False)
    if not isinstance(preempt, bool):
        raise RecordError(f"preempt: must be true or false, got {_show(preempt)}")
    reason = _opt_text(record, "reason", "", empty=True) or ""
    if state in (DRAINING, "resumed"):
        return NodeChange(at, node, state == DRAINING, reason, preempt)
    return NodeChange(at, node, False, reason, preempt, state=state)


def read_job(record: Mapping[str, Any]) -> JobSpec:
    """The JobSpec of a job record (times as the record gives them)."""
    _known(record, JOB_FIELDS)
    job_id = _req_text(record, "id")
    submit = _req_number(record, "submit_time")
    gpus = _req_int(record, "gpus")
    for extra in JOB_EXTRAS:
        _opt_text(record, extra, None)
    per_worker = _opt_int(record, "gpus_per_worker", 1, positive=True) or 1
    if gpus and gpus % per_worker:
        raise RecordError(f"gpus_per_worker: must divide gpus ({gpus}), got {per_worker}")
    types = record.get("gpu_types")
    if types is not None and (
        not isinstance(types, list) or not types or not all(isinstance(t, str) and t for t in types)
    ):
        raise RecordError(f"gpu_types: must be null or a list of GPU types, got {_show(types)}")
    priority = record.get("priority")
    if priority is None:
        priority = Priority.GUARANTEED.value
    if priority not in [p.value for p in Priority]:
        raise RecordError(f"priority: must be guaranteed or opportunistic, got {_show(priority)}")
    spread = _opt_number(record, "spread_slowdown", 1.0) or 1.0
    if spread < 1:
        raise RecordError(f"spread_slowdown: must be a number >= 1, got {spread!r}")
    spec = JobSpec(
        id=job_id,
        submit_time=submit,
        gpus=gpus,
        user=_opt_text(record, "user", None) or "user",
        vc=_opt_text(record, "vc", None) or "default",
        model=_opt_text(record, "model", None, empty=True) or "",
        gpu_types=None if types is None else frozenset(t.lower() for t in types),
        duration_s=_opt_number(record, "duration_s", None, kind=POSITIVE),
        total_steps=_opt_number(record, "total_steps", None, kind=POSITIVE),
        spread_slowdown=spread,
        priority=Priority(priority),
        max_retries=_opt_int(record, "max_retries", 0) or 0,
        deadline=_opt_number(record, "deadline", None, kind=ANY),
        elastic=_elastic(record.get("elastic")),
        gpus_per_worker=per_worker,
        checkpoint_every_s=_opt_number(record, "checkpoint_every_s", None, kind=POSITIVE),
        gpu_milli=_opt_int(record, "gpu_milli", 1000) or 0,
        cpu_milli=_opt_int(record, "cpu_milli", 0) or 0,
        memory_mib=_opt_int(record, "memory_mib", 0) or 0,
        precheck_s=_opt_number(record, "precheck_s", None),
        level=_level(record.get("level")),
        time_limit_s=_opt_number(record, "time_limit_s", None, kind=POSITIVE),
    )
    problem = spec.request_problem()
    if problem is not None:
        name, _, rest = problem.partition(" must ")
        raise RecordError(f"{name}: must {rest}" if rest else f"gpus: {problem}")
    return spec


def read_job_replay(record: Mapping[str, Any]) -> JobReplay | None:
    """What a job record holds for a replay (None: none of `REPLAY_FIELDS`)."""
    if not any(record.get(name) is not None for name in REPLAY_FIELDS):
        return None
    after = record.get("after")
    if after is not None and (
        not isinstance(after, list) or not all(isinstance(a, str) and a for a in after)
    ):
        raise RecordError(f"after: must be null or a list of job ids, got {_show(after)}")
    array, index, cap = None, None, None
    raw = record.get("array")
    if raw is not None:
        if not isinstance(raw, Mapping) or set(raw) != {"id", "index", "cap"}:
            raise RecordError(f"array: must be null or {{id, index, cap}}, got {_show(raw)}")
        array = _req_text(raw, "id")
        index = _opt_int(raw, "index", None)
        cap = _opt_int(raw, "cap", None, positive=True)
    holds: list[tuple[float, float | None]] = []
    raw_holds = record.get("holds")
    if raw_holds is not None:
        if not isinstance(raw_holds, list):
            raise RecordError(
                f"holds: must be a list of [held_at, released_at], got {_show(raw_holds)}"
            )
        for number, pair in enumerate(raw_holds):
            if not isinstance(pair, list) or len(pair) != 2:
                raise RecordError(
                    f"holds.{number}: must be [held_at, released_at], got {_show(pair)}"
                )
            both = {"held": pair[0], "released": pair[1]}
            start = _req_number(both, "held")
            end = _opt_number(both, "released", None)
            if end is not None and end < start:
                raise RecordError(f"holds.{number}: released at {end} before held at {start}")
            holds.append((start, end))
    failures = []
    raw_failures = record.get("failures")
    if raw_failures is not None:
        if not isinstance(raw_failures, list):
            raise RecordError(f"failures: must be a list, got {_show(raw_failures)}")
        for number, item in enumerate(raw_failures):
            if not isinstance(item, Mapping):
                raise RecordError(f"failures.{number}: must be an object, got {_show(item)}")
            try:
                _known(item, ("", "attempt", "ran_s", "reason", "signature", "infrastructure"))
                infrastructure = item.get("infrastructure", False)
                if not isinstance(infrastructure, bool):
                    raise RecordError(
                        f"infrastructure: must be true or false, got {_show(infrastructure)}"
                    )
                failures.append(
                    RecordedFailure(
                        attempt=_req_int(item, "attempt", positive=True),
                        ran_s=_req_number(item, "ran_s"),
                        reason=_opt_text(item, "reason", "", empty=True) or "",
                        signature=_opt_text(item, "signature", None, empty=True),
                        infrastructure=infrastructure,
                    )
                )
            except RecordError as exc:
                raise RecordError(f"failures.{number}.{exc}") from None
    return JobReplay(
        gates=Gates(after=tuple(after or ()), array=array, cap=cap),
        holds=tuple(holds),
        failures=tuple(failures),
        restore_s=_opt_number(record, "restore_s", None),
        finished_at=_opt_number(record, "finished_at", None, kind=ANY),
        array_index=index,
    )


# -- fields ---------------------------------------------------------------------------------------


def _level(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise RecordError(f"level: must be an integer, got {_show(value)}")
    return value


#: What a number may be: >= 0, > 0, or any finite number.
NON_NEGATIVE, POSITIVE, ANY = "a number >= 0", "a positive number", "a finite number"


def _show(raw: object) -> str:
    text = repr(raw)
    return text if len(text) <= 40 else text[:37] + "..."


def _known(record: Mapping[str, Any], fields: tuple[str, ...]) -> None:
    for key in record:
        if key not in fields:
            raise RecordError(f"{key}: unknown field (known: {', '.join(fields[1:])})")


def _req_text(record: Mapping[str, Any], name: str) -> str:
    text = _opt_text(record, name, None)
    if text is None:
        raise RecordError(f"{name}: missing")
    return text


def _opt_text(
    record: Mapping[str, Any], name: str, default: str | None, *, empty: bool = False
) -> str | None:
    value = record.get(name)
    if value is None:
        return default
    if not isinstance(value, str) or (not value and not empty):
        raise RecordError(f"{name}: must be a non-empty string, got {_show(value)}")
    return value


def _req_number(record: Mapping[str, Any], name: str) -> float:
    value = _opt_number(record, name, None)
    if value is None:
        raise RecordError(f"{name}: missing")
    return value


def _opt_number(
    record: Mapping[str, Any], name: str, default: float | None, *, kind: str = NON_NEGATIVE
) -> float | None:
    value = record.get(name)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or (kind != ANY and value < 0)
        or (kind == POSITIVE and value == 0)
    ):
        raise RecordError(f"{name}: must be {kind}, got {_show(value)}")
    return float(value)


def _req_int(record: Mapping[str, Any], name: str, *, positive: bool = False) -> int:
    value = _opt_int(record, name, None, positive=positive)
    if value is None:
        raise RecordError(f"{name}: missing")
    return value


def _opt_int(
    record: Mapping[str, Any], name: str, default: int | None, *, positive: bool = False
) -> int | None:
    value = record.get(name)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < 0
        or (positive and value == 0)
    ):
        kind = "a positive integer" if positive else "an integer >= 0"
        raise RecordError(f"{name}: must be {kind}, got {_show(value)}")
    return value


def _elastic(raw: object) -> Elastic | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or set(raw) != {"min_gpus", "max_gpus", "base_gpus"}:
        raise RecordError(
            f"elastic: must be null or {{min_gpus, max_gpus, base_gpus}}, got {_show(raw)}"
        )
    try:
        low, high, base = (
            _req_int(raw, key, positive=True) for key in ("min_gpus", "max_gpus", "base_gpus")
        )
    except RecordError as error:
        raise RecordError(f"elastic.{error}") from None
    if not low <= base <= high:
        raise RecordError(f"elastic: needs min_gpus <= base_gpus <= max_gpus, got {dict(raw)}")
    return Elastic(low, high, base)
