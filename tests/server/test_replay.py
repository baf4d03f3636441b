"""A live manager's history, exported by `corral export-trace` and replayed by `corral simulate`,
gives the same decisions: the same jobs started on the same GPUs and preempted by the same jobs,
at the same instants, and every job ends when it ended live.

The live side is a `Manager` on a fake clock over three nodes of two GPU types (a1: 4 x a100,
a2: 2 x a100, v1: 4 x v100) with `PacedExecutor` (tests/server/inert.py): each job needs a number
of training steps and makes them at its model's rate on the GPU type it got (resnet 8 steps/s per
a100, 4 per v100; bert 4 and 1), restores for `restore_s` on every resume, and reports its steps
to its progress file, from which the manager's telemetry measures the throughputs it stores. The
scheduler is LAS (preempting within a queue too) with a 64 GPU-s queue boundary and `consolidate`: nine jobs of 1 to 4 GPUs
preempt each other at queue crossings, resume on the other GPU type (a bert job at a quarter of
its speed on v100, then at full speed on a100), one only runs on v100, one is cancelled while it
runs. The replay's speeds come from the throughputs the export writes, through the live
manager's own `Profiles.speed_model`; replayed at speed 1 everywhere (a table with nothing in
it), the decisions differ.

What may legitimately differ, and how this scenario makes it equal:

* The clock: the manager's (epoch seconds; here a fake clock from 1000) against the replay's,
  which starts at the first job's submission. The export counts every time from that instant
  (the trace's `time_origin`), its decision log included.
* When a round runs: the live control loop decides once per pass, over everything that happened
  since the last; the simulator once per instant where something happens. The test steps the
  manager at exactly those instants (an arrival, an attempt's end, the core's next timer, the
  cancel) and steps again while it decides.
* Draining: live, a start on GPUs that a preempted job holds waits until that job's processes
  have exited (its grace period); the simulator starts it at once. The paced executor's stopped
  attempts exit at once, and the next step, at the same instant, records the start. For the
  same reason, records of one instant are compared in one order (preemptions first, then by job):
  live, a start is recorded when its GPUs have drained, not in the round's order.
* Restores: both stall a resumed job `restore_s`; the paced job takes exactly that long.
* Speeds: the export and the replay compute every job's work and speed from the same final
  profiles. The store starts with each model's 1-GPU rate on each GPU type (an earlier period of
  the cluster measured them) and the jobs report the same rates, so no speed the manager used
  changes as it measures, and every rate is a power of two: floating-point arithmetic is exact,
  and events that coincide live coincide in the replay.

Not replayed (docs/server.md, export-trace): a job cancelled while it waits after it ran (the
replay ends it when it was stopped), the user's estimates live srtf orders by, the nodes the
manager saw join or leave (drains are replayed: tests/server/test_nodes_replay.py).
The last test below replays a run with real processes and the real clock.
"""

from __future__ import annotations

import csv
import json
import shlex
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from corral.cli.main import app
from corral.core.cluster import Cluster, NodeDef
from corral.core.framework import config_from_mapping
from corral.core.job import JobSpec
from corral.core.profiles import Measure, Profiles
from corral.exec.local import AttemptLaunch
from corral.server.export import job_work
from corral.server.manager import Manager, ManagerSettings
from corral.server.spec import parse_job_spec
from corral.server.store import AttemptRow, JobRow, ProfileRow, Store
from corral.server.telemetry import stored_profiles
from tests.server.inert import Clock, PacedExecutor

