"""The crash-safety promise under load: kill -9 of `corral up` during a burst of submissions
loses no accepted submission, stores none twice and runs no job twice. Exits 1 if it finds one.

Starts a real `corral up` (4 declared GPUs, single-user, 127.0.0.1, a temporary data directory;
SQLite, or `--db postgres`: a throwaway PostgreSQL server started with the system's binaries, as
tests/server/postgres.py does). CLIENTS threads each submit JOBS jobs named `c{client}-{i}` through
plain HTTP (httpx, the admin token), as fast as the manager answers:

- 201: accepted;
- the connection refused before anything was sent (the manager is down): retried after a short
  pause, until accepted;
- 503 (the store unavailable): retried after its Retry-After;
- the connection broken after the request was sent, with no answer: ambiguous, never retried
  (it may or may not be stored; the check counts which);
- any other answer: refused (counted, not retried).

Meanwhile the manager is killed with SIGKILL KILLS times, after every JOBS x CLIENTS / (KILLS + 1)
accepted submissions (give or take a quarter of that, and then 0 to `--kill-jitter-ms` later,
both drawn from `--seed`), and started again each time on the same data directory and database.
Each job needs 1 GPU (of 4: jobs run while submissions go on) and appends `start N` and, after
`--job-seconds`, `end N` (N its attempt) to `$CORRAL_CHECKPOINT_DIR/runs`, a file per job kept
across attempts, so jobs start, end and are found again across the kills. Before the burst,
`--gated` jobs (`gated-{i}`) are started that wait for the burst to end: each restart must find
them running (one attempt each), not start them again. Once every stored job has ended, it checks
and prints:

- lost: accepted names not stored, or whose accepted id is not theirs (must be 0);
- doubled: names stored more than once (must be 0);
- ambiguous submissions, and how many of them were stored;
- ran twice: jobs whose command ran to its end more than once, that started more than once
  although their first attempt succeeded, or that ran in an attempt the manager recorded as never
  started (must be 0); a run that started but did not end (killed half-way, then retried) is
  allowed and counted;
- the jobs by final status, the attempts by outcome, the kills, wall time and submissions/s.

Run from the repository root (PostgreSQL needs its server package, `apt-get install -y
postgresql`, and root, which runs it as the `postgres` user):

    .venv/bin/python scripts/kill9_burst.py [--db sqlite|postgres] [--clients 4] [--jobs 300]
        [--kills 5] [--seed 1] [--kill-jitter-ms 50] [--gated 2] [--job-seconds 0.2]
        [--drain-timeout 1800] [--keep]
"""

from __future__ import annotations

import argparse
import collections
import random
import re
import shlex
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.server import postgres  # noqa: E402
from tests.server.helpers import Corral, admin_token, kill_jobs_of  # noqa: E402

#: Seconds a client waits between tries while the manager is down.
RETRY_PAUSE_S = 0.05
#: Seconds a client keeps trying one submission before it gives up (the manager did not come back).
GIVE_UP_S = 600.0
#: `corral up` tries on a PostgreSQL database whose previous manager's claim is not yet released
#: (its server notices the killed client's connection closed a moment later).
CLAIM_TRIES = 100


def job_command(seconds: float, gate: Path | None = None) -> list[str]:
    """A job that records its start and its end in its checkpoint directory's `runs` file; in
    between it sleeps `seconds`, or, with `gate`, waits until that file exists."""
    runs = '"$CORRAL_CHECKPOINT_DIR/runs"'
    if gate is not None:
        pause = f"while [ ! -e {shlex.quote(str(gate))} ]; do sleep 0.1; done; "
    else:
        pause = f"sleep {seconds}; " if seconds > 0 else ""
    script = f'echo "start $CORRAL_ATTEMPT" >> {runs}; {pause}echo "end $CORRAL_ATTEMPT" >> {runs}'
    return ["/bin/sh", "-c", script]


