"""An extension of each kind, registered by this module alone (one class or entry, one registry
item, removed again in `finally`), runs through `corral simulate` (in-process) and, where the live
manager has the kind, through the manager as `corral up` builds it, deciding as worked out by hand;
and the lists a user sees (`--help`, `corral config plugins`) name it while it is registered.

- policy `fewest-gpus-first`: the job asking for the fewest GPUs first;
- placement `emptiest-node`: a job on the node with the most free GPUs;
- round stage `nudge`: a waiting job one GPU short on a node has a running 1-GPU job moved off it;
- trace format `simplecsv`: `id,gpus,submit,duration` rows, read as a stream (so loaded too), and
  a variant that gives only a loader, which `--stream` refuses in one line.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from rich.console import Console

from corral.cli.main import app
from corral.core.actions import Action
from corral.core.cluster import Cluster
from corral.core.framework import STAGES, config_from_mapping
from corral.core.job import Job, JobSpec
from corral.core.options import option
from corral.core.placement import PLACEMENTS
from corral.core.placement.base import NotPlaced, Placed, Placement
from corral.core.plugin import Services
from corral.core.policy import POLICIES
from corral.core.policy.base import Key, Policy
from corral.core.stages import RoundHost, Stage
from corral.server.manager import Manager, ManagerSettings
from corral.server.spec import parse_job_spec
from corral.server.store import Store
from corral.sim.traces import FORMATS
from corral.sim.traces.base import (
    Trace,
    TraceFormat,
    csv_records,
    existing_path,
    integer,
    number,
    text,
)
from tests.server.helpers import python_job
from tests.server.inert import HeldExecutor

# -- the extensions ------------------------------------------------------------------------------


class FewestGpusFirst(Policy):
    name = "fewest-gpus-first"
    summary = "the job asking for the fewest GPUs first, then arrival"

    def key(self, job: Job, now: float) -> Key:
        return (job.spec.gpus,)


class EmptiestNode(Placement):
    """All of a job's GPUs on one node: the one with the most free GPUs (the first of those)."""

    name = "emptiest-node"
    summary = "one node, the one with the most free GPUs"
    # Its answer depends only on the free GPUs and the job; its GPUs lie in one node.
    pure = True

    def refusal(self, cluster: Cluster, spec: JobSpec) -> str | None:
        largest = max(node.total_gpus for node in cluster.nodes)
        if spec.gpus > largest:
            return f"emptiest-node: {spec.gpus} GPUs do not fit in one node ({largest} at most)"
        return None

    def place(self, cluster: Cluster, job: Job, now: float) -> Placed | NotPlaced:
        free = [cluster.node_free(node) for node in range(len(cluster.nodes))]
        node = max(range(len(free)), key=lambda n: (free[n], -n))
        if free[node] < job.spec.gpus:
            return NotPlaced(f"no node has {job.spec.gpus} free GPUs ({free[node]} at most)")
        return Placed(tuple(cluster.free_gpus_of_node(node)[: job.spec.gpus]))

    def scope(self, cluster: Cluster, job: Job, now: float) -> str:
        return "node"


@dataclass(frozen=True, slots=True)
class NudgeOptions:
    moves_per_round: int = option(1, help="running jobs it may move in one round", low=1)


class Nudge(Stage):
    """A waiting job that is one GPU short on a node (the lowest-numbered such node): the 1-GPU
    job that arrived last among those running there moves to a free GPU of another node (the
    lowest-numbered with one), and the waiting job starts on the node's GPUs. Never a job started
    at this instant, nor one sharing its GPUs."""

    name = "nudge"
    summary = "move a running 1-GPU job so that a waiting job fits on one node"
    Options = NudgeOptions
    point = "defragment"  # consulted before preemption

    def __init__(self, moves_per_round: int = 1) -> None:
        self.moves_per_round = moves_per_round
        self.moved = 0

    @classmethod
    def from_options(cls, options: Any, services: Services) -> Nudge:
        return cls(options.moves_per_round)

    def new_round(self) -> None:
        self.moved = 0

    def try_start(self, host: RoundHost, job: Job, now: float, actions: list[Action]) -> bool:
        cluster, need = host.cluster, job.spec.gpus
        if self.moved >= self.moves_per_round or need < 2:
            return False
        if not job.spec.plain or job.spec.gpu_types is not None:  # whole GPUs, of any type
            return False
        nodes = range(len(cluster.nodes))
        for node in nodes:
            if cluster.node_free(node) != need - 1:
                continue
            movable = [
                other
                for other in host.running_jobs()
                if other.spec.gpus == 1
                and cluster.nodes_of(other.placement) == {node}
                and other.run_started_at != now
                and not host.is_shared(other)
            ]
            to = next((n for n in nodes if n != node and cluster.node_free(n) > 0), None)
            if not movable or to is None:
                continue
            host.move(max(movable, key=lambda other: other.seq), to, job.id, now, actions)
            self.moved += 1
            host.start_on(job, Placed(tuple(cluster.free_gpus_of_node(node))), now, actions)
            return True
        return False


