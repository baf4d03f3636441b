"""What the live manager learns from its jobs' progress reports (docs/progress.md).

Each worker appends JSON lines to its `rank-R.progress` file (`$CORRAL_PROGRESS_FILE`); the
manager tails rank 0's (corral.progress.reader, bounded per read, so no job can stall or exhaust
it) every `progress_check_s`, the attempts' reads spread evenly over that period (a round reads
those whose turn it is, not every running attempt at once), and no more than `MAX_READS_PER_S`
reads a second in all (with more attempts running than that allows in `progress_check_s`, each
one's period is longer: 3 s with 3,000 running), and learns, per attempt:

* its step and the time of its latest report (a job whose reports stop is hung: the manager's
  hang detection reads `last_report_at`);
* its steps/s: over the reports of the last `RATE_WINDOW_S`, the first report of an attempt
  excluded from nothing but as a base, so start-up and checkpoint restore do not count;
* its loss curve (step, loss), kept across attempts, thinned: what optimus fits;
* its latest loss (a report without one, e.g. a step-only one, leaves the last loss shown), and
  the run's total steps where its reports say them and its spec does not (the ETA's).

Every report is stamped with the manager's clock, the moment it was read: a job's own `time`
is not trusted (a job that claims a million steps per second of its own time must not be
believed). The reports of one read share its moment, so a rate is measured from the latest
report of one read to the latest of another (the report nearest the moment of its read). An
attempt whose steps advance faster than `max_steps_per_s` over any span the manager measures
(`MIN_SPAN_S` or more) is rejected: what it measured is taken back from the profiles and
nothing more of it is folded in, its shown rate is none, and its problem says why
(`rejected`).

and per placement shape (corral.core.profiles.Shape: model, GPU type and count, nodes, the
partner's model when a GPU is shared, and the job's VC: a tenant's reports shape only its own
VC's profiles) the measured steps/s, folded into `Profiles` every
`FOLD_EVERY_S` (the manager's `profile_fold_s`) of an attempt's reports and when it ends, and
stored: the speeds `hetero`, `profile`, ElasticFlow and the jobs' lengths come from, and the pairs
Gandiva's packing judges.
An attempt's shape changes when another job starts or stops sharing its GPUs (`reshape`): what it
measured so far is folded under the old shape first; and the span until a new partner's first
report (its start-up) is measured under neither (`rebase`). The store keeps a job's progress (its
row's step, steps/s, loss), a thinned series of points (one per `POINT_EVERY_S` at most) and the
profiles, all written inside the control loop's transaction.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from corral.core.estimate import Progress, Sample, thin
from corral.core.job import Job
from corral.core.profiles import Measure, Profiles, Shape
from corral.progress.reader import ProgressTail, Report
from corral.server.store import ProfileRow, Store

#: Steps/s shown for a job is measured over its reports of this many seconds.
RATE_WINDOW_S = 60.0
#: An attempt's measured rate is folded into its shape's profile at least this often.
FOLD_EVERY_S = 30.0
#: The shortest span of reports a rate is taken from (shorter spans are noise).
MIN_SPAN_S = 1.0
#: A job's progress is stored as a point at most this often.
POINT_EVERY_S = 5.0
#: Loss samples kept per job in memory (thinned evenly beyond it, as optimus does).
MAX_SAMPLES = 2000
#: The most steps/s an attempt may be measured at (the manager's `max_steps_per_s`): faster,
#: its reports are rejected. A training step that runs on an accelerator takes tens of kernel
#: launches at several microseconds each: 10 microseconds a step is already beyond any.
MAX_STEPS_PER_S = 100_000.0
#: The most progress files read a second, all running attempts together (the manager's
#: `progress_reads_per_s`). Each read is a system call or two and some Python inside the
#: control loop's round (5 to 10 us): at most 5 to 10 ms of each second of the loop, however
#: many attempts run; with 3,000 running, each one's reports are read every 3 s, not every 1 s.
MAX_READS_PER_S = 1000.0


def progress_file(attempt_dir: Path, rank: int = 0) -> Path:
    """Where a worker's reports are (the supervisor creates it: corral.exec.shim, and the Ray
    executor copies it there from the worker's node)."""
    return attempt_dir / f"rank-{rank}.progress"