NODES = [
    NodeDef("a1", 4, "a100", "r0"),
    NodeDef("a2", 2, "a100", "r0"),
    NodeDef("v1", 4, "v100", "r1"),
]
TYPE_OF = {node.name: node.gpu_type for node in NODES}
#: Steps/s per GPU of each model on each type (a job on n GPUs of one type makes n times it).
RATE = {"resnet": {"a100": 8.0, "v100": 4.0}, "bert": {"a100": 4.0, "v100": 1.0}}
RESTORE_S = 4.0
SCHEDULER = {
    "policy": "las",
    "placement": "consolidate",
    "restore_s": RESTORE_S,
    # LAS's earlier rule (a waiting job preempts running jobs of its own queue too): the
    # scenario below was worked out with it, and it makes more preemptions to replay
    "las": {"thresholds_gpu_s": [64.0], "preempt_within_queue": True},
}
#: (seconds after the first, name, model, GPUs, steps, other spec fields)
JOBS = [
    (0.0, "r4", "resnet", 4, 3200, {}),
    (0.0, "b2", "bert", 2, 1024, {}),
    (2.0, "b4v", "bert", 4, 512, {"gpu_type": "v100"}),
    (5.0, "r2", "resnet", 2, 2048, {}),
    (12.0, "b4", "bert", 4, 2048, {}),
    (20.0, "r1", "resnet", 1, 640, {}),
    (26.0, "b1", "bert", 1, 256, {}),
    (40.0, "r4b", "resnet", 4, 1536, {}),
    (44.0, "r2b", "resnet", 2, 768, {}),
]
CANCEL = (60.0, "r1")  # while it runs
ORIGIN = 1000.0


@dataclass
class LiveRun:
    data_dir: Path
    store: Store
    executor: PacedExecutor
    ids: dict[str, str]  # job name -> id
    gpus: dict[str, int]  # job id -> GPUs


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveRun]:
    """The scenario run to its end on the live manager."""
    data_dir = tmp_path_factory.mktemp("live")
    store = Store(Store.sqlite_url(data_dir))
    manager = None
    try:
        for model, rates in RATE.items():
            for gpu_type, rate in rates.items():
                store.save_profile(ProfileRow(model, gpu_type, 1, 1, "", rate, None, 60.0, 1, 0.0))
        clock = Clock(ORIGIN)
        steps: dict[str, float] = {}
        models: dict[str, str] = {}
        gpus: dict[str, int] = {}

        def rate(launch: AttemptLaunch) -> float:
            gpu_type = TYPE_OF[launch.workers[0].node]
            return RATE[models[launch.job_id]][gpu_type] * gpus[launch.job_id]

        executor = PacedExecutor(clock, steps, rate, RESTORE_S)
        settings = ManagerSettings(scheduler=config_from_mapping(SCHEDULER))
        manager = Manager(
            store, executor, Cluster.from_nodes(NODES), data_dir, settings=settings, clock=clock
        )
        ids: dict[str, str] = {}
        events: list[tuple[float, Callable[[], None]]] = []
        for at, name, model, count, total, extra in JOBS:

            def arrive(
                name: str = name,
                model: str = model,
                count: int = count,
                total: float = total,
                extra: dict[str, Any] = extra,
            ) -> None:
                spec = {"name": name, "command": "true", "gpus": count, "model": model, **extra}
                job_id = manager.submit(parse_job_spec(spec), "alice").id
                ids[name], steps[job_id], models[job_id], gpus[job_id] = job_id, total, model, count

            events.append((ORIGIN + at, arrive))
        events.append((ORIGIN + CANCEL[0], lambda: manager.cancel(ids[CANCEL[1]])))
        drive(manager, clock, executor, events)
        yield LiveRun(data_dir, store, executor, ids, gpus)
    finally:
        if manager is not None:
            manager.stop()
        store.close()