def simplecsv_rows(location: str, **options: Any) -> Iterator[tuple[str, JobSpec]]:
    """`id,gpus,submit,duration` rows, in file order, each with its line."""
    if options.keys() - {"perf", "seed"}:
        raise ValueError(f"simplecsv: unknown option(s) {', '.join(sorted(options))}")
    path = existing_path(location, "simplecsv")
    for line, row in csv_records(path, ("id", "gpus", "submit", "duration"), location):
        where = f"{location}: line {line}"
        yield (
            f"line {line}",
            JobSpec(
                id=text(row["id"], where, "id"),
                submit_time=number(row["submit"], where, "submit"),
                gpus=integer(row["gpus"], where, "gpus", positive=True),
                duration_s=number(row["duration"], where, "duration", positive=True),
            ),
        )


def simplecsv_whole(location: str, **options: Any) -> Trace:
    jobs = [spec for _, spec in simplecsv_rows(location, **options)]
    return Trace(jobs=jobs, source=f"simplecsv-whole:{location}")


SIMPLECSV = TraceFormat(
    "simplecsv", "id,gpus,submit,duration rows", "simplecsv:PATH", stream=simplecsv_rows
)
SIMPLECSV_WHOLE = TraceFormat(
    "simplecsv-whole", "simplecsv, read whole", "simplecsv-whole:PATH", read=simplecsv_whole
)


@contextmanager
def registered(registry: dict[str, Any], name: str, entry: Any) -> Iterator[None]:
    """The entry in the registry while the block runs; removed again whatever happens."""
    assert name not in registry
    registry[name] = entry
    try:
        yield
    finally:
        del registry[name]


# -- helpers -------------------------------------------------------------------------------------


def simulate(tmp_path: Path, trace: str, *flags: str, out: str = "out") -> Path:
    """`corral simulate` in-process with `--decisions`, fifo and consolidate unless `flags` say
    otherwise; the output directory."""
    args = ["simulate", "--trace", trace, "--restore-s", "0", "--decisions"]
    args += ["--out", str(tmp_path / out), *flags]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return tmp_path / out


def starts(out: Path, policy: str, placement: str) -> list[tuple[float, str, list[int]]]:
    """(instant, job, GPUs) of every start, in the order decided; a GPU by its index in the
    cluster (`--cluster NxG`: node n's device d is n * G + d)."""
    lines = (out / f"decisions-{policy}-{placement}.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return [(r["at"], r["job"], index(r["gpus"])) for r in records if r["action"] == "start"]


def index(names: list[str]) -> list[int]:
    """GPUs by index from their names ("node-0001/2"): the tests' clusters have nodes of 4 GPUs,
    or one node."""
    out = []
    for name in names:
        node, _, device = name.partition("/")
        out.append(int(node.removeprefix("node-")) * 4 + int(device))
    return out


def tiresias_trace(path: Path, rows: list[str]) -> str:
    header = "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
    path.write_text(header + "".join(f"{row}\n" for row in rows))
    return f"tiresias:{path}"


def wide_output(args: list[str], monkeypatch: pytest.MonkeyPatch) -> str:
    """The command's output with every line of a table or help box joined: words only."""
    import corral.cli.configcmd

    monkeypatch.setattr(corral.cli.configcmd, "console", Console(width=400))
    result = CliRunner().invoke(app, args, env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.output).split())


