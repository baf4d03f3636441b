"""The API's answers as pydantic models: what the server declares (corral.server.schemas
re-exports them into its OpenAPI document) and what the Python client (corral.client) returns.

Light on purpose: pydantic only, no FastAPI, SQLAlchemy or numpy, so that a client install can
import it. Every model allows fields it does not name (a newer server's pass through).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class JobStatus(StrEnum):
    """A job's status. A str: `JobStatus.SUCCEEDED == "SUCCEEDED"`."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    REFUSED = "REFUSED"  # refused when submitted (ElasticFlow's admission): it never runs

    @property
    def final(self) -> bool:
        """Whether the job has ended (it will not change any more unless requeued)."""
        return self not in (JobStatus.PENDING, JobStatus.RUNNING)


class Record(BaseModel):
    """A model that also reads as the JSON mapping it came from: `job["status"]` is
    `job.status`, `job.get("reason")`, `"estimate" in job` (the Python client answered plain
    mappings before it answered these)."""

    def _key(self, key: str) -> str:
        if key in type(self).model_fields or key in (self.model_extra or {}):
            return key
        for name, info in type(self).model_fields.items():
            if info.alias == key:
                return name
        raise KeyError(key)

    def __getitem__(self, key: str) -> Any:
        return getattr(self, self._key(key))

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key: object) -> bool:
        try:
            return isinstance(key, str) and bool(self._key(key))
        except KeyError:
            return False


_OPEN = ConfigDict(extra="allow")  # fields added later pass through, and the schema says so


class ErrorBody(Record):
    """Every error answer."""

    detail: str = Field(description="one line: `FIELD: reason`, or the reason alone")


class JobSummary(Record):
    """A job as listings show it."""

    model_config = _OPEN

    id: str
    name: str
    user: str
    vc: str
    status: JobStatus = Field(
        description="PENDING, RUNNING, SUCCEEDED, FAILED, CANCELLED or REFUSED (refused when "
        "submitted: ElasticFlow could not meet its deadline; it never runs)"
    )
    gpus: int
    workers: int
    priority: str
    submitted_at: float = Field(description="epoch seconds")
    started_at: float | None
    finished_at: float | None
    attempts: int
    preemptions: int
    failures: int
    placement: list[str] = Field(description="a running job's GPUs (NODE/INDEX)")
    reason: str = Field(description="why a pending job waits, or how the job ended")
    exit_code: int | None
    progress: ProgressInfo | None = None


class ProgressInfo(Record):
    """What a job last reported (docs/progress.md); null until it reports."""

    model_config = _OPEN

    step: float
    total_steps: float | None
    steps_per_s: float | None = Field(description="measured over its latest minute of reports")
    loss: float | None
    updated_at: float = Field(description="when the manager read it (epoch seconds)")
    eta_s: float | None = Field(description="seconds left at the measured rate, if known")


class EstimateInfo(Record):
    """A waiting or running job's estimated remaining run time, and what it came from."""

    model_config = _OPEN

    remaining_s: float = Field(
        description="seconds of running left (a policy's estimate: seconds of work at full speed)"
    )
    source: str = Field(
        description="fit or prior (the policy's estimate, which its key holds now: optimus's "
        "loss-curve fit, or its prior when there is no fit), else what the job declared: "
        "total_steps (at the measured rate) or time_limit (less the time it ran)"
    )
    basis: str = Field(description="the same in words, e.g. the fit's points and its step")


class ProgressPoint(Record):
    model_config = _OPEN

    attempt: int
    at: float
    step: float
    loss: float | None


class ProfileInfo(Record):
    """A model's measured throughput on one placement shape."""

    model_config = _OPEN

    model: str
    gpu_type: str
    gpus: int
    nodes: int = Field(description="nodes the GPUs spanned")
    colocated: str = Field(description="the model sharing the GPUs ('' when none)")
    steps_per_s: float
    samples_per_s: float | None
    seconds: float = Field(description="seconds of running measured")
    runs: int = Field(description="attempts measured")
    updated_at: float
    vc: str = Field("", description="the VC whose jobs measured it ('': none's, read by all)")
    shared: bool = Field(False, description="its model is marked shared: every VC reads it")


