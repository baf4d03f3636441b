"""A replay's decisions against the live manager's: which it made as the manager did, and why not.

`corral export-trace` writes the manager's decisions beside the trace (`NAME.decisions.jsonl`);
the replay under the manager's own policy and placement makes its own (`SimResult.decisions`).
`compare` pairs them up, each start or preemption of a job with the same one of the same job
(its first start with its first start, its second preemption with its second), and says for each
decision that differs (made by one side only, at instants more than `TOLERANCE_S` apart, on other
GPUs, or by another job) what made it differ, as far as the replay can tell:

* a job whose end the replay timed otherwise (its work is what it did live; it ends otherwise
  when it started otherwise), or whose gate, hold or failure it could not replay as live
  (`ReplayNote`);
* decisions the live manager made within `TOLERANCE_S` of each other in one order and the replay
  in the other (a near tie: which of two things came first in real time, that a real run's
  control loop sees in one pass or in two);
* else the live manager's timing the simulator does not model: a control loop that decides once
  per pass, a start that waits for a preempted job's processes to exit.

It also checks what a replay is meant to reproduce: the order of the jobs' first starts, and
which jobs were preempted.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from corral.core.tracefile import decision_order
from corral.sim.replay import ReplayNote

#: Decisions of the two sides this many seconds apart or less are made at the same instant: the
#: live control loop's pass, a process's start and exit on a loaded machine, are well within it.
TOLERANCE_S = 1.0

Record = Mapping[str, object]


@dataclass(slots=True)
class Difference:
    live: Record | None
    replay: Record | None
    why: str

    def record(self) -> dict[str, object]:
        return {"live": self.live, "replay": self.replay, "why": self.why}


@dataclass(slots=True)
class ReplayCheck:
    """The replay's decisions against the manager's (see the module)."""

    decisions: int  # the manager's
    same: int  # of those, made by the replay as the manager did
    first_starts_same: bool
    preempted_same: bool
    live_first_starts: list[str]
    replay_first_starts: list[str]
    live_preempted: list[str]
    replay_preempted: list[str]
    differences: list[Difference] = field(default_factory=list)
    notes: list[ReplayNote] = field(default_factory=list)
    #: Jobs whose end the replay timed otherwise: (job, live end, replay end), in live time.
    ends: list[tuple[str, float, float]] = field(default_factory=list)

    def summary(self) -> str:
        order = "the same" if self.first_starts_same else "NOT the same"
        preempted = "the same" if self.preempted_same else "NOT the same"
        return (
            f"{self.same} of {self.decisions} decisions as the manager's (same job, GPUs and "
            f"instant within {TOLERANCE_S:g} s); order of first starts {order}, preempted jobs "
            f"{preempted}; {len(self.differences)} differ, {len(self.notes)} note(s)"
        )

    def records(self) -> list[dict[str, object]]:
        """The lines of the differences file: each differing decision, then each note."""
        lines = [difference.record() for difference in self.differences]
        lines += [note.record() for note in self.notes]
        lines += [
            {"job": job, "ended_live": live, "ended_replay": replay, "note": "ended otherwise"}
            for job, live, replay in self.ends
        ]
        return lines


def read_decisions(path: Path) -> list[dict[str, object]]:
    """The manager's decision log (`NAME.decisions.jsonl`)."""
    records = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{path}: line {number}: not JSON: {exc}") from None
        if not isinstance(record, dict) or record.get("action") not in ("start", "preempt"):
            raise ValueError(f"{path}: line {number}: action: must be start or preempt")
        records.append(record)
    return sorted(records, key=decision_order)


def _keyed(records: Iterable[Record]) -> dict[tuple[str, str, int], Record]:
    seen: dict[tuple[str, str], int] = {}
    keyed = {}
    for record in records:
        pair = (str(record["action"]), str(record["job"]))
        seen[pair] = seen.get(pair, 0) + 1
        keyed[(*pair, seen[pair])] = record
    return keyed


def first_starts(records: Sequence[Record]) -> list[str]:
    order: list[str] = []
    for record in records:
        if record["action"] == "start" and str(record["job"]) not in order:
            order.append(str(record["job"]))
    return order