def manager(tmp_path: Path, executor: HeldExecutor, cluster: Cluster, **config: str) -> Manager:
    return Manager(
        Store(Store.sqlite_url(tmp_path)),
        executor,
        cluster,
        tmp_path,
        settings=ManagerSettings(scheduler=config_from_mapping(config)),
    )


def launched(executor: HeldExecutor) -> list[str]:
    return sorted(job_id for job_id, _ in executor.running)


# -- policy --------------------------------------------------------------------------------------

# A 4-GPU node. Job `big` (4 GPUs, 100 s) starts at 0; at 10 arrive, in this order, `four`
# (4 GPUs), `one` (1) and `two` (2), 100 s each. When `big` ends at 100, fewest-gpus-first
# starts `one` and `two` (3 GPUs; `four` does not fit in the 1 left) and `four` at 200, when
# both have ended. fifo starts `four` at 100, then `one` and `two` at 200.
POLICY_ROWS = ["big,4,0,,,100,", "four,4,10,,,100,", "one,1,10,,,100,", "two,2,10,,,100,"]


def test_a_policy_registered_here_orders_the_simulated_queue(tmp_path, monkeypatch):
    trace = tiresias_trace(tmp_path / "t.csv", POLICY_ROWS)
    common = ["--cluster", "1x4", "--placement", "consolidate"]
    with registered(POLICIES, "fewest-gpus-first", FewestGpusFirst):
        out = simulate(tmp_path, trace, *common, "--policy", "fewest-gpus-first")
        assert starts(out, "fewest-gpus-first", "consolidate") == [
            (0.0, "big", [0, 1, 2, 3]),
            (100.0, "one", [0]),
            (100.0, "two", [1, 2]),
            (200.0, "four", [0, 1, 2, 3]),
        ]
        help_text = wide_output(["simulate", "--help"], monkeypatch)
        assert f"one of: {', '.join(POLICIES)} [default" in help_text
        assert "fewest-gpus-first" in POLICIES and "elasticflow, fewest-gpus-first" in help_text
        listed = wide_output(["config", "plugins"], monkeypatch)
        assert f"policy fewest-gpus-first {FewestGpusFirst.summary} -" in listed
    out = simulate(tmp_path, trace, *common, "--policy", "fifo", out="fifo")
    assert [(t, job) for t, job, _ in starts(out, "fifo", "consolidate")] == [
        (0.0, "big"),
        (100.0, "four"),
        (200.0, "one"),
        (200.0, "two"),
    ]
    assert "fewest-gpus-first" not in POLICIES
    assert "fewest-gpus-first" not in wide_output(["config", "plugins"], monkeypatch)


def test_a_policy_registered_here_orders_the_live_queue(tmp_path):
    # The same jobs on the manager (1 node of 4 GPUs): ids 1 big, 2 four, 3 one, 4 two.
    executor = HeldExecutor()
    with registered(POLICIES, "fewest-gpus-first", FewestGpusFirst):
        live = manager(tmp_path, executor, Cluster.shorthand(1, 4), policy="fewest-gpus-first")
        try:
            assert isinstance(live.scheduler.policy, FewestGpusFirst)
            live.submit(parse_job_spec(python_job("big", "pass", gpus=4)), "u")
            live.step()
            assert launched(executor) == ["1"]
            for name, gpus in (("four", 4), ("one", 1), ("two", 2)):
                live.submit(parse_job_spec(python_job(name, "pass", gpus=gpus)), "u")
            live.step()
            assert launched(executor) == ["1"]
            executor.end("1", 1, "exit code 0", code=0)
            live.step()
            assert launched(executor) == ["3", "4"]  # one and two; four waits
            executor.end("3", 1, "exit code 0", code=0)
            executor.end("4", 1, "exit code 0", code=0)
            live.step()
            assert launched(executor) == ["2"]
        finally:
            live.stop()


# -- placement -----------------------------------------------------------------------------------

