"""What one simulation run produces, before it is summarised and written out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from corral.core.actions import Action, Preempt, Start
from corral.core.job import Job
from corral.core.tracefile import decision_order
from corral.sim.jobstats import JobStats

if TYPE_CHECKING:
    from corral.sim.replaydiff import ReplayCheck


@dataclass(slots=True)
class Timeline:
    """Step functions sampled at every scheduling round: value holds from t[i] until t[i+1]."""

    time_s: list[float] = field(default_factory=list)
    allocated_gpus: list[int] = field(default_factory=list)
    pending_jobs: list[int] = field(default_factory=list)
    running_jobs: list[int] = field(default_factory=list)
    #: free GPUs outside wholly free nodes: they cannot host a job that needs a whole node
    stranded_gpus: list[int] = field(default_factory=list)

    def record(
        self, now: float, allocated: int, pending: int, running: int, stranded: int = 0
    ) -> None:
        if self.time_s and self.time_s[-1] == now:
            self.allocated_gpus[-1] = allocated
            self.pending_jobs[-1] = pending
            self.running_jobs[-1] = running
            self.stranded_gpus[-1] = stranded
            return
        self.time_s.append(now)
        self.allocated_gpus.append(allocated)
        self.pending_jobs.append(pending)
        self.running_jobs.append(running)
        self.stranded_gpus.append(stranded)


@dataclass(slots=True)
class TimelineTotals(Timeline):
    """A timeline in bounded memory, for a run too long to keep every round: `time_s` holds
    the first and the last instant only, the other lists the last values, and the sums below
    give what `corral.sim.metrics` computes from a whole timeline (utilization, utilization
    while jobs wait, fragmentation), the same up to floating-point rounding."""

    #: Over the whole span: GPU-seconds allocated, free and stranded; seconds with a job
    #: waiting and GPU-seconds allocated during those.
    allocated_gpu_s: float = 0.0
    free_gpu_s: float = 0.0
    stranded_gpu_s: float = 0.0
    waiting_s: float = 0.0
    allocated_waiting_gpu_s: float = 0.0
    total_gpus: int = 0  # set by the caller: free GPUs are counted against it

    def record(
        self, now: float, allocated: int, pending: int, running: int, stranded: int = 0
    ) -> None:
        times = self.time_s
        if times:
            last = len(times) - 1  # 0 or 1: the lists hold the first point and the last one
            dt = now - times[last]
            if dt > 0:
                held = self.allocated_gpus[last]
                self.allocated_gpu_s += held * dt
                self.free_gpu_s += (self.total_gpus - held) * dt
                self.stranded_gpu_s += self.stranded_gpus[last] * dt
                if self.pending_jobs[last] > 0:
                    self.waiting_s += dt
                    self.allocated_waiting_gpu_s += held * dt
            if last:  # the last point moves to `now`, in place
                times[1] = now
                self.allocated_gpus[1] = allocated
                self.pending_jobs[1] = pending
                self.running_jobs[1] = running
                self.stranded_gpus[1] = stranded
                return
        Timeline.record(self, now, allocated, pending, running, stranded)


@dataclass(slots=True)
class SimResult:
    policy: str
    placement: str
    cluster: str  # Cluster.describe()
    total_gpus: int
    jobs: list[Job]  # every job submitted, in submission order, with its final runtime state
    measured: set[str] | None  # ids of the jobs the metrics cover (None: all jobs)
    timeline: Timeline
    preemptions: int
    rounds: int
    wall_s: float
    options: dict[str, object] = field(default_factory=dict)
    #: further summary entries a caller computed (e.g. per-VC private baselines)
    annotations: dict[str, object] = field(default_factory=dict)
    #: Curves over arrived workload (corral.sim.fragmentation: `arrived_share` and a list per
    #: metric), when the run was probed; written as curves-<policy>-<placement>.csv.
    curves: dict[str, list[float]] = field(default_factory=dict)
    #: Every Start and Preempt the scheduler decided, with its instant, in order; written as
    #: decisions-<policy>-<placement>.jsonl (`decision_records`).
    decisions: list[tuple[float, Action]] = field(default_factory=list)
    #: Each GPU's name (`node/device`, as the live manager names it), by GPU id.
    gpu_names: list[str] = field(default_factory=list)
    #: A streamed run's jobs as they ended (`jobs` then holds only those left at its end, and
    #: its jobs CSV and decisions were written as it went); None: read from `jobs`.
    stats: JobStats | None = None
    #: A replay of a live manager's history under its own policy, against its decisions.
    replay_check: ReplayCheck | None = None

    def decision_records(self) -> list[dict[str, object]]:
        """The decisions as records of corral.core.tracefile (the live manager's history gives the
        same: corral.server.export's `decision_log`), GPUs by name in the core's order, in
        `decision_order` (in time; at one instant, preemptions first, then by job)."""
        records = (decision_record(at, action, self.gpu_names) for at, action in self.decisions)
        return sorted((r for r in records if r is not None), key=decision_order)


def decision_record(at: float, action: Action, names: list[str]) -> dict[str, object] | None:
    """A Start or Preempt as a record of corral.core.tracefile, GPUs by name (None: another
    action)."""
    gpus = [names[g] if g < len(names) else str(g) for g in action.gpus]
    if isinstance(action, Start):
        return {
            "at": at,
            "action": "start",
            "job": action.job_id,
            "gpus": gpus,
            "resumed": action.resumed,
        }
    if isinstance(action, Preempt):
        return {
            "at": at,
            "action": "preempt",
            "job": action.job_id,
            "gpus": gpus,
            "by": action.by_job_id,
        }
    return None
