"""What the API answers, as the OpenAPI document states it: the bodies of its routes and the
errors every route may give, so that a schema-driven client (or fuzzer) is told the truth.

Every error is `ErrorBody`, `{"detail": "one line"}`: FastAPI's own validation errors included
(`validation_error` turns them into one line naming the parameter). `document_errors` adds to
every /api/ operation of the document the errors the middleware and the token check can give
(401, 422 and 503 everywhere, 413 where a body is taken, 404 where the path names something, 403
where the caller's rights matter, 409 where the job's state matters), whichever module defines
the route. tests/server/test_api_statuses.py reads the routes' code for the statuses each can
answer and checks that the document lists exactly those.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field

from corral.server.spec import one_line

_OPEN = ConfigDict(extra="allow")  # fields added later pass through, and the schema says so


class ErrorBody(BaseModel):
    """Every error answer."""

    detail: str = Field(description="one line: `FIELD: reason`, or the reason alone")


class JobSummary(BaseModel):
    """A job as listings show it."""

    model_config = _OPEN

    id: str
    name: str
    user: str
    vc: str
    status: str = Field(
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


class ProgressInfo(BaseModel):
    """What a job last reported (docs/progress.md); null until it reports."""

    model_config = _OPEN

    step: float
    total_steps: float | None
    steps_per_s: float | None = Field(description="measured over its latest minute of reports")
    loss: float | None
    updated_at: float = Field(description="when the manager read it (epoch seconds)")
    eta_s: float | None = Field(description="seconds left at the measured rate, if known")


class EstimateInfo(BaseModel):
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


class ProgressPoint(BaseModel):
    model_config = _OPEN

    attempt: int
    at: float
    step: float
    loss: float | None


class ProfileInfo(BaseModel):
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


class SharedModel(BaseModel):
    """A model an admin marked shared."""

    model_config = _OPEN

    model: str
    marked_by: str = Field(description="the admin who marked it")
    marked_at: float


class ShareAnswer(BaseModel):
    model_config = _OPEN

    model: str
    shared: bool = Field(description="whether it is marked shared now")
    changed: bool = Field(description="false when it already was (or was not)")


class AttemptInfo(BaseModel):
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


class EventInfo(BaseModel):
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


class QueueView(BaseModel):
    model_config = _OPEN

    total: int = Field(description="visible waiting jobs, all of them")
    jobs: list[JobSummary] = Field(description="the first `limit`, in the scheduler's order")


class VcView(BaseModel):
    model_config = _OPEN

    name: str
    guaranteed_gpus: int
    allocated_gpus: int
    pending: int
    running: int
    # Under departments (hierarchical queues) each row also has `kind` ("vc" or "department"),
    # `parent` (null: none), `depth` in the tree, `borrowed_gpus` (used beyond its quota),
    # `weight` (over-quota) and `limit` (null: none); a flat cluster's rows have none of them.


class GpuJobView(BaseModel):
    """A job on a GPU (its id, name and user are null where the caller may not see it)."""

    model_config = _OPEN

    job: str | None
    job_name: str | None
    vc: str | None
    user: str | None
    share: float = Field(description="the part of the GPU it holds: 1 for a whole GPU, 0.5 ...")
    stopping: bool = Field(description="preempted or cancelled, its processes not yet gone")


class GpuView(BaseModel):
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


class NodeView(BaseModel):
    model_config = _OPEN

    name: str
    rack: str
    gpus: list[GpuView]
    state: str = Field(
        "up", description="up, draining, drained, unhealthy or down (`corral node ls`)"
    )
    reason: str = Field("", description="why it is not up (a drain's reason, a failed check's)")


class ClusterView(BaseModel):
    model_config = _OPEN

    nodes: list[NodeView]
    vcs: list[VcView]
    policy: str


# -- FastAPI's validation errors, in one line --------------------------------------------------


def validation_error(error: RequestValidationError) -> str:
    """The first of FastAPI's validation errors as `PARAMETER: reason` (pydantic's "Input
    should be" read as "must be")."""
    details = error.errors()
    if not details:
        return "the request is not valid"
    first = details[0]
    loc = [str(part) for part in first.get("loc", ())]
    if loc and loc[0] in ("query", "path", "header", "cookie", "body"):
        loc = loc[1:]
    message = str(first.get("msg", "not valid"))
    if first.get("type") == "missing":
        message = "field required"
    else:  # "Input should be ...", "String should match ...": "must be ...", "must match ..."
        message = re.sub(r"^[A-Z][a-z]* should ", "must ", message)
    field = ".".join(loc)
    text = f"{field}: {message}" if field else message
    return one_line(text, 300)