# 2 nodes of 4 GPUs (0-3, 4-7), fifo. At 0: a (1 GPU), b (1), c (2), d (4), 100 s each.
# emptiest-node: a on node 0 (a tie: the first) GPU 0; b on node 1 (4 free against 3) GPU 4; c on
# node 0 (3 free each: the first) GPUs 1, 2; d finds at most 3 free in a node and waits (fifo
# blocks behind it) until a, b and c end at 100, then takes node 0, GPUs 0-3.
# consolidate (the fullest node that fits) puts a, b and c on node 0 and d on node 1, all at 0.
PLACEMENT_ROWS = ["a,1,0,,,100,", "b,1,0,,,100,", "c,2,0,,,100,", "d,4,0,,,100,"]
EMPTIEST_STARTS = [
    (0.0, "a", [0]),
    (0.0, "b", [4]),
    (0.0, "c", [1, 2]),
    (100.0, "d", [0, 1, 2, 3]),
]


def test_a_placement_registered_here_places_the_simulated_jobs(tmp_path, monkeypatch):
    trace = tiresias_trace(tmp_path / "t.csv", PLACEMENT_ROWS)
    common = ["--cluster", "2x4", "--policy", "fifo"]
    with registered(PLACEMENTS, "emptiest-node", EmptiestNode):
        out = simulate(tmp_path, trace, *common, "--placement", "emptiest-node")
        assert starts(out, "fifo", "emptiest-node") == EMPTIEST_STARTS
        help_text = wide_output(["simulate", "--help"], monkeypatch)
        assert f"placement (one of: {', '.join(PLACEMENTS)})" in help_text
        assert "gpu-packing-cpu, emptiest-node)" in help_text
        listed = wide_output(["config", "plugins"], monkeypatch)
        assert f"placement emptiest-node {EmptiestNode.summary} -" in listed
    out = simulate(tmp_path, trace, *common, "--placement", "consolidate", out="consolidate")
    assert starts(out, "fifo", "consolidate") == [
        (0.0, "a", [0]),
        (0.0, "b", [1]),
        (0.0, "c", [2, 3]),
        (0.0, "d", [4, 5, 6, 7]),
    ]
    assert "emptiest-node" not in PLACEMENTS


def test_a_placement_registered_here_places_the_live_jobs(tmp_path):
    executor = HeldExecutor()
    with registered(PLACEMENTS, "emptiest-node", EmptiestNode):
        live = manager(
            tmp_path, executor, Cluster.shorthand(2, 4), policy="fifo", placement="emptiest-node"
        )
        try:
            for name, gpus in (("a", 1), ("b", 1), ("c", 2), ("d", 4)):
                live.submit(parse_job_spec(python_job(name, "pass", gpus=gpus)), "u")
            live.step()
            jobs = live.scheduler.jobs
            assert launched(executor) == ["1", "2", "3"]
            assert [list(jobs[i].placement) for i in ("1", "2", "3")] == [[0], [4], [1, 2]]
            for job_id in ("1", "2", "3"):
                executor.end(job_id, 1, "exit code 0", code=0)
            live.step()
            assert launched(executor) == ["4"]
            assert list(jobs["4"].placement) == [0, 1, 2, 3]
            # A job no node can hold is refused at submission, in the placement's words.
            with pytest.raises(ValueError, match="emptiest-node: 5 GPUs do not fit in one node"):
                live.submit(parse_job_spec(python_job("e", "pass", gpus=5)), "u")
        finally:
            live.stop()


# -- round stage ---------------------------------------------------------------------------------

# 2 nodes of 4 GPUs (0-3, 4-7), fifo, consolidate (the node with the fewest free GPUs that holds
# the job), no restore stall. At 0: a (2 GPUs, 100 s), b (1, 400 s), c (1, 400 s), d (3, 400 s);
# e (3, 100 s) at 10. a takes GPUs 0, 1 (both nodes empty: the first); b takes 2 and c 3 (node 0
# is the fuller that fits); d takes 4-6 (only node 1 holds 3). At 10 e finds 0 and 1 GPUs free:
# no node is one GPU short (2 free), so it waits. At 100 a ends: node 0 has 0, 1 free, one short
# of e's 3. nudge moves c, the 1-GPU job there that arrived last, to node 1's free GPU 7 (a move:
# a preemption by e and a start, resumed, both at 100), and starts e on node 0's 0, 1 and 3.
# Without the stage e waits until b, c and d end at 400.
NUDGE_ROWS = [
    "a,2,0,,,100,",
    "b,1,0,,,400,",
    "c,1,0,,,400,",
    "d,3,0,,,400,",
    "e,3,10,,,100,",
]
NUDGE_STARTS = [
    (0.0, "a", [0, 1]),
    (0.0, "b", [2]),
    (0.0, "c", [3]),
    (0.0, "d", [4, 5, 6]),
    (100.0, "c", [7]),
    (100.0, "e", [0, 1, 3]),
]