@pytest.fixture(scope="module")
def exported(live: LiveRun, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """`corral export-trace` of the live run: the trace, and the replay command it printed."""
    out, printed = export_trace(live.data_dir, tmp_path_factory)
    assert "wrote 9 jobs and 3 nodes" in printed
    command = printed.split("replay with: ", 1)[1]
    assert command.startswith("corral simulate --trace corral:")
    return out, command


def drive(manager: Any, clock: Any, executor: Any, events: list[tuple[float, Any]]) -> None:
    """Run `manager` on a hand-moved clock until every job has ended: each event (an instant,
    a call: a submission, a node change) is made at its instant, in the list's order within one
    instant; the clock moves to the next event, attempt end or round, whichever comes first."""
    pending = sorted(events, key=lambda event: event[0])  # stable: ties keep the list's order
    for _ in range(1000):
        while pending and pending[0][0] <= clock.now:
            pending.pop(0)[1]()
        for _ in range(10):  # again while it decides: a start waits for its GPUs to drain
            if not manager.step():
                break
        counts = manager.store.job_counts()
        if not pending and not counts.get("PENDING") and not counts.get("RUNNING"):
            return
        upcoming = [
            pending[0][0] if pending else None,
            executor.next_end(),
            manager.next_round_at(),
        ]
        clock.now = min(at for at in upcoming if at is not None and at > clock.now)
    pytest.fail("the live run did not end")


def export_trace(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """`corral export-trace` of a manager's data directory: the trace, and what it printed (on
    one line)."""
    out = tmp_path_factory.mktemp("export") / "history.corral.jsonl"
    result = CliRunner().invoke(
        app, ["export-trace", "--data-dir", str(data_dir), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    return out, " ".join(result.output.split())


def replay(command: str, out: Path, *more: str, run: str = "las-consolidate") -> list[str]:
    """Run the printed command (plus `more`); the lines of its decisions (`run`: its policy and
    placement)."""
    args = [*shlex.split(command)[1:], "--out", str(out), *more]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return (out / f"decisions-{run}.jsonl").read_text().splitlines()


def test_the_replay_makes_the_decisions_the_live_manager_made(
    live: LiveRun, exported: tuple[Path, str], tmp_path: Path
) -> None:
    trace, command = exported
    lines = trace.with_name("history.decisions.jsonl").read_text().splitlines()
    recorded = [json.loads(line) for line in lines]
    # What the manager did: LAS preempted jobs at queue crossings and resumed them, some on the
    # other GPU type, in an order that is not the arrivals'.
    starts = [r for r in recorded if r["action"] == "start"]
    preemptions = [r for r in recorded if r["action"] == "preempt"]
    assert len(starts) == 17 and len(preemptions) == 8

    def nodes_of(name: str) -> list[str]:
        return [str(r["gpus"][0]).split("/")[0] for r in starts if r["job"] == live.ids[name]]

    assert nodes_of("b4") == ["v1", "a1"]  # bert at a quarter of its speed, then at full speed
    assert nodes_of("r4") == ["a1", "v1", "v1"]
    first = live.ids["r4"]
    assert [r["by"] for r in preemptions if r["job"] == first] == [live.ids["r2"], live.ids["r4b"]]

    # The replay's decisions file is the live one, line for line.
    assert replay(command, tmp_path / "sim") == lines

    # Every job ends in the replay when it ended live (the cancelled one: when it was cancelled).
    with (tmp_path / "sim" / "jobs-las-consolidate.csv").open() as handle:
        ended = {row["job_id"]: float(row["finish_s"]) for row in csv.DictReader(handle)}
    assert len(ended) == len(JOBS)
    for row in live.store.finished_jobs():
        assert row.finished_at is not None
        assert ended[row.id] == pytest.approx(row.finished_at - ORIGIN, abs=1e-9), row.name

    # The measured speeds are what makes it so: at speed 1 everywhere, it goes otherwise.
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    assert replay(command, tmp_path / "speed-1", "--throughputs", str(empty)) != lines


def test_the_trace_holds_each_jobs_work_its_spec_and_the_measured_throughputs(
    live: LiveRun, exported: tuple[Path, str]
) -> None:
    trace, _ = exported
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    header, nodes = lines[0], lines[1:4]
    jobs = {r["id"]: r for r in lines if r["kind"] == "job"}  # (node_change lines: joined)
    assert header == {
        "kind": "trace",
        "version": 1,
        "time_origin": ORIGIN,
        "throughputs": "history.throughputs.json",
        "decisions": "history.decisions.jsonl",
        "source": "corral export-trace",
    }
    # Every resumed attempt restored its checkpoint for RESTORE_S before it first reported
    # progress: the restore measured for each job is the paced executor's.
    assert {record["restore_s"] for record in jobs.values()} == {RESTORE_S}
    assert [(n["name"], n["gpus"], n["gpu_type"], n["rack"]) for n in nodes] == [
        ("a1", 4, "a100", "r0"),
        ("a2", 2, "a100", "r0"),
        ("v1", 4, "v100", "r1"),
    ]
    # A job's work is the steps it made over its best rate (a100's): what the manager accounted
    # from its attempts' times and speeds agrees with the executor's own count of steps.
    for job_id, record in jobs.items():
        model, count = record["model"], live.gpus[job_id]
        assert record["duration_s"] == live.executor.done[job_id] / (RATE[model]["a100"] * count)
    cancelled = live.ids[CANCEL[1]]
    assert jobs[cancelled]["status"] == "CANCELLED"
    assert jobs[cancelled]["duration_s"] == CANCEL[0] - 20.0  # ran on an a100 from 20 s to 60 s
    restricted = jobs[live.ids["b4v"]]
    assert (restricted["gpu_types"], restricted["gpus"], restricted["user"]) == (
        ["v100"],
        4,
        "alice",
    )
    assert [r["submit_time"] for r in jobs.values()] == [job[0] for job in JOBS]

    # The throughputs: the store's profiles, which telemetry measured from the progress reports
    # (shapes of 2 and 4 GPUs that nothing seeded), at the rates the jobs ran.
    table = json.loads(trace.with_name("history.throughputs.json").read_text())
    profiles = stored_profiles(live.store)
    assert table == json.loads(json.dumps(profiles.to_gavel()))
    # The jobs' VC measured its own shapes; the seeded rows (no VC's) are as they were seeded.
    measured = {(s.vc, s.model, s.gpu_type, s.gpus): m for s, m in profiles.items()}
    assert measured[("default", "bert", "v100", 4)].steps_per_s == 4.0
    assert measured[("default", "resnet", "a100", 2)].steps_per_s == 16.0
    assert measured[("default", "resnet", "a100", 1)].steps_per_s == 8.0
    assert measured[("", "resnet", "a100", 1)] == Measure(8.0, 60.0, 1)
    assert set(table) == {"a100", "v100", "@vcs"} and set(table["@vcs"]) == {"default"}
    read_back = Profiles.from_gavel(table)
    assert {s: m.steps_per_s for s, m in read_back.items()} == {
        s: m.steps_per_s for s, m in profiles.items()
    }


def test_a_jobs_work_counts_the_attempts_whose_work_it_kept() -> None:
    """A failed attempt's work is lost (the job did it again); a job that ended FAILED is
    replayed, without its failures, as the work of all its attempts. Every attempt after the
    first restores first (no work for `restore_s`), at its GPUs' speed."""
    cluster = Cluster.from_nodes(NODES)
    ids = {name: gpu for gpu, name in enumerate(cluster.gpu_names())}
    profiles = Profiles.from_gavel(
        {"a100": {"('bert', 1)": {"null": 4.0}}, "v100": {"('bert', 1)": {"null": 1.0}}}
    )
    speed = profiles.speed_model(cluster)
    spec = JobSpec("1", 0.0, 1, model="bert")

    def attempt(number: int, gpu: str, start: float, end: float, outcome: str) -> AttemptRow:
        return AttemptRow("1", number, [gpu], start, end, "ended", outcome, None, "")

    def work(status: str, *attempts: AttemptRow) -> float:
        row = JobRow.new(
            "1",
            name="j",
            user="u",
            vc="default",
            priority="guaranteed",
            gpus=1,
            spec={},
            submitted_at=0.0,
        )
        row.status, row.finished_at = status, attempts[-1].ended_at
        return job_work(row, spec, list(attempts), speed, ids, restore_s=4.0)

    failed = attempt(1, "a1/0", 0.0, 30.0, "failed")
    again = attempt(2, "v1/0", 40.0, 84.0, "succeeded")  # 44 s, 4 of them restoring, at 1/4
    assert work("SUCCEEDED", failed, again) == 10.0
    preempted = attempt(1, "a1/0", 0.0, 30.0, "preempted")
    assert work("SUCCEEDED", preempted, again) == 40.0
    lost = attempt(2, "v1/0", 40.0, 84.0, "lost")
    assert work("FAILED", failed, lost) == 40.0
    assert work("CANCELLED", preempted, attempt(2, "a1/0", 40.0, 44.0, "cancelled")) == 30.0


def test_export_trace_writes_helios_when_asked_and_refuses_an_unknown_format(
    live: LiveRun, tmp_path: Path
) -> None:
    out = tmp_path / "h.jsonl"
    args = ["export-trace", "--data-dir", str(live.data_dir), "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--format", "helios"])
    assert result.exit_code == 0, result.output
    assert out.read_text().startswith("job_id,user,vc,gpu_num,")
    assert "corral simulate --trace helios:" in " ".join(result.output.split())
    refused = CliRunner().invoke(app, [*args, "--format", "slurm"])
    assert refused.exit_code == 2
    assert "--format: unknown 'slurm'; choose corral or helios" in refused.output


# -- a real run: `corral up`, real processes, the real clock ---------------------------------------

#: A job that works WORK_S seconds (its array task's from WORK_BY_INDEX), reporting progress and
#: keeping what it did in its checkpoint directory: preempted (SIGTERM), it saves and exits, and
#: its next attempt goes on from there. With FAIL_FIRST_S, its first attempt exits 3 after that
#: many seconds (the marker in its checkpoint directory says it did).
WORKER = """\
import json, os, signal, sys, time
work = float(os.environ.get("WORK_S") or 0)
if "WORK_BY_INDEX" in os.environ:
    work = json.loads(os.environ["WORK_BY_INDEX"])[os.environ["CORRAL_ARRAY_INDEX"]]
keep = os.environ["CORRAL_CHECKPOINT_DIR"]
saved = os.path.join(keep, "done")
done = float(open(saved).read()) if os.path.exists(saved) else 0.0
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
progress = open(os.environ["CORRAL_PROGRESS_FILE"], "a")
def report():
    progress.write(json.dumps({"step": round(done * 10, 3)}) + "\\n")
    progress.flush()
report()
marker = os.path.join(keep, "failed-once")
if os.environ.get("FAIL_FIRST_S") and not os.path.exists(marker):
    open(marker, "w").close()
    time.sleep(float(os.environ["FAIL_FIRST_S"]))
    sys.exit(3)
began, base = time.monotonic(), done
while done < work and not stop:
    time.sleep(min(0.2, work - done))
    done = base + time.monotonic() - began
    report()
with open(saved + ".tmp", "w") as handle:
    handle.write(str(done))
os.replace(saved + ".tmp", saved)
sys.exit(0 if done >= work else 143)
"""

#: The scenario on 4 GPUs, worked out by hand (times in seconds after the first submission, every
#: job's length its work in seconds): (at, name, GPUs, work, other spec fields). The array's cap
#: of 2 keeps arr2 and arr3 out while GPUs are free; D waits for B to succeed; H is held from its
#: submission until 17 s; F's first attempt exits 3 after 3 s and it is retried; L, at level 5,
#: preempts the lowest of the running level-0 jobs, E.
#:
#:   0  arr0 (8 s), arr1 (13 s) start; arr2, arr3 wait at the cap   (without it: they start too)
#:   1  B (1 GPU, 5 s) starts;  2.5  D arrives, waits for B          (without it: D starts at 2.5)
#:   4  F starts (1 GPU);  5  H arrives, held
#:   6  B ends: D starts;  7  F fails, retried at 7.5;  8  arr0 ends: arr2 starts (cap 2)
#:   13 arr1 ends: arr3 starts;  15  E (2 GPUs, 8 s) starts;  17  H released: starts (1 free)
#:   20.5  L (level 5, 2 GPUs) preempts E, starts;  22  H ends: E resumes
#:   23  C (4 GPUs) arrives;  23.5  G (1 GPU);  24.5  E ends: G starts (C does not fit)
#:   25.5  L ends;  27.5  G ends: C starts
#:
#: First starts: arr0 arr1 B F D arr2 arr3 E H L G C; preempted: E. Each of the gates, the hold,
#: the level and the cap changes that order when left out; nothing that decides it is less than
#: a second from another thing it depends on (F's retry, 0.5 s after its failure, is the core's
#: backoff, the same in both).
ARRAY_WORK = {"0": 8, "1": 13, "2": 6, "3": 5}
LIVE_JOBS: list[tuple[float, str, int, float, dict[str, object]]] = [
    (1.0, "B", 1, 5, {}),
    (2.5, "D", 1, 4, {"after": ["B"]}),
    (4.0, "F", 1, 7, {"env": {"FAIL_FIRST_S": "3"}, "max_retries": 2}),
    (5.0, "H", 1, 5, {"hold": True}),
    (15.0, "E", 2, 8, {}),
    (20.5, "L", 2, 5, {"level": 5}),
    (23.0, "C", 4, 3, {}),
    (23.5, "G", 1, 3, {}),
]
RELEASE_AT = 17.0
FIRST_STARTS = ["arr0", "arr1", "B", "F", "D", "arr2", "arr3", "E", "H", "L", "G", "C"]


def test_a_real_run_replays_with_its_first_starts_and_preemptions(
    data_dir: Path, tmp_path: Path
) -> None:
    """`corral up` with 4 GPUs, real processes and the real clock: an array with a cap, a
    dependency, a hold and its release, a higher level that preempts, a job that fails once and
    is retried. `corral export-trace`, then the `corral simulate` it prints: the replay starts the
    jobs for the first time in the manager's order and preempts the same jobs."""
    import time

    from tests.server.helpers import admin_token, api, start_server, submit, wait_for, wait_until

    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    command = [sys.executable, str(worker)]
    running = start_server(data_dir, gpus=4)
    names: dict[str, str] = {}
    try:
        client = api(running.url, admin_token(data_dir))
        began = time.monotonic()

        def at(offset: float) -> None:  # the arrival process: each job arrives at its instant
            wait_until(lambda: time.monotonic() >= began + offset, f"{offset} s", timeout=60)

        answer = client.post(
            "/api/v1/jobs",
            json={
                "name": "arr",
                "gpus": 1,
                "command": command,
                "array": "0-3%2",
                "env": {"WORK_BY_INDEX": json.dumps(ARRAY_WORK)},
            },
        )
        assert answer.status_code == 201, answer.text
        for index, job_id in enumerate(answer.json()["array_tasks"]):
            names[f"arr{index}"] = job_id
        released = False
        for offset, name, gpus, work, extra in LIVE_JOBS:
            if offset > RELEASE_AT and not released:
                at(RELEASE_AT)
                answer = client.post(f"/api/v1/jobs/{names['H']}/release")
                assert answer.status_code == 200, answer.text
                released = True
            at(offset)
            fields = dict(extra)
            hold = fields.pop("hold", False)
            if "after" in fields:
                fields["after"] = [int(names[parent]) for parent in fields["after"]]  # type: ignore[union-attr]
            env = {"WORK_S": str(work), **fields.pop("env", {})}  # type: ignore[dict-item]
            names[name] = submit(client, name=name, gpus=gpus, command=command, env=env, **fields)
            if hold:  # while it waits: the 4 GPUs are taken (arr0, arr1, B, F)
                held = client.post(f"/api/v1/jobs/{names[name]}/hold")
                assert held.status_code == 200, held.text
        for name, job_id in names.items():
            assert wait_for(client, job_id, timeout=240)["status"] == "SUCCEEDED", name
    finally:
        running.stop()
    by_id = {job_id: name for name, job_id in names.items()}

    out = tmp_path / "history.corral.jsonl"
    result = CliRunner().invoke(
        app, ["export-trace", "--data-dir", str(data_dir), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    printed = " ".join(result.output.split())
    assert "wrote 12 jobs" in printed, printed
    replay_command = printed.split("replay with: ", 1)[1]
    args = [*shlex.split(replay_command)[1:], "--out", str(tmp_path / "sim")]
    simulated = CliRunner().invoke(app, args)
    assert simulated.exit_code == 0, simulated.output

    live = [
        json.loads(line)
        for line in out.with_name("history.decisions.jsonl").read_text().splitlines()
    ]
    decisions = sorted((tmp_path / "sim").glob("decisions-*.jsonl"))
    assert len(decisions) == 1, decisions
    replayed = [json.loads(line) for line in decisions[0].read_text().splitlines()]

    def first_starts(records: list[dict[str, object]]) -> list[str]:
        order: list[str] = []
        for record in records:
            name = by_id[str(record["job"])]
            if record["action"] == "start" and name not in order:
                order.append(name)
        return order

    def preempted(records: list[dict[str, object]]) -> set[str]:
        return {by_id[str(r["job"])] for r in records if r["action"] == "preempt"}

    # The manager decided as worked out above (the mechanisms acted) ...
    assert first_starts(live) == FIRST_STARTS, live
    assert preempted(live) == {"E"}
    retried = [r for r in live if r["action"] == "start" and by_id[str(r["job"])] == "F"]
    assert len(retried) == 2 and retried[1]["resumed"]
    # ... and the replay decides the same.
    assert first_starts(replayed) == FIRST_STARTS, replayed
    assert preempted(replayed) == {"E"}
    # F's first attempt failed after the seconds it ran live, and the core's retry rule started
    # it again (no longer left out as a job that "did no work": its restore is its own, under a
    # second, not the configured 30 s).
    records = map(json.loads, out.read_text().splitlines())
    jobs = {r["id"]: r for r in records if r["kind"] == "job"}
    failed = jobs[names["F"]]
    assert [f["attempt"] for f in failed["failures"]] == [1] and failed["restore_s"] < 30
    assert failed["failures"][0]["ran_s"] >= 3
    again = [r for r in replayed if r["action"] == "start" and by_id[str(r["job"])] == "F"]
    assert len(again) == 2 and again[1]["resumed"]
    assert float(again[1]["at"]) - float(again[0]["at"]) == pytest.approx(
        float(retried[1]["at"]) - float(retried[0]["at"]), abs=1.0
    )
    # The exported gates: the array's cap, D's dependency, H's hold until its release.
    assert {jobs[names[f"arr{i}"]]["array"]["cap"] for i in range(4)} == {2}
    assert jobs[names["D"]]["after"] == [names["B"]]
    ((held_at, released_at),) = jobs[names["H"]]["holds"]
    # (since the array's submission, a little after the test's clock began: the hold right
    # after H's submission at 5 s, the release at 17 s)
    assert 4.0 < held_at < 6.0 and RELEASE_AT - 1.0 < released_at < RELEASE_AT + 1.5
    assert jobs[names["L"]]["level"] == 5
    # The replay says how its decisions compare with the manager's, and lists each difference.
    output = " ".join(simulated.output.split())
    assert "against the manager's decisions" in output, output
    assert "order of first starts the same, preempted jobs the same" in output, output
    assert list((tmp_path / "sim").glob("replay-*.jsonl"))
