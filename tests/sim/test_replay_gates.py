"""A corral trace's replay facts (corral.core.tracefile.JobReplay) and what `corral simulate` does
with them (corral.sim.replay): array caps, dependencies, holds, levels and recorded failures
decide as the live manager's gates and retry rule do, and the replay's decisions are compared
with a decision log (corral.sim.replaydiff). The live run that exports such a trace is
tests/server/test_replay.py's."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from corral.cli.main import app
from corral.core.gates import Gates
from corral.core.job import JobSpec
from corral.core.tracefile import (
    JobReplay,
    RecordedFailure,
    RecordError,
    job_record,
    read_job,
    read_job_replay,
)
from corral.sim.replay import ReplayNote
from corral.sim.replaydiff import compare


def through_json(record: dict[str, object]) -> dict[str, Any]:
    return json.loads(json.dumps(record))


def test_a_jobs_replay_facts_and_level_come_back() -> None:
    spec = JobSpec("7", 4.0, 1, level=5, precheck_s=0.0)
    facts = JobReplay(
        gates=Gates(after=("5",), array="1", cap=2),
        holds=((5.2, 17.0), (20.0, None)),
        failures=(RecordedFailure(1, 3.0, "exit code 3", "3|exit code 3", False),),
        restore_s=0.5,
        finished_at=30.0,
        array_index=2,
    )
    record = through_json(job_record(spec, facts, status="SUCCEEDED"))
    assert read_job(record) == spec
    assert read_job_replay(record) == facts
    assert read_job_replay(through_json(job_record(spec))) is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"holds": [[5.0, 4.0]]}, "holds.0: released at 4.0 before held at 5.0"),
        ({"holds": [5.0]}, "holds.0: must be [held_at, released_at], got 5.0"),
        ({"array": {"id": "1"}}, "array: must be null or {id, index, cap}"),
        ({"after": [5]}, "after: must be null or a list of job ids, got [5]"),
        ({"failures": [{"ran_s": 1.0}]}, "failures.0.attempt: missing"),
        ({"failures": [{"attempt": 1, "ran_s": -1}]}, "failures.0.ran_s: must be a number >= 0"),
        ({"level": 1.5}, "level: must be an integer, got 1.5"),
    ],
)
def test_a_bad_replay_field_is_named(change: dict[str, object], message: str) -> None:
    record = job_record(JobSpec("7", 0.0, 1)) | change
    with pytest.raises(RecordError, match="^" + re.escape(message)):
        read_job(record)
        read_job_replay(record)


def arr(index: int) -> dict[str, object]:
    return {"array": {"id": "1", "index": index, "cap": 2}}


#: (name, submit, GPUs, work, replay fields) on 4 GPUs; ids 1.. in this order. The timeline,
#: worked out by hand (LAS: one queue here, so arrival order within a level; a higher level
#: preempts; retry backoff 0.5 s):
#:   0 arr0 (8 s), arr1 (13 s) start, arr2 and arr3 wait at the cap of 2
#:   1 B starts (1 GPU, 5 s); 2.5 D waits for B; 4 F starts; 5 H arrives, held from 5.2
#:   6 B ends: D starts; 7 F fails (after 3 s), retried at 7.5; 8 arr0 ends: arr2 starts
#:   13 arr1 ends: arr3 starts; 15 E (2 GPUs) starts; 17 H released, starts
#:   20.5 L (level 5) preempts E; 22 H ends, E resumes; 24.5 E ends: G starts (C needs 4)
#:   25.5 L ends; 27.5 G ends: C starts
SCENARIO: list[tuple[str, float, int, float, dict[str, object]]] = [
    ("arr0", 0, 1, 8, arr(0)),
    ("arr1", 0, 1, 13, arr(1)),
    ("arr2", 0, 1, 6, arr(2)),
    ("arr3", 0, 1, 5, arr(3)),
    ("B", 1, 1, 5, {}),
    ("D", 2.5, 1, 4, {"after": ["5"]}),
    ("F", 4, 1, 7, {"failures": [{"attempt": 1, "ran_s": 3.0, "reason": "exit 3"}]}),
    ("H", 5, 1, 5, {"holds": [[5.2, 17.0]]}),
    ("E", 15, 2, 8, {}),
    ("L", 20.5, 2, 5, {"level": 5}),
    ("C", 23, 4, 3, {}),
    ("G", 23.5, 1, 3, {}),
]
FIRST_STARTS = ["arr0", "arr1", "B", "F", "D", "arr2", "arr3", "E", "H", "L", "G", "C"]
NAMES = {str(number): job[0] for number, job in enumerate(SCENARIO, start=1)}


def write_trace(path: Path, leave_out: str | None = None, log: str | None = None) -> Path:
    header: dict[str, object] = {"kind": "trace", "version": 1, "time_origin": 0.0}
    if log is not None:
        header["decisions"] = log
    lines: list[dict[str, object]] = [
        header,
        {"kind": "node", "name": "n", "gpus": 4, "gpu_type": "v100"},
    ]
    for number, (name, submit, gpus, work, extra) in enumerate(SCENARIO, start=1):
        record: dict[str, object] = {
            "kind": "job",
            "id": str(number),
            "submit_time": float(submit),
            "gpus": gpus,
            "duration_s": float(work),
            "name": name,
            "max_retries": 2,
            "restore_s": 0.0,
            **extra,
        }
        record.pop(leave_out or "", None)
        lines.append(record)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def simulate(trace: Path, out: Path) -> tuple[list[dict[str, Any]], str]:
    config = out.parent / f"{out.name}.scheduler.yaml"
    config.write_text("scheduler:\n  relax: {after_s: 0}\n  retry: {backoff_s: 0.5}\n")
    args = ["simulate", "--trace", f"corral:{trace}", "--scheduler-config", str(config)]
    result = CliRunner().invoke(app, [*args, "--decisions", "--out", str(out)])
    assert result.exit_code == 0, result.output
    lines = (out / "decisions-las-relax.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines], " ".join(result.output.split())


def first_starts(records: list[dict[str, Any]]) -> list[str]:
    order: list[str] = []
    for record in records:
        if record["action"] == "start" and NAMES[record["job"]] not in order:
            order.append(NAMES[record["job"]])
    return order


def test_the_replay_honours_caps_dependencies_holds_levels_and_failures(tmp_path: Path) -> None:
    records, output = simulate(write_trace(tmp_path / "t.corral.jsonl"), tmp_path / "out")
    assert first_starts(records) == FIRST_STARTS
    assert [(r["at"], NAMES[r["job"]], r["by"]) for r in records if r["action"] == "preempt"] == [
        (20.5, "E", "10")
    ]
    retries = [(r["at"], r["resumed"]) for r in records if NAMES[r["job"]] == "F"]
    assert retries == [(4.0, False), (7.5, True)]  # failed at 7, the backoff's 0.5 s
    assert "1 capped array(s), 1 job(s) with dependencies, 1 hold(s), 1 failed attempt(s)" in output
    # Each of them decides: left out, the order (or the preemptions) differ.
    for field in ("array", "after", "holds", "level", "failures"):
        trace = write_trace(tmp_path / f"no-{field}.corral.jsonl", leave_out=field)
        other, _ = simulate(trace, tmp_path / f"no-{field}")
        if field == "failures":  # F then runs at once for its 7 s: no second start
            assert [r["at"] for r in other if NAMES[r["job"]] == "F"] == [4.0]
            continue
        assert first_starts(other) != FIRST_STARTS or not any(
            r["action"] == "preempt" for r in other
        ), field


def test_the_replay_lists_each_decision_it_made_otherwise_and_why(tmp_path: Path) -> None:
    records, _ = simulate(write_trace(tmp_path / "t.corral.jsonl"), tmp_path / "first")
    # A decision log where the manager started C 3 s later and on other GPUs than the replay
    # does, and held B when it ran in the replay.
    log = [dict(r) for r in records]
    start_c = next(r for r in log if NAMES[r["job"]] == "C")
    start_c["at"] = float(start_c["at"]) + 3.0
    (tmp_path / "t.decisions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    trace = write_trace(tmp_path / "t.corral.jsonl", log="t.decisions.jsonl")
    text = trace.read_text().replace('"name": "B"', '"name": "B", "holds": [[2.0, 3.0]]')
    trace.write_text(text)
    _, output = simulate(trace, tmp_path / "second")
    assert f"{len(log) - 1} of {len(log)} decisions as the manager's" in output
    assert "order of first starts the same, preempted jobs the same" in output
    lines = [json.loads(x) for x in (tmp_path / "second" / "replay-las-relax.jsonl").open()]
    (difference,) = [line for line in lines if "why" in line]
    assert difference["live"]["job"] == difference["replay"]["job"] == "11"
    assert difference["why"].startswith("start 1 of job 11: -3.000 s in the replay")
    (note,) = [line for line in lines if line.get("note") and "held" in line["note"]]
    assert note == {
        "at": 2.0,
        "job": "5",
        "note": "held live while it waited; in the replay it is running then, and runs on",
    }


def test_a_near_tie_is_named_as_such() -> None:
    live = [
        {"at": 1.0, "action": "start", "job": "1", "gpus": ["n/0"], "resumed": False},
        {"at": 1.2, "action": "start", "job": "2", "gpus": ["n/0"], "resumed": False},
    ]
    replay = [
        {"at": 1.0, "action": "start", "job": "2", "gpus": ["n/0"], "resumed": False},
        {"at": 1.2, "action": "start", "job": "1", "gpus": ["n/0"], "resumed": False},
    ]
    check = compare(live, replay, [ReplayNote(0.5, "9", "something")], {"1": (2.0, 2.1)})
    assert not check.first_starts_same and check.preempted_same
    assert check.same == 2  # within the tolerance, on the same GPUs: the same decisions
    check = compare(live, [{**replay[0], "gpus": ["n/1"]}, replay[1]])
    (difference,) = check.differences
    assert "a near tie" in difference.why and "on ['n/1'] in the replay" in difference.why