def preempts(out: Path, policy: str, placement: str) -> list[tuple[float, str, list[int], str]]:
    """(instant, job, GPUs, by whom) of every preemption (a move is one), in order."""
    lines = (out / f"decisions-{policy}-{placement}.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return [
        (r["at"], r["job"], index(r["gpus"]), r["by"]) for r in records if r["action"] == "preempt"
    ]


def test_a_stage_registered_here_moves_a_simulated_job_for_a_waiting_one(tmp_path, monkeypatch):
    trace = tiresias_trace(tmp_path / "t.csv", NUDGE_ROWS)
    common = ["--cluster", "2x4", "--policy", "fifo", "--placement", "consolidate"]
    with registered(STAGES, "nudge", Nudge):
        flags = ["--stages", "nudge", "--nudge-moves-per-round", "1"]
        out = simulate(tmp_path, trace, *common, *flags)
        assert starts(out, "fifo", "consolidate") == NUDGE_STARTS
        assert preempts(out, "fifo", "consolidate") == [(100.0, "c", [3], "e")]
        with (out / "jobs-fifo-consolidate.csv").open() as handle:
            rows = {row["job_id"]: row for row in csv.DictReader(handle)}
        assert float(rows["e"]["first_start_s"]) == 100.0
        # A move is not counted as a preemption; c ran in two attempts.
        assert (rows["c"]["attempts"], rows["c"]["preemptions"]) == ("2", "0")
        help_text = wide_output(["simulate", "--help"], monkeypatch)
        assert "round stages to run (any of: packing, migration, nudge)" in help_text
        assert "--nudge-moves-per-round VALUE running jobs it may move in one round" in help_text
        listed = wide_output(["config", "plugins"], monkeypatch)
        assert f"stage nudge {Nudge.summary} moves_per_round" in listed
        bad = [*common, "--stages", "nudge", "--nudge-moves-per-round", "0"]
        refused = CliRunner().invoke(app, ["simulate", "--trace", trace, *bad])
        assert refused.exit_code == 2
        assert refused.output.strip().splitlines()[-1] == (
            "error: --nudge-moves-per-round: must be >= 1, got 0"
        )
        # An admission that names the stages it runs with (quota) refuses it, in one line.
        args = ["simulate", "--trace", trace, *common, *flags, "--admission", "quota"]
        refused = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "quota")])
        assert refused.exit_code == 2
        assert refused.output.strip().splitlines()[-1] == (
            "error: admission quota does not run with nudge: unsupported"
        )
    out = simulate(tmp_path, trace, *common, out="without")
    assert [(t, job) for t, job, _ in starts(out, "fifo", "consolidate")] == [
        (0.0, "a"),
        (0.0, "b"),
        (0.0, "c"),
        (0.0, "d"),
        (400.0, "e"),
    ]
    assert preempts(out, "fifo", "consolidate") == []
    assert "nudge" not in STAGES
    assert "nudge" not in wide_output(["config", "plugins"], monkeypatch)