@dataclass
class Tally:
    """What the clients saw, shared between their threads (under `lock`)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    changed: threading.Condition = field(init=False)
    accepted: dict[str, str] = field(default_factory=dict)  # name -> id answered
    ambiguous: list[tuple[str, str]] = field(default_factory=list)  # (name, the error)
    refused: list[tuple[str, int, str]] = field(default_factory=list)  # (name, status, detail)
    refused_connections: int = 0
    unavailable: int = 0  # 503s
    first_sent: float | None = None
    last_answer: float | None = None

    def __post_init__(self) -> None:
        self.changed = threading.Condition(self.lock)


def submit_all(
    client: int,
    count: int,
    url: str,
    token: str,
    seconds: float,
    tally: Tally,
    abort: threading.Event,
) -> None:
    """One client's burst: `count` submissions, each until it is answered (see the docstring)."""
    command = job_command(seconds)
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
        for index in range(count):
            name = f"c{client}-{index}"
            body = {"name": name, "gpus": 1, "command": command}
            began = time.monotonic()
            while not abort.is_set():
                if time.monotonic() - began > GIVE_UP_S:
                    abort.set()
                    raise RuntimeError(f"{name}: no answer for {GIVE_UP_S:.0f} s")
                with tally.lock:
                    if tally.first_sent is None:
                        tally.first_sent = time.monotonic()
                try:
                    response = http.post("/api/v1/jobs", json=body)
                except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout):
                    # Nothing was sent: the manager is down (or not yet listening). Try again.
                    with tally.lock:
                        tally.refused_connections += 1
                    time.sleep(RETRY_PAUSE_S)
                    continue
                except httpx.TransportError as error:  # sent, or partly sent, and no answer
                    with tally.changed:
                        tally.ambiguous.append((name, f"{type(error).__name__}: {error}"))
                        tally.last_answer = time.monotonic()
                    break
                if response.status_code == 503:
                    with tally.lock:
                        tally.unavailable += 1
                    try:
                        pause = float(response.headers.get("Retry-After", "1"))
                    except ValueError:
                        pause = 1.0
                    time.sleep(min(max(pause, RETRY_PAUSE_S), 30.0))
                    continue
                with tally.changed:
                    tally.last_answer = time.monotonic()
                    if response.status_code == 201:
                        tally.accepted[name] = str(response.json()["id"])
                        tally.changed.notify_all()
                    else:
                        tally.refused.append((name, response.status_code, response.text[:300]))
                break


def start_manager(corral: Corral) -> int:
    """Start `corral up` and wait until it answers; returns how many starts were refused first
    because the database was still claimed (PostgreSQL: the killed manager's connection)."""
    for refused in range(CLAIM_TRIES):
        try:
            corral.start().close()
            return refused
        except AssertionError as error:
            if "another corral manager is using this database" not in str(error):
                raise
            time.sleep(0.1)  # the server has not yet dropped the killed manager's connection
    raise RuntimeError(f"corral up: its database stayed claimed for {CLAIM_TRIES} tries")


@dataclass
class Kill:
    accepted: int  # accepted submissions when it was killed
    at_s: float  # seconds since the burst began
    down_s: float  # from the kill until the manager answered again
    claimed: int  # starts refused meanwhile: the database still claimed by the killed manager


def kill_during_burst(
    corral: Corral,
    thresholds: list[tuple[int, float]],
    tally: Tally,
    clients: list[threading.Thread],
    began: float,
    kills: list[Kill],
    abort: threading.Event,
    failure: list[BaseException],
) -> None:
    """SIGKILL the manager once the accepted count reaches each threshold; restart it each time."""
    try:
        for threshold, delay in thresholds:
            with tally.changed:
                while len(tally.accepted) < threshold and not abort.is_set():
                    if not any(t.is_alive() for t in clients):
                        return  # the burst ended first
                    tally.changed.wait(timeout=0.5)
                accepted = len(tally.accepted)
            if abort.is_set():
                return
            # Not always just after an answer: a commit may be half-way, or stored but unanswered.
            time.sleep(delay)
            killed_at = time.monotonic()
            corral.kill()
            claimed = start_manager(corral)
            kills.append(Kill(accepted, killed_at - began, time.monotonic() - killed_at, claimed))
            print(
                f"  kill {len(kills)}: after {accepted:,} accepted, at {killed_at - began:.1f} s;"
                f" answering again {kills[-1].down_s:.1f} s later"
                + (f" ({claimed} starts refused: database still claimed)" if claimed else ""),
                flush=True,
            )
    except BaseException as error:
        failure.append(error)
        abort.set()


def all_jobs(http: httpx.Client, status: str | None = None) -> list[dict[str, Any]]:
    """Every job's summary (following the listing's pages)."""
    jobs: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": 10_000}
    if status is not None:
        params["status"] = status
    while True:
        response = http.get("/api/v1/jobs", params=params)
        response.raise_for_status()
        jobs += response.json()
        following = response.headers.get("X-Corral-Next-Before-Id")
        if following is None:
            return jobs
        params["before_id"] = following