# -- the errors of every operation ---------------------------------------------------------------

ERRORS = {
    "401": "no valid token: `Authorization: Bearer TOKEN`",
    "403": "not allowed for this token",
    "404": "no such job (or one this token may not see), or no such item",
    "413": "the request body is larger than the server's limit (1 MiB by default)",
    "409": "the job's state does not allow it (holding a running job, releasing one not "
    "held, requeueing a pending one), or its log is not a regular file; resuming a node not "
    "drained",
    "422": "a refused parameter or body: a NUL character, a number out of range, invalid "
    "JSON, a refused job spec",
    "503": "the store is unavailable: try again (Retry-After)",
}
#: Operations whose answer depends on the caller's rights beyond seeing: (method, path prefix).
FORBIDDEN = (
    ("post", "/api/v1/jobs"),  # a VC other than the token's
    ("post", "/api/v1/jobs/{job_id}/cancel"),  # another user's job
    ("get", "/api/v1/tokens"),  # admins only, every token route
    ("post", "/api/v1/tokens"),
    ("delete", "/api/v1/tokens"),
    ("get", "/api/v1/export"),  # admins only
    ("post", "/api/v1/profiles/share"),  # admins only (and /unshare)
    ("post", "/api/v1/profiles/unshare"),
    ("post", "/api/v1/nodes/"),  # admins only: drain, resume
    ("post", "/api/v1/reservations"),  # admins only: make, delete
    ("delete", "/api/v1/reservations/"),
)
#: Operations refused (409) when the job's state does not allow them: (method, path), exactly.
CONFLICT = (
    ("post", "/api/v1/jobs/{job_id}/hold"),
    ("post", "/api/v1/jobs/{job_id}/release"),
    ("post", "/api/v1/jobs/{job_id}/requeue"),
    ("get", "/api/v1/jobs/{job_id}/logs"),
    ("post", "/api/v1/nodes/{name}/resume"),
    ("post", "/api/v1/reservations"),  # a name taken, GPUs reserved in that window already
)
_ERROR_REF = {"$ref": "#/components/schemas/ErrorBody"}
_BODY_METHODS = ("post", "put", "patch")


def _error_response(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ERROR_REF}}}


def document_errors(schema: dict[str, Any]) -> dict[str, Any]:
    """Complete an OpenAPI document (in place): the errors of every /api/ operation, each
    `ErrorBody`, in place of FastAPI's HTTPValidationError; bearer authentication."""
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas["ErrorBody"] = ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
    components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    for path, item in schema.get("paths", {}).items():
        if not path.startswith("/api/"):
            continue
        for method, operation in item.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            operation.setdefault("security", [{"bearer": []}])
            responses = operation["responses"]
            wanted = ["401", "422", "503"]
            if method in _BODY_METHODS or "requestBody" in operation:
                wanted.append("413")
            if "{" in path:
                wanted.append("404")
            if any(method == m and path.startswith(p) for m, p in FORBIDDEN):
                wanted.append("403")
            if (method, path) in CONFLICT:
                wanted.append("409")
            for status in wanted:
                responses.setdefault(status, _error_response(ERRORS[status]))
            for status, found in responses.items():
                if status[0] in "45":  # every error is ErrorBody (the app's handlers)
                    if found.get("description") in (None, "", "Validation Error"):
                        found["description"] = ERRORS.get(status, "refused")
                    found["content"] = {"application/json": {"schema": _ERROR_REF}}
            operation["responses"] = dict(sorted(responses.items()))
    text = repr(schema.get("paths", {}))
    for unused in ("HTTPValidationError", "ValidationError"):
        if f"/{unused}'" not in text:
            schemas.pop(unused, None)
    return schema
