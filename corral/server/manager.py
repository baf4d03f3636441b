"""The live manager: the core's Scheduler driven by real time, a store and an executor.

One control loop (a thread) owns every change of state. Each round it collects the attempts that
ended, asks the core to decide, writes what it decided to the store in one transaction, and only
then carries it out (starts processes, signals the ones to stop). Writing first is what makes a
crash at any point recoverable: an attempt the store calls running either has a supervisor
(found again on restart), has a result (its end is recorded then), or never started (requeued).

The API's threads call `submit`, `cancel` and the read methods under the same lock. A preempted
job's GPUs are free in the core at once, but its processes may take the grace period to leave:
a start on those GPUs waits (deferred) until they are gone, so two jobs never share a GPU.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from corral.core.actions import Preempt, Start
from corral.core.cluster import Cluster, NodeDef
from corral.core.job import Job, JobSpec, JobStatus
from corral.core.placement import make_placement
from corral.core.policy import make_policy
from corral.core.scheduler import Scheduler
from corral.core.tenancy.hived import HivedScheduler
from corral.core.tenancy.quota import QuotaAdmission
from corral.exec.local import (
    AttemptEnded,
    AttemptLaunch,
    RunAs,
    WorkerLaunch,
    own_directory,
    placement_worker_envs,
)
from corral.exec.logcap import DEFAULT_CAP_BYTES
from corral.server import identity
from corral.server.identity import AccountError
from corral.server.spec import JobSpecModel, argv, parse_job_spec, signal_number, to_core_spec
from corral.server.store import AttemptRow, JobRow, Store

log = logging.getLogger("corral.manager")

#: Finished jobs needed before Gittins takes its job-size distribution from this manager's own.
MIN_GITTINS_HISTORY = 20

#: Policies the live manager offers (the others need job lengths or a throughput table).
LIVE_POLICIES = ("fifo", "las", "gittins", "timeslice")
#: How VCs share the machine: GPU quotas (YARN-CS), or HiveD's guaranteed cells.
ADMISSIONS = ("quota", "hived")


class Executor(Protocol):
    def launch(self, launch: AttemptLaunch) -> None: ...
    def stop(self, job_id: str, attempt: int) -> None: ...
    def poll(self) -> list[AttemptEnded]: ...
    def recover(self, job_id: str, attempt: int, attempt_dir: Path) -> str | AttemptEnded: ...
    def leftover(self, job_id: str, attempt: int, attempt_dir: Path) -> int: ...
    def close(self) -> None: ...


class SubmitError(ValueError):
    """A job the manager refuses (unknown VC, too big for the cluster); nothing is stored."""


@dataclass(slots=True)
class ManagerSettings:
    policy: str = "las"
    #: "quota" (VCs own GPU counts) or "hived" (VCs own cells; needs the VCs' cells).
    admission: str = "quota"
    placement: str = "relax"
    relax_after_s: float = 60.0
    #: LAS / Gittins queue thresholds in GPU-seconds (Tiresias's defaults suit day-long jobs).
    las_thresholds_gpu_s: list[float] = field(default_factory=lambda: [3600.0, 36000.0])
    quantum_s: float = 600.0
    gittins_history_gpu_s: list[float] | None = None
    #: Backoff before retry n (from 1): base x 2^(n-1), at most `retry_backoff_max_s`.
    retry_backoff_s: float = 5.0
    retry_backoff_max_s: float = 300.0
    #: An attempt failing within this many seconds with the same error as the previous attempt
    #: is a repeat; this many repeats in a row end the job as a user error.
    fast_fail_s: float = 60.0
    fast_fail_repeats: int = 2
    tick_s: float = 0.2
    #: The longest grace period a job's spec may ask for (then SIGKILL).
    max_grace_s: float = 300.0
    #: The shortest time between two scheduling rounds.
    round_gap_s: float = 0.02
    #: How often a cluster whose nodes come and go (Ray) is read again.
    node_check_s: float = 1.0
    #: Where jobs' checkpoint dirs go (one per job); storage every node sees. Default: the
    #: data dir's jobs/JOB/checkpoint.
    checkpoint_root: Path | None = None
    #: Run each user's jobs under their own Unix account (the manager runs as root); False: every
    #: job runs as the manager's own user (single-user mode).
    multi_user: bool = False
    #: Each worker's stdout and stderr keep at most this many bytes (the oldest are dropped).
    log_cap_bytes: int = DEFAULT_CAP_BYTES
    #: The API refuses (413) a request body longer than this (corral.server.limits).
    max_body_bytes: int = 1 << 20


@dataclass(slots=True)
class _Attempt:
    number: int
    gpus: tuple[int, ...]
    started_at: float


@dataclass(slots=True)
class _Submission:
    row: JobRow
    model: JobSpecModel
    spec: JobSpec
    #: Called once from the committing thread: None when stored and queued, else the error.
    finish: Callable[[BaseException | None], None]


@dataclass(slots=True)
class _Failure:
    signature: str  # exit code and reason with the last stderr line
    ran_s: float


class Manager:
    def __init__(
        self,
        store: Store,
        executor: Executor,
        cluster: Cluster,
        data_dir: Path,
        *,
        vc_quota: dict[str, int] | None = None,
        vc_cells: dict[str, dict[str, int]] | None = None,
        settings: ManagerSettings | None = None,
        clock: Callable[[], float] = time.time,
        nodes: Callable[[], list[NodeDef]] | None = None,
    ) -> None:
        """`nodes`, for a cluster whose machines come and go (Ray): the live nodes, read again
        every `node_check_s`; the cluster is rebuilt when they change."""
        self.store = store
        self.executor = executor
        self.cluster = cluster
        self.data_dir = Path(data_dir).resolve()  # job processes run elsewhere: no relative paths
        self.settings = settings or ManagerSettings()
        self.clock = clock
        self._quota_follows_cluster = not vc_quota
        self.vc_quota = dict(vc_quota) if vc_quota else {"default": cluster.total_gpus}
        self._nodes = nodes
        self._rebuilding = False
        self._unusable: set[str] = set()  # nodes that left, held out until they can be dropped
        self._next_node_check = 0.0
        self._gpu_ids = _gpu_ids_by_name(cluster)
        #: Each VC's guaranteed cells ({cell type: count}, as the config gives them), for hived.
        self.vc_cells = {vc: dict(cells) for vc, cells in (vc_cells or {}).items()}
        self.scheduler = self._make_scheduler()
        self.lock = threading.RLock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._attempts: dict[str, _Attempt] = {}  # job id -> its live (launched) attempt
        self._draining: dict[tuple[str, int], tuple[int, ...]] = {}  # stopping attempts' GPUs
        #: Ended attempts some of whose processes could not be ended: their GPUs stay out of
        #: allocation until those are gone (checked every `node_check_s`).
        self._tainted: dict[tuple[str, int], tuple[int, ...]] = {}
        self._next_taint_check = 0.0
        self._deferred: dict[str, Start] = {}  # started in the core, waiting for GPUs to drain
        self._failures: dict[str, list[_Failure]] = {}
        self._spec_models: dict[str, JobSpecModel] = {}
        self._accounts: dict[str, str] = {}  # job id -> Unix account (multi-user mode)
        self._retrying: set[str] = set()  # requeued after a failed attempt
        self._cancel_on_arrival: set[str] = set()  # cancelled while stored but not yet queued
        self._pristine_cluster = copy.deepcopy(cluster)  # to rebuild the core from the store
        self._dirty = True
        self._wake_at: float | None = None
        self.next_id = store.max_job_id() + 1
        self._inbox: deque[_Submission] = deque()
        self._inbox_lock = threading.Lock()
        self._inbox_ready = threading.Event()
        self._committer: threading.Thread | None = None
        self.rounds = 0
        self.on_stop: list[Callable[[], None]] = []  # e.g. release the data directory's lock
        self.round_seconds: list[float] = []  # latest rounds' durations (for /metrics)
        self.round_seconds_total = 0.0  # all rounds' (a Prometheus summary's sum only grows)

    # -- set-up -------------------------------------------------------------------------------

    def _make_scheduler(self) -> Scheduler | HivedScheduler:
        settings = self.settings
        if settings.admission not in ADMISSIONS:
            raise ValueError(
                f"unknown admission {settings.admission!r}; choose one of {', '.join(ADMISSIONS)}"
            )
        name = settings.policy
        if name not in LIVE_POLICIES:
            raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(LIVE_POLICIES)}")
        if name == "las":
            policy = make_policy(name, thresholds_gpu_s=settings.las_thresholds_gpu_s)
        elif name == "gittins":
            history = settings.gittins_history_gpu_s or self._service_history()
            policy = make_policy(
                name,
                service_samples_gpu_s=history,
                thresholds_gpu_s=settings.las_thresholds_gpu_s,
            )
        elif name == "timeslice":
            policy = make_policy(name, quantum_s=settings.quantum_s)
        else:
            policy = make_policy(name)
        options = {"relax_after_s": settings.relax_after_s} if settings.placement == "relax" else {}
        placement = make_placement(settings.placement, **options)
        if settings.admission == "hived":
            if not any(self.vc_cells.values()):
                raise ValueError(
                    "admission hived: the VCs need guaranteed cells (a --config with virtual_clusters)"
                )
            # The simulator's HiveD objects; idle cells are lent and reclaimed by preemption.
            return HivedScheduler(self.cluster, self.vc_cells, policy, placement, spill=True)
        admission = None
        if set(self.vc_quota) != {"default"}:  # VCs share by quota; idle GPUs are lent
            admission = QuotaAdmission(self.vc_quota, oversubscribe=True, lend_last=True)
        return Scheduler(self.cluster, policy, placement, admission=admission)

    def _service_history(self) -> list[float]:
        """Gittins's distribution of job sizes, as Tiresias learns it: the GPU-seconds of the jobs
        this manager finished; until there are enough, one spread over a minute to a day."""
        finished = [
            job.attained_gpu_s
            for job in self.store.finished_jobs()
            if job.status == "SUCCEEDED" and job.attained_gpu_s > 0
        ]
        return finished if len(finished) >= MIN_GITTINS_HISTORY else [60.0, 600.0, 3600.0, 86400.0]

    def gpu_name(self, gpu: int) -> str:
        node = self.cluster.gpu_node[gpu]
        return f"{self.cluster.nodes[node].name}/{self._device_index(gpu)}"

    def gpu_ids(self, names: Iterable[str | int]) -> tuple[int, ...]:
        """The GPU ids of stored GPU names ("node/device"); KeyError for a node that is gone.
        (Attempts stored before names were kept hold ids: those stay as they are.)"""
        return tuple(name if isinstance(name, int) else self._gpu_ids[name] for name in names)

    def _device_index(self, gpu: int) -> int:
        node = self.cluster.gpu_node[gpu]
        return list(self.cluster.node_gpus[node]).index(gpu)

    def job_dir(self, job_id: str) -> Path:
        return self.data_dir / "jobs" / job_id

    def work_dir(self, job_id: str) -> Path:
        """A job's working directory when its spec names none (the account's own)."""
        return self.job_dir(job_id) / "work"

    def checkpoint_dir(self, job_id: str) -> Path:
        root = self.settings.checkpoint_root
        return self.job_dir(job_id) / "checkpoint" if root is None else Path(root) / job_id

    def _worker_placement(self, gpus: tuple[int, ...], workers: int) -> list[tuple[str, list[int]]]:
        """Each worker's node and device indexes: the core's GPUs node by node, split into
        equal shares in that order (the core gives each node a multiple of a share)."""
        ordered = sorted(gpus, key=lambda g: (self.cluster.gpu_node[g], g))
        share = len(ordered) // workers
        placement = []
        for rank in range(workers):
            own = ordered[rank * share : (rank + 1) * share]
            nodes = {self.cluster.gpu_node[g] for g in own}
            if len(nodes) != 1:  # the core's placement keeps a worker's GPUs on one node
                raise ValueError(f"worker {rank}'s GPUs span {len(nodes)} nodes")
            node = self.cluster.nodes[nodes.pop()].name
            placement.append((node, [self._device_index(g) for g in own]))
        return placement

    def attempt_dir(self, job_id: str, attempt: int) -> Path:
        return self.job_dir(job_id) / f"attempt-{attempt}"

    # -- the loop -----------------------------------------------------------------------------

    def start(self) -> None:
        """Recover what the store holds, then run the control loop in a thread."""
        self.recover()
        self._thread = threading.Thread(target=self._run, name="corral-control-loop", daemon=True)
        self._thread.start()
        self._committer = threading.Thread(
            target=self._commit_loop, name="corral-submissions", daemon=True
        )
        self._committer.start()

    def stop(self) -> None:
        """Stop the loop; jobs keep running and are found again by the next start."""
        self._stopping.set()
        self._wake.set()
        self._inbox_ready.set()
        for thread in (self._committer, self._thread):
            if thread is not None:
                thread.join()
        self.executor.close()
        for release in self.on_stop:
            release()
        self.on_stop.clear()

    def _run(self) -> None:
        while not self._stopping.is_set():
            timeout = self.settings.tick_s
            self._wake.wait(timeout)
            self._wake.clear()
            try:
                decided = self.step()
            except Exception:  # e.g. the database failed mid-round: memory and store disagree
                log.exception("scheduling round failed; rebuilding the state from the store")
                decided = True
                try:
                    self.resync()
                except Exception:
                    log.exception("rebuilding failed; trying again")
                    self._stopping.wait(1.0)
            if decided:  # let submissions gather: one round for many, not one round each
                self._stopping.wait(self.settings.round_gap_s)

    def step(self) -> bool:
        """One pass: collect ended attempts, decide if anything changed, record it all in one
        transaction, then carry it out. Returns whether a scheduling round ran."""
        with self.lock:
            began = time.perf_counter()
            now = self.clock()
            ended = self.executor.poll()
            wake = self._wake_at is not None and now >= self._wake_at
            deciding = self._dirty or bool(ended) or wake
            stops: list[tuple[str, int]] = []
            with self.store.batch():
                for end in ended:
                    self._attempt_ended(end, now)
            if self._nodes is not None and now >= self._next_node_check:
                self._next_node_check = now + self.settings.node_check_s
                self._refresh_nodes()
                deciding = deciding or self._dirty  # rebuilt, or nodes came back
            self._hold_unusable()
            self._hold_tainted(now)
            with self.store.batch():
                if deciding:
                    self._dirty = False
                    decision = self.scheduler.decide(now)
                    self._wake_at = decision.wake_at
                    for action in decision.actions:
                        if isinstance(action, Start):
                            self._deferred[action.job_id] = action
                            continue
                        stop = self._record_preempt(action, now)
                        if stop is not None:
                            stops.append(stop)
                launches = self._record_ready_starts(now)
            for job_id, attempt in stops:
                self.executor.stop(job_id, attempt)
            for launch in launches:
                self._launch(launch, now)
            if deciding:
                self.rounds += 1
                took = time.perf_counter() - began
                self.round_seconds.append(took)
                self.round_seconds_total += took
                del self.round_seconds[:-1000]
            return deciding

    def _launch(self, launch: AttemptLaunch, now: float) -> None:
        """Spawn a recorded attempt; one that cannot even start is lost, like a dead supervisor.
        In multi-user mode it runs as its user's account, which must still exist."""
        try:
            launch.run_as = self._prepare_job_dirs(launch.job_id)
        except (OSError, ValueError) as error:  # AccountError is a ValueError
            reason = f"cannot start: {error}"
            ended = AttemptEnded(launch.job_id, launch.attempt, None, None, False, reason, "", now)
            with self.store.batch():
                self._attempt_ended(ended, now)
            return
        try:
            self.executor.launch(launch)
        except Exception as error:
            log.exception("attempt %s of job %s could not start", launch.attempt, launch.job_id)
            reason = f"lost: its supervisor could not start: {error}"
            ended = AttemptEnded(launch.job_id, launch.attempt, None, None, False, reason, "", now)
            with self.store.batch():
                self._attempt_ended(ended, now)

    def _refresh_nodes(self) -> None:
        """Read the live nodes again; rebuild the cluster when they changed. A node that left
        stays (its free GPUs offline) until the executor has reported the end of every attempt
        that ran there, so that no job is requeued while a worker of it may still run."""
        assert self._nodes is not None
        try:
            live = self._nodes()
        except Exception as error:  # e.g. Ray's head is unreachable: keep what we know
            log.warning("cannot read the cluster's nodes: %s", error)
            return
        known = {c.name: (c.total_gpus, c.gpu_type) for c in self._pristine_cluster.nodes}
        shape = {node.name: (node.gpus, node.gpu_type) for node in live}
        if shape == known:
            self._bring_back()  # nodes held out came back before they were dropped
            return
        gone = {name for name in known if name not in shape}
        busy = {self.cluster.nodes[self.cluster.gpu_node[g]].name for g in self._busy_gpus()}
        if not live or gone & busy:
            # Keep the cluster until the executor has reported the end of every attempt that
            # ran on a node that left; nothing new starts on those nodes meanwhile.
            unusable = gone if live else set(known)
            if not live and unusable != self._unusable:
                log.warning("the cluster has no node with GPUs; nothing starts until one joins")
            self._bring_back()
            self._unusable = unusable
            self._hold_unusable()
            return
        log.info("nodes changed: %s", ", ".join(sorted(shape)))
        self._unusable = set()
        self.rebuild(Cluster.from_nodes(live))

    def _hold_unusable(self) -> None:
        """Keep the free GPUs of nodes that left out of allocation (again after each round's
        ends, which free GPUs there)."""
        if self._unusable and isinstance(self.scheduler, Scheduler):
            for node in self.cluster.nodes:
                if node.name in self._unusable:
                    self.scheduler.take_offline(self.cluster.node_gpus[node.index])

    def _bring_back(self) -> None:
        if self._unusable and isinstance(self.scheduler, Scheduler):
            for node in self.cluster.nodes:
                if node.name in self._unusable:
                    self.scheduler.bring_online(self.cluster.node_gpus[node.index])
            self._dirty = True
        self._unusable = set()

    def _hold_tainted(self, now: float) -> None:
        """GPUs still used by processes of ended attempts stay out of allocation; those whose
        processes are gone now come back."""
        if not self._tainted or not isinstance(self.scheduler, Scheduler):
            return
        if now >= self._next_taint_check:
            self._next_taint_check = now + self.settings.node_check_s
            for (job_id, number), gpus in list(self._tainted.items()):
                left = self.executor.leftover(job_id, number, self.attempt_dir(job_id, number))
                if left == 0:
                    del self._tainted[(job_id, number)]
                    self.scheduler.bring_online(gpus)
                    self._dirty = True
                    with self.store.batch():
                        self.store.add_event(
                            job_id, now, "released", f"attempt {number}'s last processes are gone"
                        )
        for gpus in self._tainted.values():
            self.scheduler.take_offline(gpus)

    def _busy_gpus(self) -> set[int]:
        """GPUs whose processes may still run: live attempts and stopping ones."""
        busy = {g for attempt in self._attempts.values() for g in attempt.gpus}
        busy.update(g for gpus in self._draining.values() for g in gpus)
        return busy

    def rebuild(self, cluster: Cluster) -> None:
        """Take a new cluster (nodes joined or left) and rebuild the core's state on it."""
        with self.lock:
            self._pristine_cluster = copy.deepcopy(cluster)
            if self._quota_follows_cluster:
                self.vc_quota = {"default": cluster.total_gpus}
            self._rebuilding = True
            try:
                self.resync()
            finally:
                self._rebuilding = False

    def resync(self) -> None:
        """Rebuild the core's state from the store (as after a restart), when a round failed
        half-way and memory may disagree with what was committed."""
        with self.lock:
            self.cluster = copy.deepcopy(self._pristine_cluster)
            self._gpu_ids = _gpu_ids_by_name(self.cluster)
            self.scheduler = self._make_scheduler()
            self._attempts.clear()
            self._draining.clear()
            self._deferred.clear()
            self._retrying.clear()
            self._failures.clear()
            self.recover()

    def _record_ready_starts(self, now: float) -> list[AttemptLaunch]:
        """The core's starts whose GPUs no stopping attempt holds any more (and that are on no
        node that left), recorded."""
        if not self._deferred:
            return []
        held = {gpu for gpus in self._draining.values() for gpu in gpus}
        # A preemption can free GPUs of a node that left (held out): what the core started there
        # waits until the node is dropped (the rebuild requeues it) or comes back.
        held.update(
            gpu
            for node in self.cluster.nodes
            if node.name in self._unusable
            for gpu in self.cluster.node_gpus[node.index]
        )
        stopping_jobs = {job_id for job_id, _ in self._draining}
        ready = [  # nor while the same job's previous attempt still writes its checkpoint
            start
            for start in self._deferred.values()
            if held.isdisjoint(start.gpus) and start.job_id not in stopping_jobs
        ]
        for start in ready:
            del self._deferred[start.job_id]
        return [self._record_start(start, now) for start in ready]

    def _prepare_job_dirs(self, job_id: str) -> RunAs | None:
        """The job's directory (the manager's: its attempts' control files live there) and, when
        the spec names no workdir, its work dir (the account's, 0700). Returns the account."""
        run_as = None
        if self.settings.multi_user:
            # A job stored by a single-user manager has no account: its user's name is one.
            name = self._accounts.get(job_id) or self.scheduler.jobs[job_id].spec.user
            run_as = identity.account(name, field="unix user")
        job_dir = self.job_dir(job_id)
        # Passable by the jobs' accounts, never listable (the mode is set: the umask is 077).
        passable = 0o711 if run_as is not None else 0o700
        own_directory(job_dir.parent, None, passable)
        own_directory(job_dir, None, passable)
        own_directory(self.work_dir(job_id), run_as)
        return run_as

    # -- carrying out the core's actions ------------------------------------------------------

    def _record_start(self, action: Start, now: float) -> AttemptLaunch:
        job = self.scheduler.jobs[action.job_id]
        spec_model = self._spec_models[job.id]
        number = job.attempts
        gpus = tuple(action.gpus)
        self._attempts[job.id] = _Attempt(number, gpus, now)
        names = [self.gpu_name(g) for g in gpus]
        self.store.add_attempt(job.id, number, names, now, "running")
        self.store.update_job(
            job.id,
            status="RUNNING",
            started_at=job.first_started_at,
            attempts=number,
            reason="",
        )
        verb = "started" if not action.resumed else "resumed"
        if job.id in self._retrying:  # after a failure it starts over from its checkpoint
            self._retrying.discard(job.id)
            verb = "retried"
        self.store.add_event(
            job.id, now, "started", f"attempt {number} {verb} on {', '.join(names)}"
        )
        checkpoint = self.checkpoint_dir(job.id)
        attempt_dir = self.attempt_dir(job.id, number)
        placement = self._worker_placement(gpus, spec_model.workers)
        envs = placement_worker_envs(job.id, number, placement, checkpoint, spec_model.env)
        command = argv(spec_model)
        workdir = spec_model.workdir or str(self.work_dir(job.id))
        return AttemptLaunch(
            job_id=job.id,
            attempt=number,
            workers=[
                WorkerLaunch(rank, command, env, placement[rank][0])
                for rank, env in enumerate(envs)
            ],
            workdir=workdir,
            stop_signal=signal_number(spec_model),
            # A user's grace period must not hold GPUs against preemption and cancel forever.
            grace_s=min(spec_model.grace_seconds, self.settings.max_grace_s),
            attempt_dir=attempt_dir,
            checkpoint_dir=checkpoint,
            gpu_devices=sorted({device for _, devices in placement for device in devices}),
            log_cap_bytes=self.settings.log_cap_bytes,
        )

    def _record_preempt(self, action: Preempt, now: float) -> tuple[str, int] | None:
        """The core preempted a job: record it and return the attempt to stop (None when the
        job's start was still deferred and nothing runs yet)."""
        job = self.scheduler.jobs[action.job_id]
        if self._drop_deferred_start(job):  # it never ran: neither an attempt nor a preemption
            job.preemptions -= 1
            return None
        self._save_progress(job, status="PENDING", reason=f"preempted by job {action.by_job_id}")
        self.store.add_event(job.id, now, "preempted", f"preempted by job {action.by_job_id}")
        attempt = self._attempts.pop(job.id)
        self._draining[(job.id, attempt.number)] = attempt.gpus
        self.store.update_attempt(job.id, attempt.number, state="stopping", outcome="preempted")
        return job.id, attempt.number

    def _save_progress(self, job: Job, **fields: object) -> None:
        self.store.update_job(
            job.id,
            attempts=job.attempts,
            failures=job.failures,
            preemptions=job.preemptions,
            attained_gpu_s=job.attained_gpu_s,
            executed_s=job.executed_s,
            **fields,
        )

    # -- attempts that ended ------------------------------------------------------------------

    def _attempt_ended(self, end: AttemptEnded, now: float) -> None:
        key = (end.job_id, end.attempt)
        if end.leftover:
            live = self._attempts.get(end.job_id)
            gpus = self._draining.get(key) or (
                live.gpus if live is not None and live.number == end.attempt else ()
            )
            self._tainted[key] = gpus
            log.warning(
                "attempt %s of job %s left %d process(es)", end.attempt, end.job_id, end.leftover
            )
        detail = end.reason + (f": {end.error_tail}" if end.error_tail else "")
        outcome_fields = {
            "ended_at": end.ended_at,
            "exit_code": end.exit_code,
            "reason": detail,  # with the last stderr line: a restart rebuilds failure history
            "state": "ended",
        }
        if key in self._draining:  # a stop we asked for: its GPUs are free for real now
            del self._draining[key]
            self.store.update_attempt(end.job_id, end.attempt, **outcome_fields)
            self._dirty = True
            return
        attempt = self._attempts.get(end.job_id)
        if attempt is None or attempt.number != end.attempt:
            self.store.update_attempt(end.job_id, end.attempt, **outcome_fields)
            return
        del self._attempts[end.job_id]
        self._dirty = True
        job = self.scheduler.jobs[end.job_id]
        if end.exit_code == 0 and not end.reason.startswith("lost"):
            self.scheduler.finished(job.id, now)
            self.store.update_attempt(job.id, end.attempt, outcome="succeeded", **outcome_fields)
            self._save_progress(
                job, status="SUCCEEDED", finished_at=now, exit_code=0, reason="succeeded"
            )
            self.store.add_event(job.id, now, "succeeded", f"attempt {end.attempt} exited 0")
            self._forget(job.id)
            return
        # A stop the manager did not ask for (someone signalled the supervisor, the machine is
        # shutting down) is not the job's failure either.
        lost = end.reason.startswith("lost") or end.stopped
        # Lost attempts too: a supervisor that dies at once, again and again, is no passing
        # fault of the machine, and must not be retried forever.
        history = self._failures.setdefault(job.id, [])
        history.append(_Failure(f"{end.exit_code}|{detail}", end.ended_at - attempt.started_at))
        give_up = self._repeated_fast_failure(history)
        backoff = self._backoff(len(history))
        if give_up:
            kind = "lost" if lost else "user error"
            detail = (
                f"{kind}: the same failure {self.settings.fast_fail_repeats + 1} times "
                f"in a row, each within {self.settings.fast_fail_s:g} s ({detail})"
            )
        self.scheduler.failed(
            job.id, now, detail, infrastructure=lost, retry_after_s=backoff, give_up=give_up
        )
        self.store.update_attempt(
            job.id, end.attempt, outcome="lost" if lost else "failed", **outcome_fields
        )
        if job.status is JobStatus.FAILED:
            self._save_progress(
                job, status="FAILED", finished_at=now, exit_code=end.exit_code, reason=detail
            )
            self.store.add_event(job.id, now, "failed", detail)
            self._forget(job.id)
        else:
            self._retrying.add(job.id)
            self._save_progress(job, status="PENDING", exit_code=end.exit_code, reason=detail)
            self.store.add_event(
                job.id,
                now,
                "retrying",
                f"attempt {end.attempt} failed ({detail}); retry in {backoff:g} s",
            )

    def _repeated_fast_failure(self, history: list[_Failure]) -> bool:
        """Philly's analysis (Jeon et al., ATC'19) found many failures to be user errors that
        show up soon after a job starts, the same way each time; retrying them only wastes GPUs.
        True when the latest failures, `fast_fail_repeats` + 1 in a row, were all fast and
        alike."""
        latest = history[-1].signature
        run = 0
        for failure in reversed(history):
            if failure.ran_s > self.settings.fast_fail_s or failure.signature != latest:
                break
            run += 1
        return run > self.settings.fast_fail_repeats

    def _backoff(self, failures_in_a_row: int) -> float:
        settings = self.settings
        return min(
            settings.retry_backoff_s * 2 ** (failures_in_a_row - 1), settings.retry_backoff_max_s
        )

    # -- requests from the API ----------------------------------------------------------------

    def submit(self, model: JobSpecModel, user: str, unix_user: str | None = None) -> JobRow:
        """Accept a validated job: stored, then queued (the stored row is returned), or
        SubmitError with nothing stored. Submissions from many API threads are committed in
        groups by one thread (one transaction for all that arrived meanwhile)."""
        done = threading.Event()
        outcome: list[BaseException | None] = []

        def finish(error: BaseException | None) -> None:
            outcome.append(error)
            done.set()

        row = self._enqueue_submission(model, user, finish, unix_user)
        if self._committer is None:  # not started (a test driving `step` by hand): commit now
            self._commit_submissions()
        done.wait()
        if outcome[0] is not None:
            raise outcome[0]
        return row

    async def submit_async(
        self, model: JobSpecModel, user: str, unix_user: str | None = None
    ) -> JobRow:
        """`submit` for the API's event loop: waits for the commit without holding a thread."""
        loop = asyncio.get_running_loop()
        stored: asyncio.Future[None] = loop.create_future()

        def settle(error: BaseException | None) -> None:
            if not stored.done():
                if error is None:
                    stored.set_result(None)
                else:
                    stored.set_exception(error)

        def finish(error: BaseException | None) -> None:
            loop.call_soon_threadsafe(settle, error)

        row = self._enqueue_submission(model, user, finish, unix_user)
        await stored
        return row

    def _enqueue_submission(
        self,
        model: JobSpecModel,
        user: str,
        finish: Callable[[BaseException | None], None],
        unix_user: str | None = None,
    ) -> JobRow:
        """`unix_user`: the account the user's token names (default: the user's name)."""
        now = self.clock()
        account = self._account_for(model, user, unix_user)
        spec = to_core_spec(model, "new", now, user)
        if spec.vc not in self.vc_quota:
            raise SubmitError(
                f"vc: unknown VC {spec.vc!r}; this cluster has {', '.join(sorted(self.vc_quota))}"
            )
        refusal = self.scheduler.refusal(spec)  # the cluster's shape only: no lock needed
        if refusal is not None:
            raise SubmitError(_field_message(refusal))
        with self._inbox_lock:  # ids in the order the core will queue the jobs
            job_id = str(self.next_id)
            self.next_id += 1
            row = JobRow.new(
                job_id,
                name=model.name,
                user=user,
                vc=spec.vc,
                priority=spec.priority.value,
                gpus=spec.gpus,
                spec=model.model_dump(mode="json"),
                submitted_at=now,
                unix_user=account,
            )
            self._inbox.append(_Submission(row, model, replace(spec, id=job_id), finish))
        self._inbox_ready.set()
        return row

    def _account_for(self, model: JobSpecModel, user: str, unix_user: str | None) -> str | None:
        """The Unix account the job will run as (None in single-user mode); SubmitError if it
        does not exist, may not run jobs, or cannot enter the job's workdir."""
        if not self.settings.multi_user:
            return None
        try:
            run_as = identity.account(unix_user or user)
        except AccountError as error:
            raise SubmitError(str(error)) from None
        if model.workdir:
            blocked = identity.may_enter(Path(model.workdir), run_as)
            if blocked is not None:
                raise SubmitError(f"workdir: account {run_as.user} cannot enter {blocked}")
        return run_as.user

    def _commit_loop(self) -> None:
        while not self._stopping.is_set() or self._inbox:
            self._inbox_ready.wait(self.settings.tick_s)
            self._inbox_ready.clear()
            self._commit_submissions()

    def _commit_submissions(self) -> None:
        with self._inbox_lock:
            batch = list(self._inbox)
            self._inbox.clear()
        if not batch:
            return
        try:
            self.store.insert_jobs([s.row for s in batch])
        except BaseException as error:  # nothing stored: every waiting submitter hears why
            for submission in batch:
                submission.finish(error)
            return
        outcomes: list[BaseException | None] = []
        with self.lock:
            for submission in batch:
                job_id = submission.row.id
                self._spec_models[job_id] = submission.model
                if submission.row.unix_user is not None:
                    self._accounts[job_id] = submission.row.unix_user
                # A rebuild (nodes came or went) since the insert queued it from the store.
                if job_id not in self.scheduler.jobs:
                    try:
                        self.scheduler.submit(submission.spec, submission.row.submitted_at)
                    except Exception as error:  # checked before storing; a bug, but no hang
                        log.exception("job %s was stored but could not be queued", job_id)
                        reason = f"not queued: {error}"
                        self.store.update_job(job_id, status="FAILED", reason=reason)
                        outcomes.append(error)
                        continue
                outcomes.append(None)
                if job_id in self._cancel_on_arrival:  # cancelled between store and queue
                    self._cancel_on_arrival.discard(job_id)
                    self._cancel_locked(job_id)
            self._dirty = True
        for submission, outcome in zip(batch, outcomes, strict=True):
            try:
                submission.finish(outcome)
            except RuntimeError:  # the requester's event loop is gone (server shutting down)
                pass
        self._wake.set()

    def cancel(self, job_id: str) -> None:
        with self.lock:
            if job_id not in self.scheduler.jobs:
                row = self.store.get_job(job_id)
                if row is not None and row.status == "PENDING":  # stored, not yet queued
                    self._cancel_on_arrival.add(job_id)
                return
            self._cancel_locked(job_id)
        self._wake.set()

    def _cancel_locked(self, job_id: str) -> None:
        job = self.scheduler.jobs[job_id]
        if job.status.finished:
            return
        now = self.clock()
        self.scheduler.cancel(job_id, now)
        self._drop_deferred_start(job)
        attempt = self._attempts.pop(job_id, None)
        with self.store.batch():
            self._save_progress(
                job, status="CANCELLED", finished_at=now, reason="cancelled by request"
            )
            self.store.add_event(job_id, now, "cancelled", "cancelled by request")
            if attempt is not None:
                self._draining[(job_id, attempt.number)] = attempt.gpus
                self.store.update_attempt(
                    job_id, attempt.number, state="stopping", outcome="cancelled"
                )
        if attempt is not None:
            self.executor.stop(job_id, attempt.number)
        self._forget(job_id)
        self._dirty = True

    def _drop_deferred_start(self, job: Job) -> bool:
        """A start still waiting for GPUs to drain will not happen: it is not an attempt."""
        if self._deferred.pop(job.id, None) is None:
            return False
        job.attempts -= 1
        return True

    def _forget(self, job_id: str) -> None:
        """A job that ended needs none of the manager's per-job memory."""
        self._spec_models.pop(job_id, None)
        self._accounts.pop(job_id, None)
        self._failures.pop(job_id, None)
        self._retrying.discard(job_id)

    def why(self, job_id: str) -> str:
        """Why the job is where it is (the core's explanation, plus a deferred start)."""
        with self.lock:
            if job_id in self._deferred:
                return "starting: waiting for a stopped job's processes to release its GPUs"
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

    def placement_of(self, job_id: str) -> list[str]:
        with self.lock:
            attempt = self._attempts.get(job_id)
            return [self.gpu_name(g) for g in attempt.gpus] if attempt else []

    def gpu_owners(self) -> dict[int, str]:
        """GPU -> the job whose processes hold it (running, or still stopping)."""
        with self.lock:
            owners = {g: job_id for job_id, a in self._attempts.items() for g in a.gpus}
            for (job_id, _), gpus in self._draining.items():
                owners.update(dict.fromkeys(gpus, job_id))
            return owners

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

    # -- recovery -----------------------------------------------------------------------------

    def recover(self) -> None:
        """Rebuild the core's state from the store after a (clean or abrupt) restart."""
        now = self.clock()
        with self.lock, self.store.batch():
            for row, _ in self.store.unfinished_jobs():
                try:
                    self._recover_job(row, now)
                except (ValueError, KeyError) as error:  # its VC or spec is no longer valid
                    self._unrecoverable(row, now, error)
            # Attempts of jobs that ended (cancelled, say) whose processes may still be stopping:
            # their GPUs are not free until they are gone, and the stop may never have been sent.
            for job_id, attempt in self.store.open_attempts_of_ended_jobs():
                self._drain_leftover(job_id, attempt, now)
            self._dirty = True

    def _unrecoverable(self, row: JobRow, now: float, error: Exception) -> None:
        log.warning("job %s cannot be recovered: %s", row.id, error)
        if row.id in self.scheduler.jobs:  # adopted, then something else failed
            self.scheduler.cancel(row.id, now)
        self._attempts.pop(row.id, None)
        reason = f"could not be recovered after a restart: {error}"
        self.store.update_job(row.id, status="FAILED", finished_at=now, reason=reason)
        self.store.add_event(row.id, now, "failed", reason)

    def _known_gpus(self, names: Iterable[str | int]) -> tuple[int, ...]:
        return tuple(
            name if isinstance(name, int) else self._gpu_ids[name]
            for name in names
            if isinstance(name, int) or name in self._gpu_ids
        )

    def _recover_off_cluster(
        self, job: Job, row: AttemptRow, found: str | AttemptEnded, now: float
    ) -> None:
        """An attempt that ran on a node which has left: what may still run of it is stopped
        (its GPUs elsewhere stay held until it is gone), and the job waits for a new start."""
        number = row.number
        if found == "running":
            self._draining[(job.id, number)] = self._known_gpus(row.gpus)
            self.executor.stop(job.id, number)
            if row.state != "stopping":
                reason = "lost: a node it ran on left the cluster"
                self.store.update_attempt(
                    job.id, number, state="stopping", outcome="lost", reason=reason
                )
        else:
            fields: dict[str, object] = {"state": "ended", "ended_at": now}
            if row.state != "stopping":
                fields.update(outcome="lost", reason="lost: a node it ran on left the cluster")
            if isinstance(found, AttemptEnded):
                fields.update(ended_at=found.ended_at, exit_code=found.exit_code)
                if row.state != "stopping" and found.exit_code == 0 and not found.stopped:
                    self.scheduler.cancel(job.id, now)  # out of the queue: it is done
                    self.store.update_attempt(
                        job.id, number, **(fields | {"outcome": "succeeded", "reason": ""})
                    )
                    self._save_progress(
                        job, status="SUCCEEDED", finished_at=now, exit_code=0, reason="succeeded"
                    )
                    self.store.add_event(job.id, now, "succeeded", f"attempt {number} exited 0")
                    self._forget(job.id)
                    return
            self.store.update_attempt(job.id, number, **fields)
        if row.state != "stopping":
            self.store.update_job(job.id, status="PENDING", reason="requeued: its node left")
            self.store.add_event(
                job.id, now, "requeued", f"attempt {number} ran on a node that left; requeued"
            )

    def _drain_leftover(self, job_id: str, row: AttemptRow, now: float) -> None:
        found = self.executor.recover(job_id, row.number, self.attempt_dir(job_id, row.number))
        if found == "running":
            self._draining[(job_id, row.number)] = self._known_gpus(row.gpus)
            self.executor.stop(job_id, row.number)
            return
        fields: dict[str, object] = {"state": "ended", "ended_at": now}
        if isinstance(found, AttemptEnded):
            fields.update(ended_at=found.ended_at, exit_code=found.exit_code, reason=found.reason)
        self.store.update_attempt(job_id, row.number, **fields)

    def _recover_job(self, row: JobRow, now: float) -> None:
        model = parse_job_spec(row.spec)
        self._spec_models[row.id] = model
        if row.unix_user is not None:
            self._accounts[row.id] = row.unix_user
        spec = to_core_spec(model, row.id, row.submitted_at, row.user)
        refusal = self.scheduler.refusal(spec)  # e.g. its VC left the config
        # Too big for the nodes there are now: on a cluster whose nodes come and go, it waits.
        if refusal is not None and (self._nodes is None or spec.vc not in self.vc_quota):
            raise ValueError(refusal)
        job = Job(
            spec=spec,
            attempts=row.attempts,
            failures=row.failures,
            preemptions=row.preemptions,
            attained_gpu_s=row.attained_gpu_s,
            executed_s=row.executed_s,
            first_started_at=row.started_at,
        )
        attempts = self.store.attempts(row.id)
        self._recover_failures(job, attempts)
        # A waiting job keeps the time it has waited (placement relaxes after a while), over a
        # restart and over a rebuild when nodes come or go.
        since = now
        if row.status == "PENDING":
            ends = [a.ended_at for a in attempts if a.ended_at is not None]
            since = min(now, max([row.submitted_at, *ends]))
        self.scheduler.adopt(job, since)
        for attempt in attempts:
            if attempt.state != "ended":
                self._recover_attempt(job, attempt, now)

    def _recover_failures(self, job: Job, attempts: list[AttemptRow]) -> None:
        """The failure history the backoff and the user-error rule count, from the attempts the
        store recorded; a job that failed last waits out its backoff as it would have."""
        history = [
            _Failure(f"{a.exit_code}|{a.reason}", (a.ended_at or a.started_at) - a.started_at)
            for a in attempts
            if a.outcome in ("failed", "lost") and a.reason != "never started"
        ]
        if not history:
            return
        self._failures[job.id] = history
        last = attempts[-1]
        if last.outcome in ("failed", "lost") and last.ended_at is not None:
            self._retrying.add(job.id)
            job.hold_until = last.ended_at + self._backoff(len(history))

    def _recover_attempt(self, job: Job, row: AttemptRow, now: float) -> None:
        number = row.number
        started_at = row.started_at
        found = self.executor.recover(job.id, number, self.attempt_dir(job.id, number))
        stopping = row.state == "stopping"
        try:
            gpus = self.gpu_ids(row.gpus)
        except KeyError:  # a node it ran on has left the cluster
            self._recover_off_cluster(job, row, found, now)
            return
        if found == "never-started":
            self.store.update_attempt(
                job.id, number, state="ended", outcome="lost", ended_at=now, reason="never started"
            )
            if not stopping:
                self.store.update_job(job.id, status="PENDING", reason="requeued after a restart")
                self.store.add_event(
                    job.id, now, "recovered", f"attempt {number} never started; requeued"
                )
            return
        if found == "running":
            if stopping:  # the stop may not have been sent before the crash: send it again
                self._draining[(job.id, number)] = gpus
                self.executor.stop(job.id, number)
                return
            self.scheduler.restore_running(job.id, gpus, started_at, now)
            self._attempts[job.id] = _Attempt(number, gpus, started_at)
            if not self._rebuilding:  # a node joined or left: nothing to tell the job's owner
                self.store.add_event(job.id, now, "recovered", f"attempt {number} found running")
            return
        assert isinstance(found, AttemptEnded)
        if stopping:
            self.store.update_attempt(
                job.id,
                number,
                state="ended",
                ended_at=found.ended_at,
                exit_code=found.exit_code,
                reason=found.reason,
            )
            return
        # It ended while the manager was down: take it as running until then, then as ended.
        self.scheduler.restore_running(job.id, gpus, started_at, now)
        self._attempts[job.id] = _Attempt(number, gpus, started_at)
        self.store.add_event(
            job.id, now, "recovered", f"attempt {number} ended while the manager was down"
        )
        self._attempt_ended(found, now)


def _gpu_ids_by_name(cluster: Cluster) -> dict[str, int]:
    return {
        f"{node.name}/{device}": gpu
        for node in cluster.nodes
        for device, gpu in enumerate(cluster.node_gpus[node.index])
    }


def _field_message(refusal: str) -> str:
    """The core's refusal ("asks for 9 GPUs but ...") as a field message."""
    return f"gpus: {refusal}" if "GPUs" in refusal else refusal