def start_gated(url: str, token: str, count: int, gate: Path) -> dict[str, str]:
    """Submit `count` jobs that run until `gate` exists, and wait until they run: they live
    through every kill, so each restart must find them running rather than start them again."""
    headers = {"Authorization": f"Bearer {token}"}
    gated: dict[str, str] = {}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
        for index in range(count):
            name = f"gated-{index}"
            body = {"name": name, "gpus": 1, "command": job_command(0, gate)}
            response = http.post("/api/v1/jobs", json=body)
            if response.status_code != 201:
                raise RuntimeError(f"{name}: {response.status_code} {response.text}")
            gated[name] = str(response.json()["id"])
        deadline = time.monotonic() + 300
        while len(all_jobs(http, "RUNNING")) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {count} gated jobs did not all start within 300 s")
            time.sleep(0.1)
    return gated


def wait_until_ended(http: httpx.Client, timeout: float) -> float:
    """Poll until no stored job is pending or running; returns the seconds it took."""
    began = time.monotonic()
    deadline = began + timeout
    last_print = 0.0
    while True:
        pending = len(all_jobs(http, "PENDING"))
        running = len(all_jobs(http, "RUNNING"))
        now = time.monotonic()
        if pending + running == 0:
            return now - began
        if now > deadline:
            raise RuntimeError(f"after {timeout:.0f} s, {pending} jobs pending, {running} running")
        if now - last_print >= 10:
            print(f"  {now - began:5.0f} s: {pending:,} pending, {running:,} running", flush=True)
            last_print = now
        time.sleep(1.0)


def runs_of(data_dir: Path, job_id: str) -> list[tuple[str, int]]:
    """The job's `runs` file: [(start or end, attempt)]."""
    path = data_dir / "jobs" / job_id / "checkpoint" / "runs"
    if not path.is_file():
        return []
    lines = []
    for line in path.read_text().splitlines():
        kind, _, attempt = line.partition(" ")
        lines.append((kind, int(attempt) if attempt.isdigit() else 0))
    return lines