def preempted(records: Sequence[Record]) -> list[str]:
    return sorted({str(r["job"]) for r in records if r["action"] == "preempt"}, key=_id_key)


def _id_key(job: str) -> tuple[int, int, str]:
    return (0, int(job), "") if job.isdigit() else (1, 0, job)


def compare(
    live: Sequence[Record],
    replay: Sequence[Record],
    notes: Sequence[ReplayNote] = (),
    ends: Mapping[str, tuple[float | None, float | None]] | None = None,
) -> ReplayCheck:
    """The replay's decisions (`replay`) against the manager's (`live`), both in
    `decision_order`; `notes`: what the replay could not do as live; `ends`: each job's end,
    (live, replay)."""
    ended_otherwise = sorted(
        (
            (job, at_live, at_replay)
            for job, (at_live, at_replay) in (ends or {}).items()
            if at_live is not None
            and at_replay is not None
            and abs(at_live - at_replay) > TOLERANCE_S
        ),
        key=lambda item: item[1],
    )
    check = ReplayCheck(
        decisions=len(live),
        same=0,
        first_starts_same=first_starts(live) == first_starts(replay),
        preempted_same=preempted(live) == preempted(replay),
        live_first_starts=first_starts(live),
        replay_first_starts=first_starts(replay),
        live_preempted=preempted(live),
        replay_preempted=preempted(replay),
        notes=list(notes),
        ends=ended_otherwise,
    )
    by_live, by_replay = _keyed(live), _keyed(replay)
    live_at = [float(str(r["at"])) for r in live]
    for key in sorted(
        set(by_live) | set(by_replay),
        key=lambda k: decision_order(by_live.get(k) or by_replay[k]),
    ):
        mine, theirs = by_replay.get(key), by_live.get(key)
        if mine is not None and theirs is not None:
            gap = float(str(mine["at"])) - float(str(theirs["at"]))
            if (
                abs(gap) <= TOLERANCE_S
                and mine["gpus"] == theirs["gpus"]
                and mine.get("by") == theirs.get("by")
            ):
                check.same += 1
                continue
        check.differences.append(Difference(theirs, mine, _why(key, theirs, mine, check, live_at)))
    return check


def _why(
    key: tuple[str, str, int],
    live: Record | None,
    replay: Record | None,
    check: ReplayCheck,
    live_at: list[float],
) -> str:
    action, job, number = key
    what = f"{action} {number} of job {job}"
    at = float(str((live or replay or {}).get("at", 0.0)))
    causes = [note.what for note in check.notes if note.job == job and note.at <= at + TOLERANCE_S]
    earlier = [end for end in check.ends if min(end[1], end[2]) <= at + TOLERANCE_S]
    if earlier:
        other, at_live, at_replay = earlier[-1]
        causes.append(f"job {other} ended at {at_live:.3f} s live, {at_replay:.3f} s in the replay")
    if live is None:
        head = f"{what}: made by the replay only (at {at:.3f} s)"
    elif replay is None:
        head = f"{what}: made by the manager only (at {at:.3f} s)"
    else:
        gap = float(str(replay["at"])) - float(str(live["at"]))
        parts = []
        if abs(gap) > TOLERANCE_S:
            parts.append(f"{gap:+.3f} s in the replay")
        if replay["gpus"] != live["gpus"]:
            parts.append(f"on {replay['gpus']} in the replay, {live['gpus']} live")
        if replay.get("by") != live.get("by"):
            parts.append(f"by job {replay.get('by')} in the replay, {live.get('by')} live")
        head = f"{what}: " + "; ".join(parts)
    if not causes:
        close = [t for t in live_at if t != at and abs(t - at) <= TOLERANCE_S]
        if close:
            causes.append(
                f"a near tie: the manager made {len(close)} other decision(s) within "
                f"{TOLERANCE_S:g} s of it, and real timing (its control loop's passes, processes "
                "starting and exiting) ordered them otherwise"
            )
        else:
            causes.append(
                "the live manager's timing, which the simulator does not model: its control loop "
                "decides once per pass, a start waits for a preempted job's processes to exit"
            )
    return head + ": " + "; ".join(causes)