def stored_profiles(store: Store) -> Profiles:
    """The measured throughputs the store holds, each VC's, and the models marked shared (what
    the manager's plugins and `export-trace` read)."""
    return Profiles(
        {
            Shape(row.model, row.gpu_type, row.gpus, row.nodes, row.colocated, row.vc): Measure(
                row.steps_per_s, row.seconds, row.runs, row.samples_per_s
            )
            for row in store.profiles()
        },
        shared=[row.model for row in store.shared_models()],
    )


class Fold(NamedTuple):
    """One measurement an attempt folded into a profile (taken back if the attempt is
    rejected)."""

    shape: Shape
    steps_per_s: float
    seconds: float
    samples_per_s: float | None
    new_run: bool


@dataclass(slots=True)
class Watch:
    """One running attempt whose reports the manager reads."""

    job_id: str
    attempt: int
    shape: Shape
    tail: ProgressTail
    #: When the attempt started, or its latest report arrived (the manager's clock).
    last_report_at: float
    first: Report | None = None
    last: Report | None = None
    #: The report up to which this attempt's rate is in its shape's profile.
    folded: Report | None = None
    counted_run: bool = False
    recent: deque[Report] = field(default_factory=lambda: deque(maxlen=256))
    stored_at: float = -math.inf
    reports: int = 0
    #: What it folded into the profiles so far.
    folds: list[Fold] = field(default_factory=list)
    #: Why its reports were rejected ("" while they were not).
    rejected: str = ""
    #: Its spec declares `total_steps`: the total its reports say is not stored over it.
    declared_total: bool = False
    #: The total steps last stored from its reports.
    reported_total: float | None = None

    def window(self) -> tuple[Report, Report] | None:
        """The first and the latest of the reports of the last RATE_WINDOW_S (None: none)."""
        last = self.last
        if last is None or not self.recent:
            return None
        base = next((r for r in self.recent if r.time >= last.time - RATE_WINDOW_S), self.recent[0])
        return base, last

    def rate(self) -> float | None:
        """Steps/s over the reports of the last RATE_WINDOW_S (None: too few yet)."""
        window = self.window()
        return None if window is None else steps_per_s(*window)


def steps_per_s(base: Report, last: Report) -> float | None:
    """Steps/s from one report to a later one; None over less than MIN_SPAN_S (noise) or when
    the steps did not advance."""
    span = last.time - base.time
    if span < MIN_SPAN_S or last.step <= base.step:
        return None
    return (last.step - base.step) / span


