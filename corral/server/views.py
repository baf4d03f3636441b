"""The live manager's read views for the API: why a job waits, the queue, who holds which GPU.

Each takes the manager's lock, reads, and changes nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NamedTuple

from corral.core.actions import Start
from corral.core.cluster import Cluster
from corral.core.job import JobStatus
from corral.core.protocol import SchedulerCore
from corral.core.queues import QueueTree
from corral.server.state import Attempt
from corral.server.store import JobProgress
from corral.server.telemetry import Telemetry


class GpuHolder(NamedTuple):
    """A job holding a GPU: its share (milli-GPU, 1000 for a whole GPU), and whether it is
    stopping (preempted or cancelled, its processes not yet gone)."""

    job_id: str
    milli: int
    stopping: bool


class ManagerViews:
    """The part of `Manager` that answers the API's questions (describe, the queue, /metrics and
    the dashboard) from the core's state and the manager's attempts."""

    # The manager's state this part reads (Manager.__init__ sets it).
    lock: threading.RLock
    clock: Callable[[], float]
    scheduler: SchedulerCore
    vc_quota: dict[str, int]
    vc_tree: QueueTree | None
    _attempts: dict[str, Attempt]
    _draining: dict[tuple[str, int], tuple[int, ...]]
    _deferred: dict[str, Start]
    telemetry: Telemetry
    _wake_at: float | None
    cluster: Cluster
    _unusable: set[str]
    _tainted: dict[tuple[str, int], tuple[int, ...]]

    if TYPE_CHECKING:  # the manager's own

        def gpu_name(self, gpu: int) -> str: ...
        def gate_reason(self, job_id: str) -> str | None: ...

    def offline_gpus(self) -> set[int]:
        """The GPUs held out of allocation: on nodes that left (until they are dropped or come
        back), or used by processes that an ended attempt left behind (/metrics)."""
        with self.lock:
            held = {gpu for gpus in self._tainted.values() for gpu in gpus}
            for node in self.cluster.nodes:
                if node.name in self._unusable:
                    held.update(self.cluster.node_gpus[node.index])
            return held

    def next_round_at(self) -> float | None:
        """When the control loop decides next though nothing else happens: the core's next timer
        (a LAS queue crossing, a relax deadline, a retry's backoff), or None."""
        with self.lock:
            return self._wake_at

    def why(self, job_id: str) -> str:
        """Why the job is where it is (the core's explanation, plus a deferred start)."""
        with self.lock:
            if job_id in self._deferred:
                return "starting: waiting for a stopped job's processes to release its GPUs"
            gated = self.gate_reason(job_id)  # held, dependencies, array cap
            if gated is not None:
                return gated
            job = self.scheduler.jobs.get(job_id)
            if job is None:
                return "submitted: waiting for the next scheduling round"
            if job.status is JobStatus.PENDING:
                return self.scheduler.explain(job_id, self.clock())
            return job.last_event

    def queue(
        self, limit: int, visible: Callable[[str, str], bool] | None = None
    ) -> tuple[int, dict[str, str]]:
        """The waiting jobs in the order the scheduler considers them: how many there are (that
        `visible(user, vc)` admits), and the first `limit` with why each waits."""
        with self.lock:
            now = self.clock()
            total = 0
            first: dict[str, str] = {}
            for job in self.scheduler.pending_jobs():
                if visible is not None and not visible(job.spec.user, job.spec.vc):
                    continue
                total += 1
                if len(first) < limit:
                    first[job.id] = self.scheduler.explain(job.id, now)
            return total, first

    def pending_reasons(self, job_ids: Iterable[str]) -> dict[str, str]:
        with self.lock:
            return {job_id: self.why(job_id) for job_id in job_ids}

    def estimate(
        self, job_id: str, declared: dict[str, Any], progress: JobProgress | None
    ) -> dict[str, object] | None:
        """A waiting or running job's estimated remaining run time, and what it came from: the
        policy's own estimate where it makes one (optimus: its loss-curve fit, or its prior; the
        estimate its key holds now), else what the job declared (`declared`, its spec):
        `total_steps` at the measured rate, or `time_limit` less the time it ran. None: none."""
        with self.lock:
            job = self.scheduler.jobs.get(job_id)
            if job is None or job.status not in (JobStatus.PENDING, JobStatus.RUNNING):
                return None
            now = self.clock()
            policy = self.scheduler.policy
            found = policy.remaining(job, now)
            attempt = self._attempts.get(job_id) if job.status is JobStatus.RUNNING else None
            ran = job.executed_at(now)
        if found is not None:
            return {
                "remaining_s": found.remaining_s,
                "source": found.source,
                "basis": f"{policy.name}: {found.basis}",
            }
        total_steps, time_limit = declared.get("total_steps"), declared.get("time_limit")
        said = "declared"
        if total_steps is None and progress is not None and progress.total_steps is not None:
            total_steps, said = progress.total_steps, "reported"  # its progress reports say it
        if total_steps is not None and progress is not None and progress.steps_per_s:
            # (counted down from the latest report only while the attempt that made it runs)
            running_since = None if attempt is None else attempt.started_at
            left = replace(progress, total_steps=total_steps).eta_s(now, running_since)
            assert left is not None
            return {
                "remaining_s": left,
                "source": "total_steps",
                "basis": f"{said} total_steps {total_steps:g}, step {progress.step:g}, at the "
                f"measured {progress.steps_per_s:.3g} steps/s",
            }
        if time_limit is not None:
            return {
                "remaining_s": max(0.0, time_limit - ran),
                "source": "time_limit",
                "basis": f"declared time_limit {time_limit:g} s, {ran:.0f} s run",
            }
        return None

    def progress_problems(self, job_id: str) -> dict[str, object] | None:
        """What was wrong with the running attempt's progress file, if anything: lines that
        were not reports, and the latest problem (one line); why its reports were rejected (one
        line, `rejected`)."""
        with self.lock:
            found = self.telemetry.malformed.get(job_id)
            rejected = self.telemetry.rejected.get(job_id)
        if found is None and rejected is None:
            return None
        malformed, last_error = found or (0, "")
        return {"malformed_lines": malformed, "last_error": last_error, "rejected": rejected}

    def running_since(self, job_id: str) -> float | None:
        """When the job's running attempt started (the manager's clock; None: none runs)."""
        with self.lock:
            attempt = self._attempts.get(job_id)
            return None if attempt is None else attempt.started_at

    def placement_of(self, job_id: str) -> list[str]:
        with self.lock:
            attempt = self._attempts.get(job_id)
            return [self.gpu_name(g) for g in attempt.gpus] if attempt else []

    def gpu_owners(self) -> dict[int, str]:
        """GPU -> a job whose processes hold it (running, or still stopping): the first of
        `gpu_holders` (one of the jobs sharing a GPU)."""
        return {gpu: held[0].job_id for gpu, held in self.gpu_holders().items()}

    def gpu_holders(self) -> dict[int, list[GpuHolder]]:
        """GPU -> every job whose processes hold it, with its share: the running ones (several
        on a GPU shared by fractions) in the order they started, then those still stopping."""
        with self.lock:
            holders: dict[int, list[GpuHolder]] = {}
            running = sorted(self._attempts.items(), key=lambda item: item[1].started_at)
            stopping = [(job_id, gpus, True) for (job_id, _), gpus in self._draining.items()]
            for job_id, gpus, draining in [(j, a.gpus, False) for j, a in running] + stopping:
                job = self.scheduler.jobs.get(job_id)
                milli = job.spec.gpu_milli if job is not None and job.spec.gpus else 1000
                for gpu in gpus:
                    holders.setdefault(gpu, []).append(GpuHolder(job_id, milli, draining))
            return holders

    def counts_by_vc(self) -> dict[str, dict[str, int]]:
        """Per VC: pending and running jobs, and GPUs allocated."""
        with self.lock:
            counts = {vc: {"pending": 0, "running": 0, "gpus": 0} for vc in self.vc_quota}
            for job in self.scheduler.pending_jobs():
                counts[job.spec.vc]["pending"] += 1
            for job in self.scheduler.running_jobs():
                counts[job.spec.vc]["running"] += 1
                counts[job.spec.vc]["gpus"] += job.spec.gpus
            return counts

    def vc_rows(self) -> list[dict[str, Any]]:
        """The VCs as `GET /vcs` lists them: flat, each VC's guaranteed and allocated GPUs and
        its jobs; under departments, the tree depth-first (each department before its
        children), with each level's quota, GPUs used and borrowed (used beyond its quota),
        over-quota weight and limit (a department's counts are its children's together)."""
        counts = self.counts_by_vc()
        tree = self.vc_tree
        if tree is None:
            return [
                {
                    "name": vc,
                    "guaranteed_gpus": self.vc_quota[vc],
                    "allocated_gpus": counts[vc]["gpus"],
                    "pending": counts[vc]["pending"],
                    "running": counts[vc]["running"],
                }
                for vc in sorted(self.vc_quota)
            ]
        totals = {name: {"pending": 0, "running": 0, "gpus": 0} for name in tree.queues}
        for vc, count in counts.items():
            for name in tree.chain(vc) if vc in tree.queues else ():
                for key, value in count.items():
                    totals[name][key] += value
        rows: list[dict[str, Any]] = []

        def add(name: str, depth: int) -> None:
            queue = tree.queues[name]
            used = totals[name]["gpus"]
            rows.append(
                {
                    "name": name,
                    "kind": "vc" if queue.is_vc else "department",
                    "parent": queue.parent,
                    "depth": depth,
                    "guaranteed_gpus": queue.quota,
                    "allocated_gpus": used,
                    "borrowed_gpus": max(0, used - queue.quota),
                    "weight": queue.weight,
                    "limit": queue.limit,
                    "pending": totals[name]["pending"],
                    "running": totals[name]["running"],
                }
            )
            for child in tree.children(name):
                add(child, depth + 1)

        for top in tree.children(None):
            add(top, 0)
        return rows