def evidence(http: httpx.Client, data_dir: Path, job_id: str) -> str:
    """A job's attempts, events and runs file, for the report of a failure."""
    job = http.get(f"/api/v1/jobs/{job_id}").json()
    lines = [f"  job {job_id} {job['name']}: {job['status']}, {job['attempts']} attempt(s)"]
    for attempt in job["attempt_history"]:
        lines.append(
            f"    attempt {attempt['number']}: {attempt['state']} {attempt['outcome']}"
            f" exit {attempt['exit_code']} started {attempt['started_at']}"
            f" ended {attempt['ended_at']} ({attempt['reason']})"
        )
    for event in job["events"]:
        lines.append(f"    event {event['at']:.3f} {event['kind']}: {event['message']}")
    lines.append(f"    runs: {runs_of(data_dir, job_id)}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--clients", type=int, default=4, help="concurrent client threads")
    parser.add_argument("--jobs", type=int, default=300, help="submissions per client")
    parser.add_argument("--kills", type=int, default=5, help="SIGKILLs during the burst")
    parser.add_argument("--seed", type=int, default=1, help="of the kills' jitter")
    parser.add_argument(
        "--kill-jitter-ms", type=float, default=50, help="most delay of a kill after its count"
    )
    parser.add_argument(
        "--gated", type=int, default=2, help="jobs that run from before the burst to its end"
    )
    parser.add_argument("--job-seconds", type=float, default=0.2, help="each job's run time")
    parser.add_argument("--drain-timeout", type=float, default=1800, help="seconds for the jobs")
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    args = parser.parse_args()

    total = args.clients * args.jobs
    rng = random.Random(args.seed)
    step = total / (args.kills + 1)
    thresholds = [
        (
            round(k * step + rng.uniform(-step / 4, step / 4)),
            rng.uniform(0, args.kill_jitter_ms) / 1000,
        )
        for k in range(1, args.kills + 1)
    ]
    tmp = Path(tempfile.mkdtemp(prefix="corral-burst-"))
    data_dir = tmp / "corral"
    data_dir.mkdir()
    server: postgres.PostgresServer | None = None
    corral: Corral | None = None
    try:
        up_args = ["--gpus", "4"]
        if args.db == "postgres":
            server = postgres.start_server()
            up_args += ["--db", server.fresh_database()]
        corral = Corral(data_dir, *up_args)
        print(
            f"corral up: 4 GPUs, {args.db}, {corral.url}; {args.clients} clients x {args.jobs:,}"
            f" submissions, {args.kills} kills after {', '.join(str(t) for t, _ in thresholds)}"
            f" accepted (+0-{args.kill_jitter_ms:.0f} ms);"
            f" jobs of {args.job_seconds} s",
            flush=True,
        )
        start_manager(corral)
        token = admin_token(data_dir)

        gate = tmp / "burst-over"
        gated = start_gated(corral.url, token, args.gated, gate)
        tally = Tally()

        abort = threading.Event()
        clients = [
            threading.Thread(
                target=submit_all,
                args=(c, args.jobs, corral.url, token, args.job_seconds, tally, abort),
                name=f"client-{c}",
                daemon=True,  # an interrupted run ends without them
            )
            for c in range(args.clients)
        ]
        kills: list[Kill] = []
        failure: list[BaseException] = []
        began = time.monotonic()
        killer = threading.Thread(
            target=kill_during_burst,
            args=(corral, thresholds, tally, clients, began, kills, abort, failure),
            name="killer",
            daemon=True,
        )
        for thread in clients:
            thread.start()
        killer.start()
        for thread in clients:
            thread.join()
        killer.join()
        gate.touch()  # the gated jobs end
        if failure:
            raise failure[0]
        if abort.is_set():
            raise RuntimeError("the burst was abandoned (a client got no answer)")
        assert tally.first_sent is not None and tally.last_answer is not None
        burst_s = tally.last_answer - tally.first_sent
        up_s = max(burst_s - sum(k.down_s for k in kills), 1e-3)
        answered = len(tally.accepted) + len(tally.ambiguous) + len(tally.refused)
        print(
            f"burst: {answered:,} submissions answered or abandoned in {burst_s:.1f} s"
            f" ({len(tally.accepted) / burst_s:,.0f} accepted/s, restarts included)",
            flush=True,
        )

        print("waiting for every stored job to end:", flush=True)
        http = httpx.Client(
            base_url=corral.url, headers={"Authorization": f"Bearer {token}"}, timeout=60
        )
        with http:
            drain_s = wait_until_ended(http, args.drain_timeout)
            jobs = all_jobs(http)
            details = {str(job["id"]): http.get(f"/api/v1/jobs/{job['id']}").json() for job in jobs}

            by_name: dict[str, list[str]] = collections.defaultdict(list)
            for job in jobs:
                by_name[job["name"]].append(str(job["id"]))
            names_of = {str(job["id"]): job["name"] for job in jobs}
            lost = sorted(
                name
                for name, job_id in (tally.accepted | gated).items()
                if name not in by_name or names_of.get(job_id) != name
            )
            doubled = sorted(name for name, ids in by_name.items() if len(ids) > 1)
            ambiguous_stored = [name for name, _ in tally.ambiguous if name in by_name]
            refused_stored = [name for name, _, _ in tally.refused if name in by_name]
            sent = set(tally.accepted) | set(gated) | {n for n, _ in tally.ambiguous}
            sent |= {n for n, _, _ in tally.refused}
            unexpected = sorted(set(by_name) - sent)

            ran_twice: list[str] = []
            half_runs = 0
            hidden_runs = 0  # runs of attempts the manager recorded as never started
            never_ran: list[str] = []
            outcomes: collections.Counter[str] = collections.Counter()
            recovered: collections.Counter[str] = collections.Counter()
            for job_id, job in details.items():
                history = job["attempt_history"]
                for attempt in history:
                    outcome = attempt["outcome"] or attempt["state"]
                    if attempt["reason"] == "never started":
                        outcome += " (never started)"
                    outcomes[outcome] += 1
                for event in job["events"]:
                    if event["kind"] == "recovered":
                        recovered[re.sub(r"\d+", "N", event["message"])] += 1
                runs = runs_of(data_dir, job_id)
                starts = [n for kind, n in runs if kind == "start"]
                ends = [n for kind, n in runs if kind == "end"]
                half_runs += max(0, len(starts) - len(ends))
                unstarted = {a["number"] for a in history if a["reason"] == "never started"}
                hidden = sum(1 for n in starts if n in unstarted)
                hidden_runs += hidden
                first_succeeded = bool(history) and history[0]["outcome"] == "succeeded"
                if len(ends) > 1 or (len(starts) > 1 and first_succeeded) or hidden:
                    ran_twice.append(job_id)
                if job["status"] == "SUCCEEDED" and not ends:
                    never_ran.append(job_id)
            statuses = collections.Counter(job["status"] for job in jobs)

            ambiguous_count = len(tally.ambiguous)
            print(
                f"\nresult ({args.db}; {args.clients} clients x {args.jobs:,} submissions,"
                f" {len(kills)} kills, seed {args.seed}, jobs of {args.job_seconds} s):"
            )
            print(f"  submissions accepted (201): {len(tally.accepted):,} (and {len(gated)} gated)")
            print(
                f"  ambiguous (sent, no answer): {ambiguous_count}, of which stored"
                f" {len(ambiguous_stored)}, not stored {ambiguous_count - len(ambiguous_stored)}"
            )
            print(
                f"  refused: {len(tally.refused)} (stored {len(refused_stored)});"
                f" 503 answers retried: {tally.unavailable};"
                f" connections refused and retried: {tally.refused_connections:,}"
            )
            print(f"  jobs stored: {len(jobs):,} ({len(by_name):,} names)")
            print(f"  lost: {len(lost)}")
            print(f"  doubled: {len(doubled)}")
            print(f"  ran twice: {len(ran_twice)}")
            print(
                f"  succeeded without a run: {len(never_ran)}; runs cut half-way: {half_runs};"
                f" runs of attempts recorded as never started: {hidden_runs}"
            )
            print(f"  stored but never sent: {len(unexpected)}")
            print(
                "  jobs by status: "
                + ", ".join(f"{status} {count:,}" for status, count in sorted(statuses.items()))
            )
            print(
                "  attempts by outcome: "
                + ", ".join(f"{outcome} {count:,}" for outcome, count in sorted(outcomes.items()))
            )
            print(
                "  recovered after a kill: "
                + (", ".join(f"{m!r} {n:,}" for m, n in sorted(recovered.items())) or "none")
            )
            for name, job_id in gated.items():
                job = details[job_id]
                found = sum(1 for e in job["events"] if e["message"].endswith("found running"))
                print(
                    f"  {name} (job {job_id}, running through the burst): {job['status']},"
                    f" {job['attempts']} attempt(s), found running after {found} of"
                    f" {len(kills)} kills, runs {runs_of(data_dir, job_id)}"
                )
            print(
                "  kills: "
                + "; ".join(
                    f"after {k.accepted:,} accepted at {k.at_s:.1f} s, down {k.down_s:.1f} s"
                    + (f" ({k.claimed} starts refused: still claimed)" if k.claimed else "")
                    for k in kills
                )
            )
            print(
                f"  wall time: burst {burst_s:.1f} s ({len(tally.accepted) / burst_s:,.0f}"
                f" submissions/s accepted; {len(tally.accepted) / up_s:,.0f}/s over the"
                f" {up_s:.1f} s the manager was up), then {drain_s:.1f} s until every job ended"
            )
            for name, error in tally.ambiguous:
                print(
                    f"  ambiguous {name}: {'stored' if name in by_name else 'not stored'} ({error})"
                )
            for name, status, detail in tally.refused[:20]:
                print(f"  refused {name}: {status} {detail}")

            ran_twice.sort(key=int)
            failed = bool(lost or doubled or ran_twice)
            if lost:
                print(f"LOST: {', '.join(lost)}")
            if doubled:
                print(f"DOUBLED: {', '.join(doubled)}")
                for name in doubled:
                    for job_id in by_name[name]:
                        print(evidence(http, data_dir, job_id))
            if ran_twice:
                print(f"RAN TWICE: {', '.join(ran_twice)}")
                for job_id in ran_twice:
                    print(evidence(http, data_dir, job_id))
            for job_id in never_ran + [by_name[n][0] for n in unexpected]:
                print(evidence(http, data_dir, job_id))
        print("FAIL" if failed else "OK: 0 lost, 0 doubled, 0 ran twice")
        return 1 if failed else 0
    finally:
        try:
            if corral is not None:
                corral.stop()
        finally:
            try:
                kill_jobs_of(data_dir)
            finally:
                try:
                    if server is not None:
                        server.stop()
                finally:
                    if args.keep:
                        print(f"kept {tmp}")
                    else:
                        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