@dataclass(slots=True)
class JobCurve:
    """A job's progress over all its attempts: its latest step and its (step, loss) samples."""

    step: float = 0.0
    samples: list[Sample] = field(default_factory=list)

    def add(self, step: float, loss: float | None) -> None:
        self.step = step
        if loss is not None:
            self.samples.append((step, loss))
            if len(self.samples) > MAX_SAMPLES:
                self.samples = thin(self.samples, MAX_SAMPLES // 2)


class Telemetry:
    """The reports of the running attempts, the jobs' curves and the cluster's profiles."""

    def __init__(
        self,
        store: Store,
        fold_every_s: float = FOLD_EVERY_S,
        max_steps_per_s: float | None = MAX_STEPS_PER_S,
        read_every_s: float | None = None,
        max_reads_per_s: float | None = MAX_READS_PER_S,
    ) -> None:
        """`read_every_s`: each attempt's reports are read once every so many seconds, the
        attempts' turns spread evenly over it, by `poll` (None or 0: each `poll` reads every
        attempt); with more attempts than `max_reads_per_s` x `read_every_s`, once every
        (attempts / `max_reads_per_s`) seconds (None: no such bound)."""
        self.store = store
        self.fold_every_s = fold_every_s
        self.read_every_s = read_every_s or None  # a period of 0 has no turns to spread
        self.max_reads_per_s = max_reads_per_s
        #: The watches' next turns (when, tie-break, watch), with `read_every_s`; an entry
        #: whose watch ended or was replaced is dropped when its turn comes.
        self._turns: list[tuple[float, int, Watch]] = []
        self._watched = 0  # watches made so far: where the next one's turn falls in the period
        self._order = itertools.count()  # ties of turns: in the order they were given
        #: Faster than this, an attempt's reports are rejected (None: no ceiling).
        self.max_steps_per_s = max_steps_per_s
        #: Set when a measurement of jobs sharing GPUs was folded in (the manager then lets the
        #: scheduler judge its pairs again); the manager clears it.
        self.shared_measured = False
        self.profiles = Profiles()
        self.watches: dict[str, Watch] = {}  # job id -> its running attempt's
        self.curves: dict[str, JobCurve] = {}
        #: Per job, report lines its running attempt wrote that were not reports, and the latest
        #: problem (`GET /api/v1/jobs/ID` shows them; the job is not stopped for them).
        self.malformed: dict[str, tuple[int, str]] = {}
        #: Per job, why its running attempt's reports were rejected (one line).
        self.rejected: dict[str, str] = {}
        self.load()

    def load(self) -> None:
        """The profiles the store holds (at start, and on a rebuild)."""
        self.profiles = stored_profiles(self.store)

    # -- attempts ------------------------------------------------------------------------------

    def watch(
        self,
        job_id: str,
        attempt: int,
        path: Path,
        shape: Shape,
        now: float,
        *,
        resumed: bool,
        declared_total: bool = False,
    ) -> None:
        """Read the reports of an attempt from now on. `resumed`: a running attempt found again
        after a restart (what it reported before was read then: it is skipped, so that no
        measurement counts twice). `declared_total`: the job's spec declares its `total_steps`
        (then the total its reports say is not stored over it)."""
        tail = ProgressTail(path)
        watch = Watch(job_id, attempt, shape, tail, now, declared_total=declared_total)
        self.rejected.pop(job_id, None)  # an earlier attempt's (its event stays)
        if resumed:
            tail.skip_to_end()
        self.watches[job_id] = watch
        if self.read_every_s is not None:
            # Its first turn at a fraction of the period that keeps the turns evenly spread
            # (the golden ratio's sequence), however many attempts start together.
            self._watched += 1
            phase = (self._watched * 0.6180339887498949) % 1.0
            self._turn(watch, now + self.period() * phase)

    def period(self) -> float:
        """The time between two reads of an attempt's reports, with `read_every_s`: that, or
        longer where the attempts running would be read more than `max_reads_per_s` times a
        second."""
        assert self.read_every_s is not None
        if self.max_reads_per_s is None:
            return self.read_every_s
        return max(self.read_every_s, len(self.watches) / self.max_reads_per_s)

    def _turn(self, watch: Watch, when: float) -> None:
        heapq.heappush(self._turns, (when, next(self._order), watch))

    def due(self, now: float) -> bool:
        """Whether `poll` has attempts to read at `now` (always, without `read_every_s`)."""
        return self.read_every_s is None or bool(self._turns and self._turns[0][0] <= now)

    def reshape(self, job_id: str, shape: Shape, now: float) -> None:
        """The attempt's shape changed (a job started or stopped sharing its GPUs): its reports
        so far are folded under the old shape, and its rate starts again from its latest one."""
        watch = self.watches.get(job_id)
        if watch is None or watch.shape == shape:
            return
        self._read(watch, now)
        self._fold(watch, now)
        watch.shape = shape
        watch.counted_run = False  # its first measurement of the new shape is a run of it
        self.rebase(job_id)

    def rebase(self, job_id: str) -> None:
        """Measure the attempt's rate from its latest report on, dropping what it reported since
        its last fold (e.g. while a new partner on its GPUs was still starting up)."""
        watch = self.watches.get(job_id)
        if watch is None or watch.last is None:
            return
        watch.folded = watch.last
        watch.recent.clear()
        watch.recent.append(watch.last)

    def unwatch(self, job_id: str, now: float) -> None:
        """The attempt ended: read what it wrote last and fold its rate into its profile."""
        watch = self.watches.pop(job_id, None)
        if watch is None:
            return
        self._read(watch, now)
        self._fold(watch, now)

    def fold_all(self, now: float) -> None:
        """Fold every running attempt's measured rate into the profiles (the manager stops: a
        restarted one reads on from the end of each file, `watch(resumed=True)`)."""
        for watch in self.watches.values():
            self._fold(watch, now)

    def forget(self, job_id: str) -> None:
        """The job ended: its curve is in the store, no longer needed in memory."""
        self.watches.pop(job_id, None)
        self.curves.pop(job_id, None)
        self.malformed.pop(job_id, None)
        self.rejected.pop(job_id, None)

    def share(self, model: str, shared: bool, by: str, now: float) -> bool:
        """An admin marks `model` shared (every VC reads every VC's measurements of it) or
        not: stored, then in the profiles the plugins read. Returns whether it changed."""
        changed = self.store.set_shared(model, shared, by, now)
        return self.profiles.share(model, shared) or changed

    def poll(self, now: float) -> list[str]:
        """Read the running attempts' new reports: every attempt's, or with `read_every_s` those
        whose turn has come; returns the jobs whose attempt reported for the first time."""
        first = []
        for watch in self._readable(now):
            silent = watch.reports == 0
            if self._read(watch, now) and silent:
                first.append(watch.job_id)
            if watch.folded is not None and watch.last is not None:
                if watch.last.time - watch.folded.time >= self.fold_every_s:
                    self._fold(watch, now)
        return first

    def _readable(self, now: float) -> list[Watch]:
        """The watches `poll` reads now; with `read_every_s`, each gets its next turn."""
        if self.read_every_s is None:
            return list(self.watches.values())
        period, turns, ready = self.period(), self._turns, []
        while turns and turns[0][0] <= now:
            when, _, watch = heapq.heappop(turns)
            if self.watches.get(watch.job_id) is not watch:
                continue  # ended, or another attempt's now
            ready.append(watch)
            # Its next turn, one period on; turns missed (a round that took long) are skipped,
            # its place in the period kept (the turns stay spread).
            self._turn(watch, when + period * (1 + math.floor((now - when) / period)))
        return ready

    def _read(self, watch: Watch, now: float) -> bool:
        reports = watch.tail.read(now)
        if watch.tail.malformed or watch.tail.last_error:
            self.malformed[watch.job_id] = (watch.tail.malformed, watch.tail.last_error)
        if not reports:
            return False
        curve = self.curve(watch.job_id)
        previous = watch.last.step if watch.last is not None else None
        went_back = False
        for report in reports:
            if previous is not None and report.step < previous:
                went_back = True  # the job went back (a restore): rates start again
            previous = report.step
            curve.add(report.step, report.loss)
        newest = reports[-1]
        # The manager's clock, not the job's: the moment this read found it.
        latest = Report(now, newest.step, newest.loss, newest.samples)
        if watch.first is None:
            watch.first = watch.folded = latest
        elif went_back:
            watch.folded = latest
            watch.recent.clear()
        watch.last = latest
        watch.recent.append(latest)
        watch.reports += len(reports)
        watch.last_report_at = now
        window = None if watch.rejected else watch.window()
        rate = None if window is None else steps_per_s(*window)
        if rate is not None and window is not None:
            if self._implausible(watch, rate, *window, now):
                rate = None
        columns: dict[str, float | None] = {
            "step": latest.step,
            "steps_per_s": rate,
            "progress_at": now,
        }
        # The latest loss the reports gave: a report without one (a step-only report between
        # two logged losses) keeps the last one known, from this attempt or an earlier one.
        loss = next((r.loss for r in reversed(reports) if r.loss is not None), None)
        if loss is not None:
            columns["loss"] = loss
        total = next((r.total_steps for r in reversed(reports) if r.total_steps), None)
        if total is not None and not watch.declared_total and total != watch.reported_total:
            columns["total_steps"] = watch.reported_total = total
        self.store.update_job(watch.job_id, **columns)
        if now - watch.stored_at >= POINT_EVERY_S:
            watch.stored_at = now
            self.store.add_progress(watch.job_id, watch.attempt, now, latest.step, latest.loss)
        return True

    def _implausible(
        self, watch: Watch, rate: float, base: Report, last: Report, now: float
    ) -> bool:
        """Reject the attempt if `rate` (from `base` to `last`) is above the ceiling: what it
        folded is taken back, nothing more of it is, and its problem and an event say why."""
        ceiling = self.max_steps_per_s
        if ceiling is None or rate <= ceiling:
            return False
        watch.rejected = (
            f"attempt {watch.attempt}: rejected: {rate:.4g} steps/s (step {base.step:.12g} to "
            f"{last.step:.12g} in {last.time - base.time:.3g} s by the manager's clock) is above "
            f"the ceiling of {ceiling:g} steps/s (max_steps_per_s); none of its measurements "
            "count"
        )
        self.rejected[watch.job_id] = watch.rejected
        for fold in reversed(watch.folds):
            measure = self.profiles.withdraw(
                fold.shape,
                fold.steps_per_s,
                fold.seconds,
                samples_per_s=fold.samples_per_s,
                run=fold.new_run,
            )
            if measure is None:
                self.store.delete_profile(_profile_row(fold.shape, None, now))
            else:
                self.store.save_profile(_profile_row(fold.shape, measure, now))
            if fold.shape.colocated:
                self.shared_measured = True
        watch.folds.clear()
        self.store.add_event(watch.job_id, now, "progress", watch.rejected)
        return True

    def _fold(self, watch: Watch, now: float) -> None:
        if watch.rejected:
            return
        base, last = watch.folded, watch.last
        rate = None if base is None or last is None else steps_per_s(base, last)
        if rate is None:
            return
        assert base is not None and last is not None
        if self._implausible(watch, rate, base, last, now):
            return
        span = last.time - base.time
        samples = None
        if base.samples is not None and last.samples is not None and last.samples > base.samples:
            samples = (last.samples - base.samples) / span
        new_run = not watch.counted_run
        measure = self.profiles.add(
            watch.shape,
            rate,
            span,
            samples_per_s=samples,
            new_run=new_run,
        )
        watch.folded = last
        if measure is None:
            return
        watch.folds.append(Fold(watch.shape, rate, span, samples, new_run))
        watch.counted_run = True
        shape = watch.shape
        if shape.colocated:
            self.shared_measured = True
        self.store.save_profile(_profile_row(shape, measure, now))

    # -- what the plugins and the views ask ----------------------------------------------------

    def last_report_at(self, job_id: str) -> float | None:
        watch = self.watches.get(job_id)
        return None if watch is None else watch.last_report_at

    def curve(self, job_id: str) -> JobCurve:
        """The job's curve, from the store if this manager has not read it yet (a restart)."""
        curve = self.curves.get(job_id)
        if curve is None:
            curve = self.curves[job_id] = JobCurve()
            for point in self.store.progress(job_id):
                curve.add(point.step, point.loss)
        return curve

    def observe(self, job: Job, now: float) -> Progress:
        """Optimus's view of a job: its step and its loss samples."""
        curve = self.curve(job.id)
        return Progress(steps_done=curve.step, samples=tuple(curve.samples))


def _profile_row(shape: Shape, measure: Measure | None, now: float) -> ProfileRow:
    """The store's row of a shape's measurement (None: only its key, to delete it)."""
    return ProfileRow(
        model=shape.model,
        gpu_type=shape.gpu_type,
        gpus=shape.gpus,
        nodes=shape.nodes,
        colocated=shape.colocated,
        steps_per_s=measure.steps_per_s if measure is not None else 0.0,
        samples_per_s=measure.samples_per_s if measure is not None else None,
        seconds=measure.seconds if measure is not None else 0.0,
        runs=measure.runs if measure is not None else 0,
        updated_at=now,
        vc=shape.vc,
    )