class SharedModel(Record):
    """A model an admin marked shared."""

    model_config = _OPEN

    model: str
    marked_by: str = Field(description="the admin who marked it")
    marked_at: float


class ShareAnswer(Record):
    model_config = _OPEN

    model: str
    shared: bool = Field(description="whether it is marked shared now")
    changed: bool = Field(description="false when it already was (or was not)")


class AttemptInfo(Record):
    model_config = _OPEN

    job_id: str
    number: int
    gpus: list[str]
    started_at: float
    ended_at: float | None
    state: str
    outcome: str | None = Field(
        description="succeeded, failed, preempted, migrated, unpacked, cancelled or lost"
    )
    exit_code: int | None
    reason: str


class EventInfo(Record):
    model_config = _OPEN

    id: int
    job_id: str | None
    at: float
    kind: str
    message: str


class JobDetail(JobSummary):
    """A job's summary with its spec, attempts and events."""

    spec: dict[str, Any]
    attempt_history: list[AttemptInfo]
    events: list[EventInfo]
    progress_history: list[ProgressPoint] = Field(
        default_factory=list, description="the job's progress, thinned (the latest 500 points)"
    )
    progress_problems: dict[str, Any] | None = Field(
        None,
        description="the running attempt's progress file: lines that were not reports "
        "(`malformed_lines`) and the latest problem (`last_error`); why its reports were "
        "rejected (`rejected`, one line: a rate above the manager's max_steps_per_s; none of "
        "its measurements count); null when none",
    )
    throughput: list[ProfileInfo] = Field(
        default_factory=list, description="its model's measured throughput per shape"
    )
    estimate: EstimateInfo | None = Field(
        None, description="a waiting or running job's estimated remaining time; null: none"
    )


class QueueView(Record):
    model_config = _OPEN

    total: int = Field(description="visible waiting jobs, all of them")
    jobs: list[JobSummary] = Field(description="the first `limit`, in the scheduler's order")


class VcView(Record):
    model_config = _OPEN

    name: str
    guaranteed_gpus: int
    allocated_gpus: int
    pending: int
    running: int
    # Under departments (hierarchical queues) each row also has `kind` ("vc" or "department"),
    # `parent` (null: none), `depth` in the tree, `borrowed_gpus` (used beyond its quota),
    # `weight` (over-quota) and `limit` (null: none); a flat cluster's rows have none of them.


class GpuJobView(Record):
    """A job on a GPU (its id, name and user are null where the caller may not see it)."""

    model_config = _OPEN

    job: str | None
    job_name: str | None
    vc: str | None
    user: str | None
    share: float = Field(description="the part of the GPU it holds: 1 for a whole GPU, 0.5 ...")
    stopping: bool = Field(description="preempted or cancelled, its processes not yet gone")


class GpuView(Record):
    """A GPU; `job`, `job_name`, `vc` and `user` are those of the first of `jobs`."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    index: int
    global_id: int = Field(alias="global")
    type: str
    job: str | None
    job_name: str | None
    vc: str | None
    user: str | None
    busy: bool
    jobs: list[GpuJobView] = Field(
        default_factory=list,
        description="every job on the GPU: several where shares of it run at once",
    )
    share: float = Field(0.0, description="the part of the GPU its jobs hold (0 to 1)")


class NodeView(Record):
    model_config = _OPEN

    name: str
    rack: str
    gpus: list[GpuView]
    state: str = Field(
        "up", description="up, draining, drained, unhealthy or down (`corral node ls`)"
    )
    reason: str = Field("", description="why it is not up (a drain's reason, a failed check's)")


class ClusterView(Record):
    model_config = _OPEN

    nodes: list[NodeView]
    vcs: list[VcView]
    policy: str
