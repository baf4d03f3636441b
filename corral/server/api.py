"""The REST API (/api/v1), Prometheus's /metrics and the dashboard, over one Manager.

Every /api/v1 call needs a bearer token (401 without). Users see their own jobs and their VC's,
act only on their own (403 otherwise), and submit only to their VC; admins do anything, and only
they make tokens.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

from fastapi import Body, Depends, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool
from starlette.routing import Route

from corral.server import auth, limits, logstream, redact, schemas
from corral.server.auth import Principal
from corral.server.bulk import parse_filter
from corral.server.controls import ControlError
from corral.server.liveness import add_liveness_routes
from corral.server.logread import LogRead, UnreadableLog, read_log
from corral.server.manager import Manager, SubmitError
from corral.server.metrics import metrics_text
from corral.server.spec import (
    MAX_TEXT_CHARS,
    JobSpecModel,
    SpecError,
    array_tasks,
    one_line,
    parse_job_spec,
)
from corral.server.store import (
    TOKEN_ID_CHARS,
    JobListRow,
    JobProgress,
    JobRow,
    StoreUnavailable,
    TokenRow,
)
from corral.server.usage import usage_report
from corral.server.views import GpuHolder

WEB_DIR = Path(__file__).resolve().parent.parent / "web"
#: REFUSED: a job the scheduler refused when it was submitted (ElasticFlow: a deadline it cannot
#: meet); it never runs.
STATUSES = ("PENDING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED", "REFUSED")
#: A listing with more jobs than it returned says where the next page starts (its `before_id`).
NEXT_PAGE_HEADER = "X-Corral-Next-Before-Id"
LOG_CHUNK = 1 << 20  # at most 1 MiB of a log per call
LOG_MAX_OFFSET = 1 << 62  # beyond any file (ext4 stops at 2**44, btrfs and XFS at 2**63)
LOG_MAX_TAIL = 1_000_000  # lines
LOG_MAX_INDEX = 1_000_000  # attempts, ranks
#: The longest reason a drain may give.
MAX_REASON_CHARS = 512
TOKEN_FIELDS = ("user", "vc", "admin", "unix_user", "expires_in_seconds")
#: The answer to any call while the store fails (503): nothing was changed, the call may be
#: repeated (`Retry-After` seconds later).
STORE_UNAVAILABLE = (
    "the store is unavailable: the call was not carried out; repeat it in a few seconds"
)
RETRY_AFTER_S = 2
MAX_TOKEN_LIFE_S = 10 * 365 * 86400


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


#: The header of a submission's idempotency key: the same key from the same user again (a retry,
#: perhaps to another manager after a failover) answers the job stored the first time.
IDEMPOTENCY_HEADER = "Idempotency-Key"
MAX_KEY_CHARS = 128


def create_app(manager: Manager) -> FastAPI:
    app = FastAPI(
        title="corral",
        version="0.1.0",
        description="The corral GPU cluster manager: jobs, virtual clusters, tokens.",
    )
    app.state.manager = manager
    store = manager.store
    app.add_middleware(limits.RequestGuard, max_body_bytes=manager.settings.max_body_bytes)

    def visible_job(job_id: str, who: Principal) -> JobRow:
        row = store.get_job(job_id) if job_id.isdigit() else None
        if row is None or not auth.can_read_job(who, row.user, row.vc):
            raise HTTPException(404, f"no job {one_line(job_id, limits.MAX_ECHO_CHARS)}")
        return row

    def summary(
        row: JobRow | JobListRow | None, why: dict[str, str] | None = None
    ) -> dict[str, Any]:
        assert row is not None
        job_id = str(row.id)
        status = row.status
        live = status in ("PENDING", "RUNNING")
        reason = why.get(job_id) if why is not None else None
        if live and reason is None:
            reason = manager.why(job_id)
        workers = row.workers if isinstance(row, JobListRow) else row.spec.get("workers", 1)
        return {
            "id": job_id,
            "name": row.name,
            "user": row.user,
            "vc": row.vc,
            "status": status,
            "gpus": row.gpus,
            "workers": workers,
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
            "progress": progress_view(
                row.progress,
                live,
                manager.running_since(job_id) if status == "RUNNING" else None,
            ),
            "held_by": row.held_by,
            "array_id": row.array_id,
            "array_index": row.array_index,
        }

    def shown(who: Principal, answers: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Summaries as `who` may read them: other jobs their reasons name that `who` may not
        see are named without their ids (corral.server.redact)."""
        show = redact.for_reader(store, who, (answer["reason"] for answer in answers))
        for answer in answers:
            answer["reason"] = show(answer["reason"])
        return answers

    def progress_view(
        progress: JobProgress | None, live: bool, running_since: float | None
    ) -> dict[str, Any] | None:
        """`running_since`: when the job's running attempt started (None: not running)."""
        if progress is None:
            return None
        return {
            "step": progress.step,
            "total_steps": progress.total_steps,
            "steps_per_s": progress.steps_per_s,
            "loss": progress.loss,
            "updated_at": progress.at,
            "eta_s": progress.eta_s(manager.clock(), running_since) if live else None,
        }

    def first_hidden_parent(after: list[int], who: Principal) -> tuple[int, int] | None:
        """The first (position, id) of `after` naming a job `who` may not see (or none)."""
        rows = {row.id: row for row in store.list_jobs(ids=after)}  # one query, no specs
        for position, parent in enumerate(after):
            row = rows.get(str(parent))
            if row is None or not auth.can_read_job(who, row.user, row.vc):
                return position, parent
        return None

    spec_schema = JobSpecModel.model_json_schema(ref_template="#/components/schemas/{model}")

    @app.post("/api/v1/jobs", status_code=201, tags=["jobs"], response_model=schemas.JobSummary)
    async def submit_job(who: Caller, request: Request) -> dict[str, Any]:
        """Submit a job (the body is a job spec; see the JobSpec schema). Answered once the job
        is stored: an accepted job survives a crash of the server. With an `Idempotency-Key`
        header, a submission repeated with the same key answers the job stored the first time
        (a client retrying across a failover stores one job)."""
        return await submit(who, request)

    async def submit_job_lean(request: Request) -> Response:
        """`submit_job` without FastAPI's dependency solving and response validation, which
        cost a submission about a fifth of its CPU (benchmarks/control_plane_instructions.py):
        the same checks, the same answer. This route answers; `submit_job` is what the OpenAPI
        document shows."""
        answer = await submit(await principal(request), request)
        return JSONResponse(answer, status_code=201)

    async def submit(who: Principal, request: Request) -> dict[str, Any]:
        try:
            body = await limits.json_body(request)  # strict: depth, duplicate keys
        except limits.JsonError as error:
            raise HTTPException(422, str(error)) from None
        try:
            model = parse_job_spec(body)
        except SpecError as error:
            raise HTTPException(422, str(error)) from None
        if "vc" not in model.model_fields_set and who.vc is not None:
            model = model.model_copy(update={"vc": who.vc})
        if not auth.can_submit_to(who, model.vc):
            raise HTTPException(403, f"vc: user {who.user} may submit only to VC {who.vc}")
        if not auth.can_set_level(who, model.level):
            raise HTTPException(
                403, f"level: user {who.user} may not raise a job above level 0 (admins only)"
            )
        if model.after and not who.admin:
            # A job the submitter may not see is, to them, a job that does not exist: its id
            # and outcome ("dependency 12 failed") are not theirs to learn.
            hidden = await run_in_threadpool(first_hidden_parent, model.after, who)
            if hidden is not None:
                raise HTTPException(422, f"after.{hidden[0]}: no job {hidden[1]}")
        if model.workdir is not None and getattr(manager.executor, "workdirs_here", False):
            # Here, not when the job starts (Ray's nodes are elsewhere: not checked there). In
            # multi-user mode the job's account is checked first, then the workdir as it sees
            # it (manager.submit): root's look would tell whether a closed path exists.
            check = limits.workdir_problem
            if manager.settings.multi_user:
                check = limits.workdir_form_problem
            problem = await run_in_threadpool(check, model.workdir)
            if problem is not None:
                raise HTTPException(422, f"workdir: {problem}")
        key = request.headers.get(IDEMPOTENCY_HEADER)
        if key is not None and not (0 < len(key) <= MAX_KEY_CHARS and key.isascii()):
            raise HTTPException(
                422, f"{IDEMPOTENCY_HEADER}: 1 to {MAX_KEY_CHARS} ASCII characters, got {len(key)}"
            )
        try:
            row = await manager.submit_async(model, who.user, who.unix_user, key=key)
        except SubmitError as error:
            raise HTTPException(422, str(error)) from None
        answer = summary(row, {row.id: "submitted: waiting for the next scheduling round"})
        shown(who, [answer])
        if model.array is not None:  # a job array: its tasks have consecutive ids
            count = len(array_tasks(model.array)[0])
            answer["array_tasks"] = [str(int(row.id) + i) for i in range(count)]
        return answer

    @app.get(
        "/api/v1/jobs",
        tags=["jobs"],
        response_model=list[schemas.JobSummary],
        responses={
            200: {
                "headers": {
                    NEXT_PAGE_HEADER: {
                        "description": "present when more jobs match: the `before_id` of the "
                        "next page",
                        "schema": {"type": "string"},
                    }
                }
            }
        },
    )
    def list_jobs(
        who: Caller,
        response: Response,
        status: Annotated[
            str | None, Query(description=f"one of {', '.join(STATUSES)} (any case)")
        ] = None,
        vc: str | None = None,
        user: str | None = None,
        name: Annotated[
            str | None,
            Query(description="only jobs of this name (an array: its tasks) or shell glob"),
        ] = None,
        limit: Annotated[
            int, Query(ge=1, le=limits.MAX_LIST_LIMIT, description="jobs in this page")
        ] = limits.DEFAULT_LIST_LIMIT,
        before_id: Annotated[
            int | None,
            Query(
                ge=1,
                le=limits.MAX_JOB_ID + 1,
                description=f"only jobs with a smaller id (the next page: {NEXT_PAGE_HEADER})",
            ),
        ] = None,
    ) -> list[dict[str, Any]]:
        """The visible jobs, newest first, `limit` at most; the header X-Corral-Next-Before-Id
        says that more match, and where the next page starts."""
        if status is not None and status.upper() not in STATUSES:
            raise HTTPException(422, f"status: must be one of {', '.join(STATUSES)}")
        rows = store.list_jobs(
            status=status.upper() if status else None,
            vc=vc,
            user=user,
            name=name,
            visible_to=None if who.admin else (who.user, who.vc),
            limit=limit + 1,
            before_id=before_id,
        )
        if len(rows) > limit:
            rows = rows[:limit]
            response.headers[NEXT_PAGE_HEADER] = rows[-1].id
        live = [r.id for r in rows if r.status in ("PENDING", "RUNNING")]
        why = manager.pending_reasons(live)
        return shown(who, [summary(row, why) for row in rows])

    @app.get("/api/v1/queue", tags=["jobs"], response_model=schemas.QueueView)
    def job_queue(
        who: Caller, limit: Annotated[int, Query(ge=1, le=limits.MAX_LIST_LIMIT)] = 100
    ) -> dict[str, Any]:
        """The waiting jobs in the scheduler's order (the first `limit`), with why each waits,
        and how many wait in all."""
        visible = None if who.admin else lambda user, vc: auth.can_read_job(who, user, vc)
        total, reasons = manager.queue(limit, visible)
        rows = {row.id: row for row in store.list_jobs(ids=reasons)}  # one query, no specs
        return {
            "total": total,
            "jobs": shown(
                who, [summary(rows[job_id], reasons) for job_id in reasons if job_id in rows]
            ),
        }

    @app.get("/api/v1/jobs/{job_id}", tags=["jobs"], response_model=schemas.JobDetail)
    def describe_job(job_id: str, who: Caller) -> dict[str, Any]:
        row = visible_job(job_id, who)
        job_id = row.id
        detail = summary(row)
        detail["spec"] = row.spec
        attempts = [
            asdict(a) | {"gpus": [g if isinstance(g, str) else manager.gpu_name(g) for g in a.gpus]}
            for a in store.attempts(job_id)
        ]
        events = [asdict(e) for e in store.events(job_id)]
        texts = [
            detail["reason"],
            *(a["reason"] for a in attempts),
            *(e["message"] for e in events),
        ]
        show = redact.for_reader(store, who, texts)  # other tenants' jobs they name: no ids
        detail["reason"] = show(detail["reason"])
        for attempt in attempts:
            attempt["reason"] = show(attempt["reason"])
        for event in events:
            event["message"] = show(event["message"])
        detail["attempt_history"] = attempts
        detail["events"] = events
        detail["progress_history"] = [asdict(p) for p in store.progress(job_id, limit=500)]
        detail["progress_problems"] = manager.progress_problems(job_id)
        detail["estimate"] = manager.estimate(job_id, row.spec, row.progress)
        model = row.spec.get("model") or row.name
        detail["throughput"] = [  # what the job reads: its VC's, no VC's, a shared model's
            p
            for p in profile_rows(lambda vc, shared: shared or vc in ("", row.vc))
            if p["model"] == model and not p["colocated"]
        ]
        return detail

    # -- profiles: measured throughput, each VC's own, some models shared ----------------------

    def profile_rows(visible: Any) -> list[dict[str, Any]]:
        """The stored profiles `visible(vc, shared)` lets through, each with `shared`."""
        shared = {mark.model for mark in store.shared_models()}
        return [
            asdict(p) | {"shared": p.model in shared}
            for p in store.profiles()
            if visible(p.vc, p.model in shared)
        ]

    @app.get("/api/v1/profiles", tags=["cluster"], response_model=list[schemas.ProfileInfo])
    def list_profiles(who: Caller) -> list[dict[str, Any]]:
        """The throughput measured per VC, model and placement shape (steps/s), from the jobs'
        progress reports: what hetero, profile placement, ElasticFlow and job lengths use. Each
        VC's jobs read their VC's own, then a shared model's from every VC, then those of no VC
        (`vc` ""). Users see their VC's, the shared models' and those of no VC; admins all."""
        return profile_rows(
            lambda vc, shared: (
                who.admin or shared or vc == "" or (who.vc is not None and vc == who.vc)
            )
        )

    @app.get("/api/v1/profiles/shared", tags=["cluster"], response_model=list[schemas.SharedModel])
    def list_shared_models(who: Caller) -> list[dict[str, Any]]:
        """The models marked shared: every VC reads every VC's measurements of them."""
        return [asdict(mark) for mark in store.shared_models()]

    def share(who: Principal, body: dict[str, Any], shared: bool) -> dict[str, Any]:
        admins_only(who, ("mark" if shared else "unmark") + " a model shared")
        only_fields(body, ("model",))
        model = body.get("model")
        if not isinstance(model, str) or not model.strip():
            raise HTTPException(422, "model: must be a non-empty string")
        if len(model) > MAX_TEXT_CHARS or not model.isprintable():
            raise HTTPException(
                422, f"model: at most {MAX_TEXT_CHARS} characters, none of them control characters"
            )
        changed = manager.share_model(model, shared, who.user)
        return {"model": model, "shared": shared, "changed": changed}

    @app.post("/api/v1/profiles/share", tags=["cluster"], response_model=schemas.ShareAnswer)
    def share_model(who: Caller, body: Annotated[dict[str, Any], Body()]) -> dict[str, Any]:
        """Mark `{"model": M}` shared (admins only): every VC's jobs read every VC's
        measurements of M where their own VC has none. `changed`: false when it already was."""
        return share(who, body, True)

    @app.post("/api/v1/profiles/unshare", tags=["cluster"], response_model=schemas.ShareAnswer)
    def unshare_model(who: Caller, body: Annotated[dict[str, Any], Body()]) -> dict[str, Any]:
        """Unmark `{"model": M}` (admins only): each VC reads only its own measurements of M
        again (and those of no VC)."""
        return share(who, body, False)

    def acted_on(job_id: str, who: Principal, verb: str, array: bool = False) -> list[str]:
        """The job (or, with `array`, the unfinished tasks of the array it names) that the
        caller may `verb`: 404 if not visible, 403 if not theirs (nor an admin)."""
        row = visible_job(job_id, who)
        if not auth.can_act_on_job(who, row.user):
            raise HTTPException(
                403, f"job {job_id} belongs to {row.user}; only they or an admin may {verb} it"
            )
        if not array:
            return [row.id]  # "07" names job 7: use the stored id from here on
        if row.array_id != row.id:
            raise HTTPException(422, f"array: job {row.id} is not the id of a job array")
        return manager.array_members(row.id)

    @app.post("/api/v1/jobs/{job_id}/cancel", tags=["jobs"], response_model=schemas.JobSummary)
    def cancel_job(job_id: str, who: Caller, array: bool = False) -> dict[str, Any]:
        """Cancel the job; with `array=true`, every unfinished task of the array it names."""
        ids = acted_on(job_id, who, "cancel", array)
        for member in ids:
            manager.cancel(member)
        return shown(who, [summary(store.get_job(ids[0] if ids else job_id))])[0]

    def control(job_id: str, who: Caller, verb: str, array: bool) -> dict[str, Any]:
        """One job: acted on, or the ControlError's status (409). An array: each unfinished
        task it may be done to (hold: the pending ones; release: the held ones), the others
        skipped with why: `array_tasks` lists those acted on, `array_skipped` the others."""
        ids = acted_on(job_id, who, verb, array)
        act = {"hold": manager.hold, "release": manager.release, "requeue": manager.requeue}
        done: list[str] = []
        skipped: dict[str, str] = {}
        for member in ids:
            try:
                act[verb](member, who.user)
            except ControlError as error:
                if not array:
                    raise HTTPException(error.status, str(error)) from None
                skipped[member] = str(error)
            else:
                done.append(member)
        answer = shown(who, [summary(store.get_job(ids[0] if ids else job_id))])[0]
        if array:
            answer["array_tasks"] = done
            answer["array_skipped"] = skipped
        return answer

    @app.post("/api/v1/jobs/{job_id}/hold", tags=["jobs"], response_model=schemas.JobSummary)
    def hold_job(job_id: str, who: Caller, array: bool = False) -> dict[str, Any]:
        """Keep a pending job from starting until it is released (409 for a job not pending);
        with `array=true`, every pending task of the array, the running ones skipped
        (`array_tasks`: the tasks held; `array_skipped`: task -> why not)."""
        return control(job_id, who, "hold", array)

    @app.post("/api/v1/jobs/{job_id}/release", tags=["jobs"], response_model=schemas.JobSummary)
    def release_job(job_id: str, who: Caller, array: bool = False) -> dict[str, Any]:
        """Let a held job start again (409 if it is not held); with `array=true`, every held task
        of the array, the others skipped (as hold)."""
        return control(job_id, who, "release", array)

    @app.post("/api/v1/jobs/{job_id}/requeue", tags=["jobs"], response_model=schemas.JobSummary)
    def requeue_job(job_id: str, who: Caller) -> dict[str, Any]:
        """A running job is stopped and queued again (not a failure; its checkpoint kept); a
        failed or cancelled one is queued again under its id. 409 for a pending or succeeded
        job."""
        return control(job_id, who, "requeue", False)

    def bulk_control(verb: str, who: Principal, body: dict[str, Any]) -> dict[str, Any]:
        """Act on every job a filter selects, in one transaction (corral.server.bulk)."""
        try:
            chosen = parse_filter(body, who)
        except PermissionError as error:
            raise HTTPException(403, str(error)) from None
        except ValueError as error:
            raise HTTPException(422, str(error)) from None
        ids = manager.bulk(verb, chosen, who.user)
        return {"verb": verb, "count": len(ids), "ids": ids}

    @app.post("/api/v1/jobs/cancel", tags=["jobs"])
    def cancel_jobs(who: Caller, body: Annotated[dict[str, Any], Body()]) -> dict[str, Any]:
        """Cancel every unfinished job a filter selects: `{"state": "PENDING" or a list,
        "user", "vc", "name": a glob}`, at least one; users select only their own jobs. One
        transaction: `{"verb", "count", "ids"}` once it is committed."""
        return bulk_control("cancel", who, body)

    @app.post("/api/v1/jobs/hold", tags=["jobs"])
    def hold_jobs(who: Caller, body: Annotated[dict[str, Any], Body()]) -> dict[str, Any]:
        """Hold every pending job a filter selects (as POST /api/v1/jobs/cancel)."""
        return bulk_control("hold", who, body)

    @app.post("/api/v1/jobs/release", tags=["jobs"])
    def release_jobs(who: Caller, body: Annotated[dict[str, Any], Body()]) -> dict[str, Any]:
        """Release every held job a filter selects (as POST /api/v1/jobs/cancel)."""
        return bulk_control("release", who, body)

    @app.get("/api/v1/jobs/{job_id}/logs", tags=["jobs"], response_class=PlainTextResponse)
    def job_logs(
        job_id: str,
        who: Caller,
        attempt: Annotated[int | None, Query(ge=1, le=LOG_MAX_INDEX)] = None,
        rank: Annotated[int, Query(ge=0, le=LOG_MAX_INDEX)] = 0,
        stream: Annotated[str, Query(pattern="^(stdout|stderr)$")] = "stdout",
        offset: Annotated[int, Query(ge=0, le=LOG_MAX_OFFSET)] = 0,
        tail: Annotated[
            int | None,
            Query(ge=0, le=LOG_MAX_TAIL, description="the last N lines (instead of `offset`)"),
        ] = None,
    ) -> Response:
        """One worker's log from byte `offset` (at most 1 MiB), or its last `tail` lines. A line
        `[corral: N earlier bytes of this log were dropped (log cap)]` comes first when the cap
        dropped what was asked for; X-Corral-Offset is the byte offset to read on from."""
        if tail is not None and offset:
            raise HTTPException(422, "tail: give either tail or offset, not both")
        row = visible_job(job_id, who)
        job_id = row.id
        number = attempt or row.attempts
        # Over once its attempt's processes have ended (a stopped attempt may still write
        # during its grace period), or, with no attempt, once the job has.
        finished = row.status not in ("PENDING", "RUNNING")
        read = LogRead(b"", offset, 0)
        if number:
            name = f"rank-{rank}.{stream}"
            try:
                read = read_log(manager.attempt_dir(job_id, number) / name, offset, LOG_CHUNK, tail)
            except UnreadableLog as error:
                raise HTTPException(409, f"job {job_id} attempt {number}: {error}") from None
            states = {a.number: a.state for a in store.attempts(job_id)}
            if number in states:
                finished = states[number] == "ended" and (finished or number < row.attempts)
        over = finished and read.data_bytes < LOG_CHUNK
        return PlainTextResponse(
            read.text.decode("utf-8", errors="replace"),
            headers={
                "X-Corral-Offset": str(read.next_offset),
                "X-Corral-Finished": "true" if over else "false",
                "X-Corral-Attempt": str(number),
            },
        )

    app.state.log_streams = log_streams = logstream.Streams()

    def log_over(job_id: str, number: int) -> bool:
        """Whether the attempt's log is final, as `job_logs` says it; for no attempt (0),
        whether the job has one now or has ended (a stream waiting for it ends)."""
        row = store.get_job(job_id)
        if row is None:
            return True
        finished = row.status not in ("PENDING", "RUNNING")
        if not number:
            return finished or row.attempts > 0
        states = {a.number: a.state for a in store.attempts(job_id)}
        if number in states:
            return states[number] == "ended" and (finished or number < row.attempts)
        return finished

    @app.get(
        "/api/v1/jobs/{job_id}/logs/stream",
        tags=["jobs"],
        response_class=PlainTextResponse,
        responses={429: {"description": "too many log streams open for this user"}},
    )
    def job_log_stream(
        job_id: str,
        who: Caller,
        attempt: Annotated[int | None, Query(ge=1, le=LOG_MAX_INDEX)] = None,
        rank: Annotated[int, Query(ge=0, le=LOG_MAX_INDEX)] = 0,
        stream: Annotated[str, Query(pattern="^(stdout|stderr)$")] = "stdout",
        offset: Annotated[int, Query(ge=0, le=LOG_MAX_OFFSET)] = 0,
    ) -> Response:
        """One worker's log from byte `offset` as it is written (chunked, the file's bytes
        exactly), until the attempt's log is final, or for at most a minute (then read on
        from the offset reached). X-Corral-Attempt names the attempt (default: the latest; 0:
        none yet, the stream ends when one starts). It stops early where the log cap cut the
        file: the plain read (`/logs`) gives the line that says so. At most
        logstream.MAX_PER_USER streams per user at a time (429)."""
        row = visible_job(job_id, who)  # (a plain def: FastAPI runs it in a thread)
        if log_streams.count(who.user) >= logstream.MAX_PER_USER:
            raise HTTPException(
                429, f"{logstream.MAX_PER_USER} log streams open already: close one first"
            )
        number = attempt or row.attempts
        path = None
        if number:
            path = manager.attempt_dir(row.id, number) / f"rank-{rank}.{stream}"
            try:
                read_log(path, offset, 0)  # a log that is no regular file: as the plain read
            except UnreadableLog as error:
                raise HTTPException(409, f"job {row.id} attempt {number}: {error}") from None

        async def over() -> bool:
            return await run_in_threadpool(log_over, row.id, number)

        return StreamingResponse(
            logstream.follow(log_streams, who.user, path, offset, over),
            media_type="text/plain; charset=utf-8",
            headers={
                "X-Corral-Attempt": str(number),
                "X-Corral-Offset": str(offset),
                "Cache-Control": "no-store",
            },
        )

    @app.get("/api/v1/vcs", tags=["cluster"], response_model=list[schemas.VcView])
    def list_vcs(who: Caller) -> list[dict[str, Any]]:
        """Each VC (under departments: the tree, each department first; a user bound to a VC
        sees it and the departments above it)."""
        rows = manager.vc_rows()
        if who.admin or who.vc is None:
            return rows
        tree = manager.vc_tree
        mine = set(tree.chain(who.vc)) if tree is not None and who.vc in tree.queues else {who.vc}
        return [row for row in rows if row["name"] in mine]

    @app.get("/api/v1/cluster", tags=["cluster"], response_model=schemas.ClusterView)
    def cluster_view(who: Caller) -> dict[str, Any]:
        """Every node and GPU with the jobs on it: `jobs` lists each (several where shares of
        the GPU run), `share` is how much of the GPU they take, `job` the first of them."""
        holders = manager.gpu_holders()
        ids = {held.job_id for on_gpu in holders.values() for held in on_gpu}
        jobs = {row.id: row for row in store.list_jobs(ids=ids)}
        cluster = manager.cluster

        def holder_view(held: GpuHolder) -> dict[str, Any]:
            row = jobs.get(held.job_id)
            hidden = row is not None and not auth.can_read_job(who, row.user, row.vc)
            return {  # a job the caller may not see: busy, and whose VC, but not whose job
                "job": None if hidden else held.job_id,
                "job_name": row.name if row is not None and not hidden else None,
                "vc": row.vc if row is not None else None,
                "user": row.user if row is not None and not hidden else None,
                "share": held.milli / 1000,
                "stopping": held.stopping,
            }

        nodes = []
        states = {view["name"]: view for view in manager.node_views()}
        for node_index, node in enumerate(cluster.nodes):
            gpus = []
            for device, gpu in enumerate(cluster.node_gpus[node_index]):
                on_gpu = [holder_view(held) for held in holders.get(gpu, [])]
                first = on_gpu[0] if on_gpu else {}
                gpus.append(
                    {
                        "index": device,
                        "global": gpu,
                        "type": cluster.gpus[gpu].gpu_type,
                        "job": first.get("job"),
                        "job_name": first.get("job_name"),
                        "vc": first.get("vc"),
                        "user": first.get("user"),
                        "busy": bool(on_gpu),
                        "jobs": on_gpu,
                        "share": min(1.0, sum(held["share"] for held in on_gpu)),
                    }
                )
            rack = cluster.racks[cluster.node_rack[node_index]].name
            state = states.get(node.name, {})  # up, draining, drained, unhealthy, down
            nodes.append(
                {
                    "name": node.name,
                    "rack": rack,
                    "gpus": gpus,
                    "state": state.get("state", "up"),
                    "reason": state.get("reason", ""),
                }
            )
        return {
            "nodes": nodes,
            "vcs": list_vcs(who),
            "policy": manager.settings.scheduler.core.policy,
        }

    # -- nodes (corral.server.nodes) --------------------------------------------------------------

    @app.get("/api/v1/nodes", tags=["nodes"])
    def list_nodes(who: Caller) -> list[dict[str, Any]]:
        """Every node: `state` (up, draining, drained, down), `reason`, `by`, `since`, its GPUs
        (`gpus`, `gpus_used`, `gpus_free`) and the jobs on it (those the caller may see)."""
        views = manager.node_views()
        if not who.admin:
            ids = {job_id for view in views for job_id in view["jobs"]}
            rows = {row.id: row for row in store.list_jobs(ids=ids)}
            for view in views:
                view["jobs"] = [
                    job_id
                    for job_id in view["jobs"]
                    if job_id in rows and auth.can_read_job(who, rows[job_id].user, rows[job_id].vc)
                ]
        return views

    @app.post("/api/v1/nodes/{name}/drain", tags=["nodes"])
    def drain_node(
        name: str, who: Caller, body: Annotated[dict[str, Any], Body()]
    ) -> dict[str, Any]:
        """Drain the node (admins only): `{"reason": TEXT, "preempt": false}`. Nothing new
        starts on it; its jobs finish, or with `preempt` are preempted (checkpoint) and queued
        again. 404 naming the node if there is none."""
        admins_only(who, "drain a node")
        only_fields(body, ("reason", "preempt"))
        reason, preempt = body.get("reason"), body.get("preempt", False)
        if not isinstance(reason, str) or not reason.strip():
            raise HTTPException(422, "reason: must be a non-empty string")
        if len(reason) > MAX_REASON_CHARS or not reason.isprintable():
            raise HTTPException(
                422,
                f"reason: at most {MAX_REASON_CHARS} characters, none of them control characters",
            )
        if not isinstance(preempt, bool):
            raise HTTPException(422, "preempt: must be true or false")
        try:
            return manager.drain_node(name, reason.strip(), who.user, preempt=preempt)
        except ControlError as error:
            raise HTTPException(error.status, str(error)) from None

    @app.post("/api/v1/nodes/{name}/resume", tags=["nodes"])
    def resume_node(name: str, who: Caller) -> dict[str, Any]:
        """Bring a drained node back (admins only; 404 for an unknown node, 409 for one that is
        not drained)."""
        admins_only(who, "resume a node")
        try:
            return manager.resume_node(name, who.user)
        except ControlError as error:
            raise HTTPException(error.status, str(error)) from None

    # -- reservations (corral.server.reservations) ---------------------------------------------

    @app.get("/api/v1/reservations", tags=["reservations"])
    def list_reservations(who: Caller) -> list[dict[str, Any]]:
        """Every reservation: `name`, `start`, `end`, `duration` (the manager's clock,
        seconds), its GPUs (`gpus`, "node/device"), `users`, `vcs`, `state` (waiting, active,
        ended), `by`."""
        return manager.reservation_views()

    @app.post("/api/v1/reservations", status_code=201, tags=["reservations"])
    def create_reservation(who: Caller, body: Annotated[dict[str, Any], Body()]) -> dict[str, Any]:
        """Make a reservation (admins only): `{"name", "gpus": N | "nodes": [..], "start",
        "duration", "users": [..], "vcs": [..]}`. Within its window its GPUs serve only those
        users and VCs; before it, another job starts on them only if its time_limit ends by the
        window's start. 409 for a name taken or GPUs another reservation claims then."""
        admins_only(who, "make a reservation")
        only_fields(body, ("name", "gpus", "nodes", "start", "duration", "users", "vcs"))
        name = body.get("name")
        if not isinstance(name, str) or not name.strip() or not name.isprintable():
            raise HTTPException(422, "name: must be a non-empty string")
        gpus, nodes = body.get("gpus"), body.get("nodes")
        if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int)):
            raise HTTPException(422, "gpus: must be an integer")
        lists: dict[str, list[str]] = {}
        for field in ("nodes", "users", "vcs"):
            value = body.get(field) or []
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                raise HTTPException(422, f"{field}: must be a list of names")
            lists[field] = value
        if (gpus is None) == (not nodes):
            raise HTTPException(422, "gpus or nodes: give one of them")
        numbers: dict[str, float] = {}
        for field in ("start", "duration"):
            value = body.get(field)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise HTTPException(422, f"{field}: must be a number of seconds")
            numbers[field] = float(value)
        try:
            return manager.create_reservation(
                name,
                gpus=gpus,
                nodes=lists["nodes"],
                start=numbers["start"],
                duration=numbers["duration"],
                users=lists["users"],
                vcs=lists["vcs"],
                actor=who.user,
            )
        except ControlError as error:
            raise HTTPException(error.status, str(error)) from None

    @app.delete("/api/v1/reservations/{name}", tags=["reservations"])
    def delete_reservation(name: str, who: Caller) -> dict[str, Any]:
        """Delete a reservation (admins only; 404 if there is none of that name)."""
        admins_only(who, "delete a reservation")
        try:
            return manager.delete_reservation(name)
        except ControlError as error:
            raise HTTPException(error.status, str(error)) from None

    @app.get("/api/v1/config", tags=["cluster"])
    def scheduler_config(who: Caller) -> dict[str, Any]:
        """The scheduler config the manager runs with (`auto` resolved), as `corral simulate
        --scheduler-config` reads it under a `scheduler:` key."""
        return {"scheduler": manager.effective_config()}

    def token_info(row: TokenRow) -> dict[str, Any]:
        """A token as listed: never its secret (nor its full hash)."""
        return {
            "id": row.id,
            "user": row.user,
            "vc": row.vc,
            "admin": row.admin,
            "unix_user": row.unix_user,
            "name": row.name,
            "created_at": row.created_at,
            "expires_at": row.expires_at,
            "revoked_at": row.revoked_at,
            "state": auth.token_state(row),
        }

    def unknown_token(token_id: str) -> str:
        if auth.TOKEN_ID_PATTERN.fullmatch(token_id):
            return f"no token {token_id}"
        return f"no such token: an id is {TOKEN_ID_CHARS} hex digits (see corral token ls)"

    def admins_only(who: Principal, what: str) -> None:
        if not who.admin:
            raise HTTPException(403, f"only an admin may {what}")

    def only_fields(body: dict[str, Any], allowed: tuple[str, ...]) -> None:
        for key in body:
            if key not in allowed:
                shown = repr(key) if len(key) <= 40 else f"{key[:40]!r}..."
                raise HTTPException(
                    422, f"{shown}: unknown field; the fields are {', '.join(allowed)}"
                )

    @app.post("/api/v1/tokens", status_code=201, tags=["auth"])
    def create_token(who: Caller, body: Annotated[dict[str, Any], Body()]) -> dict[str, Any]:
        """A new token (admins only); its secret is in this answer and never again."""
        admins_only(who, "create tokens")
        only_fields(body, TOKEN_FIELDS)
        user = body.get("user")
        vc = body.get("vc")
        admin = body.get("admin", False)
        unix_user = body.get("unix_user")
        expires_in = body.get("expires_in_seconds")
        if not isinstance(user, str) or not user.strip():
            raise HTTPException(422, "user: must be a non-empty string")
        if vc is not None and not isinstance(vc, str):
            raise HTTPException(422, "vc: must be a string")
        if unix_user is not None and not isinstance(unix_user, str):
            raise HTTPException(422, "unix_user: must be a string")
        try:
            auth.check_name("user", user)
            if vc is not None:
                auth.check_name("vc", vc)
            if unix_user is not None:
                auth.check_unix_user(unix_user)
        except ValueError as error:
            raise HTTPException(422, str(error)) from None
        if vc is not None and vc not in manager.vc_quota:
            raise HTTPException(
                422,
                f"vc: unknown VC {vc!r}; this cluster has {', '.join(sorted(manager.vc_quota))}",
            )
        if not isinstance(admin, bool):
            raise HTTPException(422, "admin: must be true or false")
        expires_at = None
        if expires_in is not None:
            if (
                isinstance(expires_in, bool)
                or not isinstance(expires_in, int | float)
                or not 0 < expires_in <= MAX_TOKEN_LIFE_S
            ):
                raise HTTPException(
                    422,
                    f"expires_in_seconds: must be a number of seconds, more than 0 and at most "
                    f"{MAX_TOKEN_LIFE_S} (10 years)",
                )
            expires_at = time.time() + expires_in
        user = user.strip()
        try:
            token = auth.create_token(
                store, user, vc=vc, admin=admin, expires_at=expires_at, unix_user=unix_user
            )
        except ValueError as error:
            raise HTTPException(422, str(error)) from None
        # The new user's counters start at 0 now, before their first submission (/metrics).
        vcs = sorted(manager.vc_quota)
        manager.metrics.know(vcs, [(each, user) for each in vcs if vc in (None, each)])
        return {
            "token": token,
            "id": auth.token_id(token),
            "user": user,
            "vc": vc,
            "admin": admin,
            "unix_user": unix_user,
            "expires_at": expires_at,
        }

    @app.get("/api/v1/tokens", tags=["auth"])
    def list_tokens(who: Caller) -> list[dict[str, Any]]:
        """Every token, oldest first (admins only): id, user, vc, admin, unix_user, name,
        created_at, expires_at, revoked_at, state (active, expired, revoked); never secrets."""
        admins_only(who, "list tokens")
        return [token_info(row) for row in store.list_tokens()]

    @app.delete("/api/v1/tokens/{token_id}", tags=["auth"])
    def revoke_token(token_id: str, who: Caller) -> dict[str, Any]:
        """Revoke one token by its id (admins only): refused from now on. Revoking a revoked
        token changes nothing."""
        admins_only(who, "revoke tokens")
        row = auth.revoke_token(store, token_id)
        if row is None:
            raise HTTPException(404, unknown_token(token_id))
        return token_info(row)

    @app.post("/api/v1/tokens/revoke", tags=["auth"])
    def revoke_tokens(who: Caller, body: Annotated[dict[str, Any], Body()]) -> dict[str, Any]:
        """Revoke every token of `{"user": U}` (admins only): `{revoked: [the tokens revoked
        now]}` (empty when the user has none left to revoke)."""
        admins_only(who, "revoke tokens")
        only_fields(body, ("user",))
        user = body.get("user")
        if not isinstance(user, str) or not user.strip():
            raise HTTPException(422, "user: must be a non-empty string")
        try:
            auth.check_name("user", user)
        except ValueError as error:
            raise HTTPException(422, str(error)) from None
        return {"revoked": [token_info(row) for row in auth.revoke_user(store, user.strip())]}

    @app.get("/api/v1/export", tags=["jobs"])
    def export_history(
        who: Caller,
        name: Annotated[
            str,
            Query(
                max_length=200,
                pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*(\.corral\.jsonl|\.csv)$",
                description="the trace's file name: NAME.corral.jsonl or NAME.csv (Helios)",
            ),
        ],
    ) -> dict[str, Any]:
        """The job history as `corral export-trace` writes it (admins only): `files` maps each
        file's name (the trace, and beside it the throughputs, decisions and scheduler config)
        to its text, with the counts written and left out."""
        admins_only(who, "export the job history")
        return export_files(store, name)

    @app.get("/api/v1/whoami", tags=["auth"])
    def whoami(who: Caller) -> dict[str, Any]:
        return {"user": who.user, "vc": who.vc, "admin": who.admin}

    @app.get("/api/v1/usage", tags=["cluster"])
    def usage(
        who: Caller,
        since: Annotated[float, Query(description="the period's start, epoch seconds")],
        until: Annotated[
            float | None, Query(description="the period's end (excluded), epoch seconds; now")
        ] = None,
        by: Annotated[str, Query(description="user or vc")] = "user",
    ) -> dict[str, Any]:
        """GPU-hours, jobs submitted and ended, and queueing per user or VC in [since, until),
        and their total. Admins see everyone; users their own jobs and their VC's."""
        now = manager.clock()
        try:
            return usage_report(
                store, since, now if until is None else until, by, now, auth.visible_to(who)
            )
        except ValueError as error:
            raise HTTPException(422, str(error)) from None

    @app.get("/metrics", include_in_schema=False)
    def metrics(request: Request) -> Response:
        """Prometheus's text format, for the metrics token (`corral up --metrics-token-file`,
        by default DATA_DIR/metrics.token) or an admin's token: the per-job gauges name every
        user's jobs. `--metrics-public`: for anyone."""
        settings = manager.settings
        if not settings.metrics_public:
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            token = token.strip() if scheme.lower() == "bearer" else ""
            digest = settings.metrics_token_sha256
            if not (token and digest is not None and auth.matches_secret(token, digest)):
                who = auth.verify(store, token)
                if who is None:
                    raise HTTPException(
                        401,
                        "a token is needed for /metrics: Authorization: Bearer TOKEN (the "
                        "metrics token file of corral up, or an admin's token)",
                        headers={"WWW-Authenticate": "Bearer"},
                    )
                if not who.admin:
                    raise HTTPException(
                        403, "only the metrics token or an admin's token may read /metrics"
                    )
        body, content_type = metrics_text(manager)
        return Response(body, media_type=content_type)

    @app.exception_handler(HTTPException)
    def http_error(request: Request, error: HTTPException) -> JSONResponse:
        detail = one_line(error.detail) if isinstance(error.detail, str) else error.detail
        return JSONResponse(
            {"detail": detail}, status_code=error.status_code, headers=error.headers
        )

    @app.exception_handler(RequestValidationError)
    def invalid_request(request: Request, error: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": schemas.validation_error(error)}, status_code=422)

    @app.exception_handler(StoreUnavailable)
    def store_unavailable(request: Request, error: StoreUnavailable) -> JSONResponse:
        manager.note_outage(f"{request.method} {request.url.path}: {error}")
        return JSONResponse(
            {"detail": STORE_UNAVAILABLE},
            status_code=503,
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )

    @app.exception_handler(Exception)
    def internal_error(request: Request, error: Exception) -> JSONResponse:
        # (Starlette logs the traceback after this answer)
        return JSONResponse(
            {"detail": "internal error: the manager's log has the details"}, status_code=500
        )

    add_liveness_routes(app, manager)  # /healthz, /readyz (corral.server.liveness)
    # First, so that it takes POST /api/v1/jobs before `submit_job` (other methods go on).
    app.router.routes.insert(
        0, Route("/api/v1/jobs", submit_job_lean, methods=["POST"], include_in_schema=False)
    )
    _document_spec_body(app, spec_schema)
    static = StaticFiles(directory=WEB_DIR, html=True) if WEB_DIR.is_dir() else None
    app.mount("/", limits.ApiFallback(app, static), name="dashboard")  # last: what no route took
    return app


def export_files(store: Any, name: str) -> dict[str, Any]:
    """Export the history into a temporary directory as `name`; read the files back."""
    import tempfile

    from corral.server.export import export_config, export_corral, export_trace

    with tempfile.TemporaryDirectory(prefix="corral-export-") as directory:
        out = Path(directory) / name
        counts: dict[str, Any]
        if name.endswith(".csv"):
            written, skipped = export_trace(store, out)
            counts = {"format": "helios", "written": written, "never_ran": skipped}
        else:
            done = export_corral(store, out)
            counts = {
                "format": "corral",
                "written": done.written,
                "nodes": done.nodes,
                "never_ran": done.never_ran,
                "unfinished": done.unfinished,
                "no_work": done.no_work,
            }
        export_config(store, out)
        files = {path.name: path.read_text() for path in sorted(Path(directory).iterdir())}
    return counts | {"files": files}


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
        app.openapi_schema = schemas.document_errors(schema)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
