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

# The answers' models live in corral.api_models (pydantic only: the Python client imports them
# without the server's dependencies); the routes and the OpenAPI document name them from here.
from corral.api_models import (
    AttemptInfo,
    ClusterView,
    ErrorBody,
    EstimateInfo,
    EventInfo,
    GpuJobView,
    GpuView,
    JobDetail,
    JobStatus,
    JobSummary,
    NodeView,
    ProfileInfo,
    ProgressInfo,
    ProgressPoint,
    QueueView,
    ShareAnswer,
    SharedModel,
    VcView,
)
from corral.server.spec import one_line

__all__ = [
    "AttemptInfo",
    "ClusterView",
    "ErrorBody",
    "EstimateInfo",
    "EventInfo",
    "GpuJobView",
    "GpuView",
    "JobDetail",
    "JobStatus",
    "JobSummary",
    "NodeView",
    "ProfileInfo",
    "ProgressInfo",
    "ProgressPoint",
    "QueueView",
    "SharedModel",
    "ShareAnswer",
    "VcView",
    "document_errors",
    "validation_error",
]

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
    ("get", "/api/v1/jobs/{job_id}/logs/stream"),
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
