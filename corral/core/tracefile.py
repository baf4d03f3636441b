"""corral's own trace format: a cluster's jobs as the core's `JobSpec`s and its nodes, losslessly.

One JSON object per line (files named `*.corral.jsonl`). The first line is the header, then nodes
and jobs in any order:

    {"kind": "trace", "version": 1, "time_origin": 1760000000.0, "throughputs": "h.throughputs.json"}
    {"kind": "node", "name": "a1", "gpus": 4, "gpu_type": "a100", "rack": "r0", ...}
    {"kind": "job", "id": "7", "submit_time": 12.0, "gpus": 2, "duration_s": 340.0, ...}

A job line holds every field of `JobSpec` (`job_record` writes them all; a reader needs only
`id`, `submit_time` and `gpus`, the others default as in `JobSpec`), times in seconds since the
header's `time_origin` (`submit_time`, `deadline`), plus what the writer knew of it that the core
does not use (`status`, `name`). A node line holds a `NodeDef`. The header may name the
throughput table the jobs' speeds come from (`throughputs`: a Gavel-format file, a path relative
to the trace's own directory; `corral.core.profiles.Profiles.from_gavel` reads it).

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
from typing import Any

from corral.core.cluster import NodeDef
from corral.core.job import Elastic, JobSpec, Priority

VERSION = 1
#: Fields of a job record that are not the core's: what the shell that wrote it knew.
JOB_EXTRAS = ("status", "name")
HEADER_FIELDS = ("kind", "version", "time_origin", "throughputs", "source")
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
    *JOB_EXTRAS,
)


class RecordError(ValueError):
    """A record that is not a valid header, node or job: `field: problem`, one line."""


# -- writing --------------------------------------------------------------------------------------


def header_record(
    time_origin: float, *, throughputs: str | None = None, source: str | None = None
) -> dict[str, Any]:
    record: dict[str, Any] = {"kind": "trace", "version": VERSION, "time_origin": time_origin}
    if throughputs is not None:
        record["throughputs"] = throughputs
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


def job_record(spec: JobSpec, **extras: Any) -> dict[str, Any]:
    """Every field of the spec (times as they are: the caller makes them relative to the
    origin), then `extras` (`status`, `name`)."""
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
        **{key: value for key, value in extras.items() if value is not None},
    }


def decision_order(record: Mapping[str, Any]) -> tuple[float, int, str]:
    """Decisions in time; at one instant preemptions first, then by job. (Within a round the
    live manager records a start once the GPUs it needs have drained, the simulator in the
    round's order: this order is the one both can give.)"""
    return (float(record["at"]), 0 if record["action"] == "preempt" else 1, str(record["job"]))


# -- reading --------------------------------------------------------------------------------------


def kind_of(record: object) -> str:
    """The record's `kind`: trace, node or job."""
    if not isinstance(record, Mapping):
        raise RecordError(f"record: expected a JSON object, got {_show(record)}")
    kind = record.get("kind")
    if kind not in ("trace", "node", "job"):
        raise RecordError(f"kind: must be trace, node or job, got {_show(kind)}")
    return str(kind)


def read_header(record: Mapping[str, Any]) -> tuple[float, str | None]:
    """(time_origin, throughputs) of a header record."""
    _known(record, HEADER_FIELDS)
    version = record.get("version")
    if version != VERSION or isinstance(version, bool):
        raise RecordError(f"version: this corral reads version {VERSION}, got {_show(version)}")
    _opt_text(record, "source", None)
    origin = _opt_number(record, "time_origin", 0.0, kind=ANY)
    return origin or 0.0, _opt_text(record, "throughputs", None)


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
    )
    problem = spec.request_problem()
    if problem is not None:
        name, _, rest = problem.partition(" must ")
        raise RecordError(f"{name}: must {rest}" if rest else f"gpus: {problem}")
    return spec


# -- fields ---------------------------------------------------------------------------------------

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