def test_a_stage_registered_here_moves_a_live_job_for_a_waiting_one(tmp_path):
    # The same jobs on the manager (2 nodes of 4 GPUs): ids 1 a, 2 b, 3 c, 4 d, 5 e. The move
    # stops c's attempt 1; c's attempt 2 and e start once it has ended (its GPU 3 is e's).
    executor = HeldExecutor()
    with registered(STAGES, "nudge", Nudge):
        live = Manager(
            Store(Store.sqlite_url(tmp_path)),
            executor,
            Cluster.shorthand(2, 4),
            tmp_path,
            settings=ManagerSettings(
                scheduler=config_from_mapping(
                    {
                        "policy": "fifo",
                        "placement": "consolidate",
                        "stages": ["nudge"],
                        "nudge": {"moves_per_round": 1},
                    }
                )
            ),
        )
        try:
            assert isinstance(live.scheduler.stage("nudge"), Nudge)
            jobs = live.scheduler.jobs
            for name, gpus in (("a", 2), ("b", 1), ("c", 1), ("d", 3)):
                live.submit(parse_job_spec(python_job(name, "pass", gpus=gpus)), "u")
            live.step()
            assert launched(executor) == ["1", "2", "3", "4"]
            assert [list(jobs[i].placement) for i in "1234"] == [[0, 1], [2], [3], [4, 5, 6]]
            live.submit(parse_job_spec(python_job("e", "pass", gpus=3)), "u")
            live.step()
            assert launched(executor) == ["1", "2", "3", "4"] and executor.stopped == []
            executor.end("1", 1, "exit code 0", code=0)
            live.step()
            assert executor.stopped == [("3", 1)]
            assert sorted(executor.running) == [("2", 1), ("3", 1), ("4", 1)]
            executor.end("3", 1, "stopped", code=None)
            live.step()
            assert sorted(executor.running) == [("2", 1), ("3", 2), ("4", 1), ("5", 1)]
            assert list(jobs["3"].placement) == [7]
            assert list(jobs["5"].placement) == [0, 1, 3]
            messages = [e.message for e in live.store.events("3") if e.kind == "migrated"]
            assert messages == ["migrated to make room for job 5"]
        finally:
            live.stop()


# -- trace format --------------------------------------------------------------------------------

# One 2-GPU node, fifo. p (2 GPUs, 50 s) at 0; q (1, 30 s) and r (1, 40 s) at 5. q and r start at
# 50, when p ends, on GPUs 0 and 1.
SIMPLECSV_ROWS = "id,gpus,submit,duration\np,2,0,50\nq,1,5,30\nr,1,5,40\n"
SIMPLECSV_STARTS = [(0.0, "p", [0, 1]), (50.0, "q", [0]), (50.0, "r", [1])]


def test_a_trace_format_registered_here_is_read_whole_and_as_a_stream(tmp_path, monkeypatch):
    path = tmp_path / "jobs.simple.csv"
    path.write_text(SIMPLECSV_ROWS)
    common = ["--cluster", "1x2", "--policy", "fifo", "--placement", "consolidate"]
    with registered(FORMATS, "simplecsv", SIMPLECSV):
        whole = simulate(tmp_path, f"simplecsv:{path}", *common, out="whole")
        assert starts(whole, "fifo", "consolidate") == SIMPLECSV_STARTS
        streamed = simulate(tmp_path, f"simplecsv:{path}", *common, "--stream", out="streamed")
        assert starts(streamed, "fifo", "consolidate") == SIMPLECSV_STARTS
        help_text = wide_output(["simulate", "--help"], monkeypatch)
        assert "corral:PATH, simplecsv:PATH (a path ending .corral.jsonl" in help_text
        assert "formats that stream: tiresias, simplecsv)" in help_text
        listed = wide_output(["config", "plugins"], monkeypatch)
        assert "trace format simplecsv id,gpus,submit,duration rows simplecsv:PATH" in listed
        refused = CliRunner().invoke(app, ["simulate", "--trace", "slurm:x", *common])
        assert refused.exit_code != 0
        assert f"known formats: {', '.join(FORMATS)} (write FORMAT:PATH)" in refused.output
        assert ", corral, simplecsv (write" in refused.output
    assert "simplecsv" not in FORMATS


def test_a_trace_format_with_only_a_loader_is_refused_as_a_stream_in_one_line(tmp_path):
    path = tmp_path / "jobs.simple.csv"
    path.write_text(SIMPLECSV_ROWS)
    common = ["--cluster", "1x2", "--policy", "fifo", "--placement", "consolidate"]
    with registered(FORMATS, "simplecsv-whole", SIMPLECSV_WHOLE):
        whole = simulate(tmp_path, f"simplecsv-whole:{path}", *common, out="whole")
        assert starts(whole, "fifo", "consolidate") == SIMPLECSV_STARTS
        args = ["simulate", "--trace", f"simplecsv-whole:{path}", *common, "--stream"]
        refused = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "s")])
        assert refused.exit_code == 2
        (line,) = refused.output.strip().splitlines()
        assert line == (
            "error: --stream: trace format 'simplecsv-whole' has no streaming reader (it is "
            "read whole); formats that stream: tiresias"
        )
