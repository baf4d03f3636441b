"""The REST API (/api/v1), Prometheus's /metrics and the dashboard, over one Manager.

Every /api/v1 call needs a bearer token (401 without). Users see their own jobs and their VC's,
act only on their own (403 otherwise), and submit only to their VC; admins do anything, and only
they make tokens.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

from fastapi import Body, Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles

from corral.server import auth
from corral.server.auth import Principal
from corral.server.manager import Manager, SubmitError
from corral.server.metrics import metrics_text
from corral.server.spec import JobSpecModel, SpecError, parse_job_spec
from corral.server.store import JobRow

WEB_DIR = Path(__file__).resolve().parent.parent / "web"
STATUSES = ("PENDING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED")
LOG_CHUNK = 1 << 20  # at most 1 MiB of a log per call


async def principal(request: Request) -> Principal:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    store = request.app.state.manager.store
    found = auth.verify(store, token.strip()) if scheme.lower() == "bearer" else None
    if found is None:
        raise HTTPException(
            401,
            "a valid token is needed: Authorization: Bearer TOKEN (see CORRAL_TOKEN)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return found


Caller = Annotated[Principal, Depends(principal)]


def create_app(manager: Manager) -> FastAPI:
    app = FastAPI(
        title="corral",
        version="0.1.0",
        description="The corral GPU cluster manager: jobs, virtual clusters, tokens.",
    )
    app.state.manager = manager
    store = manager.store

    def visible_job(job_id: str, who: Principal) -> JobRow:
        row = store.get_job(job_id) if job_id.isdigit() else None
        if row is None or not auth.can_read_job(who, row.user, row.vc):
            raise HTTPException(404, f"no job {job_id}")
        return row

    def summary(row: JobRow | None, why: dict[str, str] | None = None) -> dict[str, Any]:
        assert row is not None
        job_id = str(row.id)
        status = row.status
        live = status in ("PENDING", "RUNNING")
        reason = why.get(job_id) if why is not None else None
        if live and reason is None:
            reason = manager.why(job_id)
        spec = row.spec
        return {
            "id": job_id,
            "name": row.name,
            "user": row.user,
            "vc": row.vc,
            "status": status,
            "gpus": row.gpus,
            "workers": spec.get("workers", 1),
            "priority": row.priority,
            "submitted_at": row.submitted_at,
            "started_at": row.started_at,
            "finished_at": row.finished_at,
            "attempts": row.attempts,
            "preemptions": row.preemptions,
            "failures": row.failures,
            "placement": manager.placement_of(job_id) if status == "RUNNING" else [],
            "reason": (reason if live else row.reason) or "",
            "exit_code": row.exit_code,
        }

    spec_schema = JobSpecModel.model_json_schema(ref_template="#/components/schemas/{model}")

    @app.post("/api/v1/jobs", status_code=201, tags=["jobs"])
    async def submit_job(who: Caller, request: Request) -> dict[str, Any]:
        """Submit a job (the body is a job spec; see the JobSpec schema). Answered once the job
        is stored: an accepted job survives a crash of the server."""
        try:
            body = json.loads(await request.body())
        except ValueError:
            raise HTTPException(422, "the body must be a job spec in JSON") from None
        try:
            model = parse_job_spec(body)
        except SpecError as error:
            raise HTTPException(422, str(error)) from None
        if "vc" not in model.model_fields_set and who.vc is not None:
            model = model.model_copy(update={"vc": who.vc})
        if not auth.can_submit_to(who, model.vc):
            raise HTTPException(403, f"vc: user {who.user} may submit only to VC {who.vc}")
        try:
            row = await manager.submit_async(model, who.user)
        except SubmitError as error:
            raise HTTPException(422, str(error)) from None
        return summary(row, {row.id: "submitted: waiting for the next scheduling round"})

    @app.get("/api/v1/jobs", tags=["jobs"])
    def list_jobs(
        who: Caller,
        status: Annotated[str | None, Query(description="PENDING, RUNNING, ...")] = None,
        vc: str | None = None,
        user: str | None = None,
        limit: Annotated[int | None, Query(ge=1)] = None,
    ) -> list[dict[str, Any]]:
        if status is not None and status.upper() not in STATUSES:
            raise HTTPException(422, f"status: must be one of {', '.join(STATUSES)}")
        rows = store.list_jobs(
            status=status.upper() if status else None,
            vc=vc,
            user=user,
            visible_to=None if who.admin else (who.user, who.vc),
            limit=limit,
        )
        live = [r.id for r in rows if r.status in ("PENDING", "RUNNING")]
        why = manager.pending_reasons(live)
        return [summary(row, why) for row in rows]

    @app.get("/api/v1/queue", tags=["jobs"])
    def job_queue(
        who: Caller, limit: Annotated[int, Query(ge=1, le=10_000)] = 100
    ) -> dict[str, Any]:
        """The waiting jobs in the scheduler's order (the first `limit`), with why each waits,
        and how many wait in all."""
        visible = None if who.admin else lambda user, vc: auth.can_read_job(who, user, vc)
        total, reasons = manager.queue(limit, visible)
        rows = [store.get_job(job_id) for job_id in reasons]
        return {
            "total": total,
            "jobs": [summary(row, reasons) for row in rows if row is not None],
        }

    @app.get("/api/v1/jobs/{job_id}", tags=["jobs"])
    def describe_job(job_id: str, who: Caller) -> dict[str, Any]:
        row = visible_job(job_id, who)
        job_id = row.id
        detail = summary(row)
        detail["spec"] = row.spec
        detail["attempt_history"] = [
            asdict(a) | {"gpus": [g if isinstance(g, str) else manager.gpu_name(g) for g in a.gpus]}
            for a in store.attempts(job_id)
        ]
        detail["events"] = [asdict(e) for e in store.events(job_id)]
        return detail

    @app.post("/api/v1/jobs/{job_id}/cancel", tags=["jobs"])
    def cancel_job(job_id: str, who: Caller) -> dict[str, Any]:
        row = visible_job(job_id, who)
        if not auth.can_act_on_job(who, row.user):
            raise HTTPException(
                403, f"job {job_id} belongs to {row.user}; only they or an admin may cancel it"
            )
        manager.cancel(row.id)  # "07" names job 7: use the stored id from here on
        return summary(store.get_job(row.id))

    @app.get("/api/v1/jobs/{job_id}/logs", tags=["jobs"], response_class=PlainTextResponse)
    def job_logs(
        job_id: str,
        who: Caller,
        attempt: Annotated[int | None, Query(ge=1)] = None,
        rank: Annotated[int, Query(ge=0)] = 0,
        stream: Annotated[str, Query(pattern="^(stdout|stderr)$")] = "stdout",
        offset: Annotated[int, Query(ge=0, le=2**62)] = 0,
    ) -> Response:
        row = visible_job(job_id, who)
        job_id = row.id
        number = attempt or row.attempts
        # Over once its attempt's processes have ended (a stopped attempt may still write
        # during its grace period), or, with no attempt, once the job has.
        finished = row.status not in ("PENDING", "RUNNING")
        text = b""
        if number:
            path = manager.attempt_dir(job_id, number) / f"rank-{rank}.{stream}"
            if path.is_file():
                with path.open("rb") as handle:
                    handle.seek(offset)
                    text = handle.read(LOG_CHUNK)
            states = {a.number: a.state for a in store.attempts(job_id)}
            if number in states:
                finished = states[number] == "ended" and (finished or number < row.attempts)
        return PlainTextResponse(
            text.decode("utf-8", errors="replace"),
            headers={
                "X-Corral-Offset": str(offset + len(text)),
                "X-Corral-Finished": "true" if finished and len(text) < LOG_CHUNK else "false",
                "X-Corral-Attempt": str(number),
            },
        )

    @app.get("/api/v1/vcs", tags=["cluster"])
    def list_vcs(who: Caller) -> list[dict[str, Any]]:
        counts = manager.counts_by_vc()
        return [
            {
                "name": vc,
                "guaranteed_gpus": manager.vc_quota[vc],
                "allocated_gpus": counts[vc]["gpus"],
                "pending": counts[vc]["pending"],
                "running": counts[vc]["running"],
            }
            for vc in sorted(manager.vc_quota)
            if who.admin or who.vc is None or who.vc == vc
        ]

    @app.get("/api/v1/cluster", tags=["cluster"])
    def cluster_view(who: Caller) -> dict[str, Any]:
        owners = manager.gpu_owners()
        jobs = {job_id: store.get_job(job_id) for job_id in set(owners.values())}
        cluster = manager.cluster
        nodes = []
        for node_index, node in enumerate(cluster.nodes):
            gpus = []
            for device, gpu in enumerate(cluster.node_gpus[node_index]):
                owner = owners.get(gpu)
                row = jobs.get(owner) if owner else None
                if row is not None and not auth.can_read_job(who, row.user, row.vc):
                    gpus.append(  # busy, and whose VC: but not whose job
                        {
                            "index": device,
                            "global": gpu,
                            "type": cluster.gpus[gpu].gpu_type,
                            "job": None,
                            "job_name": None,
                            "vc": row.vc,
                            "user": None,
                            "busy": True,
                        }
                    )
                    continue
                gpus.append(
                    {
                        "index": device,
                        "global": gpu,
                        "type": cluster.gpus[gpu].gpu_type,
                        "job": owner,
                        "job_name": row.name if row else None,
                        "vc": row.vc if row else None,
                        "user": row.user if row else None,
                        "busy": owner is not None,
                    }
                )
            rack = cluster.racks[cluster.node_rack[node_index]].name
            nodes.append({"name": node.name, "rack": rack, "gpus": gpus})
        return {"nodes": nodes, "vcs": list_vcs(who), "policy": manager.settings.policy}

    @app.post("/api/v1/tokens", status_code=201, tags=["auth"])
    def create_token(who: Caller, body: Annotated[dict[str, Any], Body()]) -> dict[str, Any]:
        if not who.admin:
            raise HTTPException(403, "only an admin may create tokens")
        user = body.get("user")
        vc = body.get("vc")
        admin = body.get("admin", False)
        if not isinstance(user, str) or not user.strip():
            raise HTTPException(422, "user: must be a non-empty string")
        if vc is not None and (not isinstance(vc, str) or vc not in manager.vc_quota):
            raise HTTPException(
                422,
                f"vc: unknown VC {vc!r}; this cluster has {', '.join(sorted(manager.vc_quota))}",
            )
        if not isinstance(admin, bool):
            raise HTTPException(422, "admin: must be true or false")
        token = auth.create_token(store, user.strip(), vc=vc, admin=admin)
        return {"token": token, "user": user.strip(), "vc": vc, "admin": admin}

    @app.get("/api/v1/whoami", tags=["auth"])
    def whoami(who: Caller) -> dict[str, Any]:
        return {"user": who.user, "vc": who.vc, "admin": who.admin}

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        body, content_type = metrics_text(manager)
        return Response(body, media_type=content_type)

    @app.exception_handler(HTTPException)
    def http_error(request: Request, error: HTTPException) -> JSONResponse:
        return JSONResponse(
            {"detail": error.detail}, status_code=error.status_code, headers=error.headers
        )

    _document_spec_body(app, spec_schema)
    if WEB_DIR.is_dir():
        app.mount("/", StaticFiles(directory=WEB_DIR, html=True), name="dashboard")
    return app


def _document_spec_body(app: FastAPI, spec_schema: dict[str, Any]) -> None:
    """The submit body is parsed by parse_job_spec (for one-line field errors), so FastAPI sees
    `Any`; put the job spec's schema into the OpenAPI document by hand."""
    original = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = original()
        defs = spec_schema.get("$defs", {})
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.update(defs)
        components["JobSpec"] = {k: v for k, v in spec_schema.items() if k != "$defs"}
        schema["paths"]["/api/v1/jobs"]["post"]["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/JobSpec"}}},
        }
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
