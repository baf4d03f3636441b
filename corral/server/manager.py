"""The live manager: the core's Scheduler driven by real time, a store and an executor.

One control loop (a thread) owns every change of state. Each round it collects the attempts that
ended, asks the core to decide, writes what it decided to the store in one transaction, and only
then carries it out (starts processes, signals the ones to stop). Writing first is what makes a
crash at any point recoverable: an attempt the store calls running either has a supervisor
(found again on restart), has a result (its end is recorded then), or never started (requeued).

The API's threads call `submit`, `cancel` and the read methods under the same lock. A preempted
job's GPUs are free in the core at once, but its processes may take the grace period to leave:
a start on those GPUs waits (deferred) until they are gone, so two jobs never share a GPU unless
the core packed them there (Gandiva's packing: the guest starts beside the running host, and
each one's measurements are recorded under the shape "sharing with the other's model").

`Manager` is one object, the one owner of that state (set in `Manager.__init__`), composed of
parts, one module each, that each declare the state they use: this module keeps the control loop
and the attempts (recorded, launched, ended, cancelled); corral.server.committer stores and queues
submissions; corral.server.recovery rebuilds the core from the store (restarts, node changes);
corral.server.views answers the API's read questions; corral.server.factory builds the core
scheduler the settings ask for. corral.server.state holds the types they share.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from corral.core.actions import Preempt, Respeed, Start
from corral.core.cluster import Cluster, NodeDef
from corral.core.collector import raise_gc_thresholds
from corral.core.job import Job, JobStatus
from corral.core.nodes import drain_label
from corral.core.profiles import Shape
from corral.core.queues import QueueTree
from corral.core.retry import FailureReport
from corral.exec.local import (
    AttemptEnded,
    AttemptLaunch,
    LaunchRefused,
    RunAs,
    WorkerLaunch,
    launch_argv,
    placement_worker_envs,
    share_env,
)
from corral.server import identity
from corral.server.bulk import BulkControls
from corral.server.committer import Submission, SubmissionCommitter
from corral.server.controls import ControlError, JobControls
from corral.server.datacache import LiveCache
from corral.server.factory import MIN_GITTINS_HISTORY, SchedulerFactory
from corral.server.health import HealthMonitor, NodeChecker
from corral.server.holders import GpuHolders
from corral.server.metrics import ManagerMetrics
from corral.server.nodes import NodeLifecycle
from corral.server.recovery import Recovery
from corral.server.reservations import ReservationControl
from corral.server.spec import JobSpecModel, job_env, signal_number
from corral.server.state import (
    Attempt,
    Executor,
    ManagerSettings,
    SubmitError,
    gpu_ids_by_name,
)
from corral.server.store import Store, StoreError, StoreUnavailable
from corral.server.telemetry import Telemetry, progress_file
from corral.server.views import ManagerViews

if TYPE_CHECKING:
    from corral.server.leader import Lease

__all__ = [
    "MIN_GITTINS_HISTORY",
    "Executor",
    "Manager",
    "ManagerSettings",
    "SubmitError",
]

log = logging.getLogger("corral.manager")

#: Seconds between tries to rebuild the state from the store after a failed write.
REBUILD_RETRY_S = 1.0
#: A failure to reach the store is logged again (one line) at most this often.
OUTAGE_LOG_S = 30.0


#: How the cause of a drain's preemptions begins (corral.core.nodes.drain_label).
DRAIN_PREFIX = drain_label("")


class Manager(
    SubmissionCommitter,
    Recovery,
    ManagerViews,
    SchedulerFactory,
    LiveCache,
    JobControls,
    BulkControls,
    NodeLifecycle,
    ReservationControl,
):
    """The live manager: its state, the control loop and the attempts; the parts it is composed
    of (its bases) each hold one concern (see the module's docstring)."""

    def __init__(
        self,
        store: Store,
        executor: Executor,
        cluster: Cluster,
        data_dir: Path,
        *,
        vc_quota: dict[str, int] | None = None,
        vc_cells: dict[str, dict[str, int]] | None = None,
        vc_tree: QueueTree | None = None,
        settings: ManagerSettings | None = None,
        clock: Callable[[], float] = time.time,
        nodes: Callable[[], list[NodeDef]] | None = None,
        fixed_cluster: bool = False,
    ) -> None:
        """`nodes`, for a cluster whose machines come and go (Ray): the live nodes, read again
        every `node_check_s`; the cluster is rebuilt when they change, unless `fixed_cluster`
        (HiveD's cells on Ray): then the nodes of `cluster` that are not live are held out of
        allocation until they are."""
        self.store = store
        self.executor = executor
        self.cluster = cluster
        self.data_dir = Path(data_dir).resolve()  # job processes run elsewhere: no relative paths
        self._jobs_root = self.data_dir / "jobs"
        self.settings = settings or ManagerSettings()
        self.clock = clock
        self._quota_follows_cluster = not vc_quota
        self.vc_quota = dict(vc_quota) if vc_quota else {"default": cluster.total_gpus}
        self._nodes = nodes
        self._fixed_cluster = fixed_cluster
        self._rebuilding = False
        self._unusable: set[str] = set()  # nodes that left, held out until they can be dropped
        self._next_node_check = 0.0
        self._gpu_ids = gpu_ids_by_name(cluster)
        #: Each VC's guaranteed cells ({cell type: count}, as the config gives them), for hived.
        self.vc_cells = {vc: dict(cells) for vc, cells in (vc_cells or {}).items()}
        #: The VCs' departments, weights and limits (hierarchical queues); None: flat VCs.
        self.vc_tree = vc_tree
        self.telemetry = Telemetry(  # speeds, progress
            store,
            self.settings.profile_fold_s,
            self.settings.max_steps_per_s,
            read_every_s=self.settings.progress_check_s,
            max_reads_per_s=self.settings.progress_reads_per_s,
        )
        self._init_data_cache()  # the nodes' data caches, if any (corral.server.datacache)
        self.scheduler = self._make_scheduler()
        self.record_config()
        self.lock = threading.RLock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._attempts: dict[str, Attempt] = {}  # job id -> its live (launched) attempt
        self._draining: dict[tuple[str, int], tuple[int, ...]] = {}  # stopping attempts' GPUs
        #: Which attempts hold each GPU, kept only where jobs may share GPUs (`shares_gpus`):
        #: None otherwise, and no round spends anything on who shares with whom.
        self._holders: GpuHolders | None = GpuHolders() if self.shares_gpus() else None
        #: Ended attempts some of whose processes could not be ended: their GPUs stay out of
        #: allocation until those are gone (checked every `node_check_s`).
        self._tainted: dict[tuple[str, int], tuple[int, ...]] = {}
        self._next_taint_check = 0.0
        self._deferred: dict[str, Start] = {}  # started in the core, waiting for GPUs to drain
        self._spec_models: dict[str, JobSpecModel] = {}
        self._accounts: dict[str, str] = {}  # job id -> Unix account (multi-user mode)
        self._retrying: set[str] = set()  # requeued after a failed attempt
        #: Attempts the manager stops on its own (hung, over their time limit): how to report
        #: their end to the core.
        self._ending: dict[str, FailureReport] = {}
        self._next_progress_check = 0.0
        self._init_controls()  # hold, arrays, dependencies (corral.server.controls)
        self._init_nodes()  # drains, from the store (corral.server.nodes)
        self._pristine_cluster = copy.deepcopy(cluster)  # to rebuild the core from the store
        self._dirty = True
        self._wake_at: float | None = None
        #: Why memory may disagree with the store (a write failed after memory changed): until
        #: the state is rebuilt from the store, nothing acts on it and changes are refused (503).
        self._suspect: str | None = None
        self._outage_logged = float("-inf")
        self.next_id = store.max_job_id() + 1
        self._inbox: deque[Submission] = deque()
        self._inbox_lock = threading.Lock()
        self._inbox_ready = threading.Event()
        self._committer: threading.Thread | None = None
        self.rounds = 0
        #: When the latest scheduling round ran (the manager's clock; None: none yet): /readyz.
        self.last_round_at: float | None = None
        self.on_stop: list[Callable[[], None]] = []  # e.g. release the data directory's lock
        self.health: HealthMonitor | None = None  # the nodes' health checks (`start`)
        self.round_seconds: list[float] = []  # the latest 1,000 rounds' (benchmarks read them)
        #: This manager's lease when it leads a database shared with standbys (docs/ha.md).
        self.lease: Lease | None = None
        self.metrics = ManagerMetrics()  # counters and histograms for /metrics
        self.metrics.watch(self)
        self.metrics.know_from(self.store, self.vc_quota, ())  # (recover adds the jobs' users)
        with self.store.batch():
            self._note_node_states(self.clock())  # the nodes it starts with, if new

    # -- set-up -------------------------------------------------------------------------------

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

    def use_jobs_root(self, root: Path) -> None:
        """Keep the jobs' directories under `root` (the one every manager of a shared database
        uses: corral.server.boot.shared_jobs_root), before `start`."""
        self._jobs_root = Path(root)

    def job_dir(self, job_id: str) -> Path:
        return self._jobs_root / job_id

    def work_dir(self, job_id: str, job_dir: Path | None = None) -> Path:
        """A job's working directory when its spec names none (the account's own). `job_dir`:
        the job's, when the caller has it already (a round's starts)."""
        return (job_dir or self.job_dir(job_id)) / "work"

    def checkpoint_dir(self, job_id: str, job_dir: Path | None = None) -> Path:
        root = self.settings.checkpoint_root
        if root is not None:
            return Path(root) / job_id
        return (job_dir or self.job_dir(job_id)) / "checkpoint"

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

    def attempt_dir(self, job_id: str, attempt: int, job_dir: Path | None = None) -> Path:
        return (job_dir or self.job_dir(job_id)) / f"attempt-{attempt}"

    # -- the loop -----------------------------------------------------------------------------

    def start(self) -> None:
        """Recover what the store holds, then run the control loop in a thread."""
        raise_gc_thresholds()
        self.recover()
        self._thread = threading.Thread(target=self._run, name="corral-control-loop", daemon=True)
        self._thread.start()
        self._committer = threading.Thread(
            target=self._commit_loop, name="corral-submissions", daemon=True
        )
        self._committer.start()
        if self.settings.health is not None:  # a site's health-check command, NVML's signals
            # an executor that runs each node's check on the node (Ray) does; else it runs here
            remote = self.executor if isinstance(self.executor, NodeChecker) else None
            self.health = HealthMonitor(self.settings.health, self._health_nodes, self, remote)
            self.on_resume = self.health.forget
            self.health.start()

    def _health_nodes(self) -> list[tuple[str, int]]:
        """The nodes the health checks look at: name and GPU count."""
        with self.lock:
            return [
                (node.name, len(self.cluster.node_gpus[node.index])) for node in self.cluster.nodes
            ]

    def stop(self) -> None:
        """Stop the loop; jobs keep running and are found again by the next start."""
        if self.health is not None:
            self.health.stop()
        self._stopping.set()
        self._wake.set()
        self._inbox_ready.set()
        for thread in (self._committer, self._thread):
            if thread is not None:
                thread.join()
        with self.lock:
            try:
                with self.store.batch():
                    self.telemetry.fold_all(self.clock())
            except Exception:  # the store may be what failed; what is lost is a measurement
                log.exception("could not store the running jobs' measured throughput")
        self.executor.close()
        for release in self.on_stop:
            release()
        self.on_stop.clear()

    def _run(self) -> None:
        next_claim_check = 0.0
        while not self._stopping.is_set():
            timeout = self.settings.tick_s
            self._wake.wait(timeout)
            self._wake.clear()
            if self._suspect is not None and not self._rebuild():
                self._stopping.wait(REBUILD_RETRY_S)
                continue
            try:
                if time.monotonic() >= next_claim_check:  # PostgreSQL may have restarted
                    next_claim_check = time.monotonic() + self.settings.node_check_s
                    self.store.keep_claim()
                decided = self.step()
            except Exception as error:  # e.g. the database failed mid-round
                self._store_failed(error, "a scheduling round")
                continue  # memory may disagree with what was committed: rebuild it first
            if decided:  # let submissions gather: one round for many, not one round each
                self._stopping.wait(self.settings.round_gap_s)

    # -- when the store fails -------------------------------------------------------------------

    @property
    def degraded(self) -> str | None:
        """Why the manager's state waits to be rebuilt from the store (None: it does not)."""
        return self._suspect

    @contextmanager
    def _changing(self) -> Iterator[None]:
        """A change of state asked through the API, made under the lock. Refused (503) while
        memory is being rebuilt from the store. If it fails once it may have changed memory (a
        write that failed after the core moved), memory is rolled back by rebuilding it from the
        store before anything acts on it; a refusal (ControlError, SubmitError) changed nothing."""
        with self.lock:
            if self._suspect is not None:
                raise StoreUnavailable("the manager is rebuilding its state after a failed write")
            try:
                yield
            except (ControlError, SubmitError):
                raise
            except Exception as error:
                self._store_failed(error, "a change of state")
                raise

    def _store_failed(self, error: BaseException, what: str) -> None:
        """Memory may disagree with the store: the control loop rebuilds it (`_rebuild`) before
        it decides or carries out anything again. Called from an `except` block."""
        with self.lock:
            self._suspect = f"{what} failed: {error}"
        if isinstance(error, StoreUnavailable):
            self.note_outage(f"{what} failed, the store is unavailable: {error}")
        else:
            log.exception("%s failed; rebuilding the state from the store", what)
        self._wake.set()

    def _rebuild(self) -> bool:
        """Rebuild the state from the store after a failed write (what the store holds is what
        happened: a change whose write failed is undone). True once done; False while the store
        is still unavailable (tried again every REBUILD_RETRY_S)."""
        try:
            with self.lock:
                self.store.keep_claim()
                self._rebuilding = True  # (the jobs' owners are told nothing: nothing changed)
                try:
                    self.resync()
                finally:
                    self._rebuilding = False
                self._suspect = None
        except StoreUnavailable as error:
            self.note_outage(f"the store is still unavailable: {error}")
            return False
        except StoreError as error:  # another manager claimed the database meanwhile
            self.note_outage(f"{error}: this manager changes nothing until it can claim it")
            return False
        except Exception:
            log.exception("rebuilding the state from the store failed; trying again")
            return False
        self._outage_logged = float("-inf")
        log.warning("the store is available again: state rebuilt from it")
        return True

    def note_outage(self, message: str) -> None:
        """A call failed because the store is unavailable: logged, one line at most every
        OUTAGE_LOG_S while it stays so."""
        if time.monotonic() - self._outage_logged >= OUTAGE_LOG_S:
            self._outage_logged = time.monotonic()
            log.error("%s", message)

    def step(self) -> bool:
        """One pass: collect ended attempts, decide if anything changed, record it all in one
        transaction, then carry it out. Returns whether a scheduling round ran. After a failed
        write, the state is rebuilt from the store first (nothing else while that fails)."""
        if self._suspect is not None and not self._rebuild():
            return False
        with self.lock:
            began = time.perf_counter()
            now = self.clock()
            ended = self.executor.poll()
            wake = self._wake_at is not None and now >= self._wake_at
            last = self.last_round_at
            due = last is None or now - last >= self.settings.round_every_s  # (liveness)
            deciding = self._dirty or bool(ended) or wake or due
            stops: list[tuple[str, int]] = []
            node_check = self._nodes is not None and now >= self._next_node_check
            # One transaction for the step; but a step that reads the nodes commits the ends
            # first, so that a rebuild (nodes came or went) finds them in the store.
            with nullcontext() if node_check else self.store.batch():
                with self.store.batch():
                    for end in ended:
                        self._attempt_ended(end, now)
                    if self.telemetry.due(now):  # the attempts whose turn it is to be read
                        stops.extend(self._read_progress(now))
                        deciding = deciding or self._dirty  # a pre-run passed, a pair measured
                    if now >= self._next_progress_check:
                        self._next_progress_check = now + self.settings.progress_check_s
                        stops.extend(self._check_limits(now))
                if node_check:
                    self._next_node_check = now + self.settings.node_check_s
                    self._refresh_nodes()
                    deciding = deciding or self._dirty  # rebuilt, or nodes came back
                    with self.store.batch():
                        self._note_node_states(now)  # joined, left, offline, online
                self._hold_unusable()
                self._hold_tainted(now)
                self.drains.hold(self.scheduler)  # ends on drained nodes freed GPUs there
                with self.store.batch():
                    if deciding:
                        self._open_gates(now)  # held, dependencies, array caps
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
                        for respeed in decision.respeeds:
                            self._record_respeed(respeed, now)
                        self.drains.explain_waits(self.scheduler)  # held-out nodes named
                    launches = self._record_ready_starts(now)
                    if deciding or ended:  # attempts began or ended: who shares which GPUs
                        self._follow_partners(now)
            for job_id, attempt in stops:
                self.executor.stop(job_id, attempt)
            for launch in launches:
                self._launch(launch, now)
            if deciding:
                self.last_round_at = now
                self.rounds += 1
                took = time.perf_counter() - began
                self.metrics.round_seconds.observe(took)
                self.round_seconds.append(took)
                del self.round_seconds[:-1000]
            self._cache_sweep()
            return deciding

    def _launch(self, launch: AttemptLaunch, now: float) -> None:
        """Spawn a recorded attempt; one that cannot even start is lost, like a dead supervisor.
        In multi-user mode it runs as its user's account, which must still exist."""
        try:
            launch.run_as = self._run_as(launch.job_id)
            self._prepare_cache_dirs(launch)
        except (OSError, ValueError) as error:  # AccountError is a ValueError
            self._cannot_start(launch, error, now)
            return
        try:
            self.executor.launch(launch)  # it makes the job's directories (make_job_dirs)
        except LaunchRefused as error:
            self._cannot_start(launch, error, now)
        except Exception as error:
            log.exception("attempt %s of job %s could not start", launch.attempt, launch.job_id)
            reason = f"lost: its supervisor could not start: {error}"
            ended = AttemptEnded(launch.job_id, launch.attempt, None, None, False, reason, "", now)
            with self.store.batch():
                self._attempt_ended(ended, now)

    def _record_ready_starts(self, now: float) -> list[AttemptLaunch]:
        """The core's starts whose GPUs no stopping attempt holds any more (and that are on no
        node that left), recorded."""
        if not self._deferred:
            return []
        held = {gpu for gpus in self._draining.values() for gpu in gpus}
        # A share may start on a GPU other shares run on, but not while a stopping attempt, or
        # an ended one's leftover processes, still hold it (the core has handed its part on).
        held.update(gpu for gpus in self._tainted.values() for gpu in gpus)
        # A preemption can free GPUs of a node that left (held out): what the core started there
        # waits until the node is dropped (the rebuild requeues it) or comes back.
        if self._unusable:
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
        ready = [start for start in ready if not self._cache_busy(start)]  # a dir being trimmed
        for start in ready:
            del self._deferred[start.job_id]
        return [self._record_start(start, now) for start in ready]

    def _run_as(self, job_id: str) -> RunAs | None:
        """The account the job's attempts run as (multi-user mode), which must still exist;
        None: the manager's own. The executor makes the job's directories for it as the attempt
        launches (corral.exec.local.make_job_dirs), not in the round."""
        if not self.settings.multi_user:
            return None
        # A job stored by a single-user manager has no account: its user's name is one.
        named = self._accounts.get(job_id)  # checked at submission
        name = named or self.scheduler.jobs[job_id].spec.user
        return identity.account(name, field="unix user", named=named is not None)

    def _cannot_start(self, launch: AttemptLaunch, error: BaseException, now: float) -> None:
        """An attempt refused before anything of it ran: it ends as a failed start."""
        reason = f"cannot start: {error}"
        ended = AttemptEnded(launch.job_id, launch.attempt, None, None, False, reason, "", now)
        with self.store.batch():
            self._attempt_ended(ended, now)

    # -- carrying out the core's actions ------------------------------------------------------

    def _record_start(self, action: Start, now: float) -> AttemptLaunch:
        job = self.scheduler.jobs[action.job_id]
        spec_model = self._spec_models[job.id]
        number = job.attempts
        gpus = tuple(action.gpus)
        self._attempts[job.id] = Attempt(number, gpus, now)
        self._note_holder(job.id, number, gpus)
        names = [self.gpu_name(g) for g in gpus]
        self.store.add_attempt(job.id, number, names, now, "running", prerun=action.precheck)
        self.store.update_job(
            job.id,
            status="RUNNING",
            started_at=job.first_started_at,
            attempts=number,
            reason="",
        )
        self.metrics.started.labels(job.spec.vc).inc()
        if number == 1:  # its first start: how long it queued
            waited = (job.first_started_at or now) - job.spec.submit_time
            self.metrics.queueing.labels(job.spec.vc).observe(max(0.0, waited))
        verb = "started" if not action.resumed else "resumed"
        if job.id in self._retrying:  # after a failure it starts over from its checkpoint
            self._retrying.discard(job.id)
            verb = "retried"
        if action.precheck:
            verb += " as its pre-run (one worker)"
        share = f" ({action.milli / 1000:g} of the GPU)" if action.milli < 1000 else ""
        self.store.add_event(
            job.id,
            now,
            "started",
            f"attempt {number} {verb} on {', '.join(names)}{share}"
            f"{self._sharing_note(job.id, gpus)}",
        )
        self._note_unenforced(job.id, number, spec_model, now)
        job_dir = self.job_dir(job.id)
        checkpoint = self.checkpoint_dir(job.id, job_dir)
        attempt_dir = self.attempt_dir(job.id, number, job_dir)
        self.telemetry.watch(
            job.id,
            number,
            progress_file(attempt_dir),
            self.shape_of(job, gpus),
            now,
            resumed=False,
            declared_total=spec_model.total_steps is not None,
        )
        workers = len(gpus) // job.spec.gpus_per_worker  # an elastic job's count changes
        placement = self._worker_placement(gpus, workers)
        envs = placement_worker_envs(
            job.id, number, placement, checkpoint, job_env(spec_model), launcher=spec_model.launcher
        )
        if action.precheck:  # the job may want to know (e.g. to skip a long data load)
            for env in envs:
                env["CORRAL_PRECHECK"] = "1"
        if action.milli < 1000:  # a share of its one GPU: MPS's limits from the share
            gpu_type = self.cluster.gpus[gpus[0]].gpu_type
            limits = share_env(action.milli, self.settings.gpu_memory_mib.get(gpu_type))
            for env in envs:
                env.update(limits)
        array = self._array_of.get(job.id)
        if array is not None:  # a task of a job array: its index and the array's id
            for env in envs:
                env["CORRAL_ARRAY_JOB_ID"], env["CORRAL_ARRAY_INDEX"] = array[0], str(array[1])
        self._cache_env(job.id, number, placement, envs, now)
        command = launch_argv(spec_model.command, spec_model.launcher)
        workdir = spec_model.workdir or str(self.work_dir(job.id, job_dir))
        return AttemptLaunch(
            job_id=job.id,
            attempt=number,
            workers=[
                WorkerLaunch(rank, command, env, placement[rank][0])
                for rank, env in enumerate(envs)
            ],
            workdir=workdir,
            job_dir=job_dir,
            own_workdir=not spec_model.workdir,
            stop_signal=signal_number(spec_model),
            # A user's grace period must not hold GPUs against preemption and cancel forever.
            grace_s=min(spec_model.grace_seconds, self.settings.max_grace_s),
            attempt_dir=attempt_dir,
            checkpoint_dir=checkpoint,
            gpu_devices=sorted({device for _, devices in placement for device in devices}),
            log_cap_bytes=self.settings.log_cap_bytes,
            memory_bytes=None if spec_model.memory is None else spec_model.memory << 20,
            cpus=spec_model.cpus,
            pids_max=self.settings.job_pids_max,
            time_limit_at=None
            if spec_model.time_limit is None
            else now + spec_model.time_limit - job.executed_at(now),
        )

    def _note_unenforced(self, job_id: str, number: int, spec: JobSpecModel, now: float) -> None:
        """A limit the spec asks for that this machine cannot set: the attempt runs without it
        (the limit guards the other jobs and the host, whose operator `corral up` told at its
        start), and the job's events say so."""
        unenforced = getattr(self.executor, "unenforced_limits", None)
        asked = [name for name in ("memory", "cpus") if getattr(spec, name) is not None]
        if unenforced is None or not asked:
            return
        missing = unenforced()
        whys = [missing[name] for name in asked if name in missing]
        if whys:
            self.store.add_event(
                job_id, now, "limits", f"attempt {number} runs without: {'; '.join(whys)}"
            )

    def _record_preempt(self, action: Preempt, now: float) -> tuple[str, int] | None:
        """The core preempted a job: record it and return the attempt to stop (None when the
        job's start was still deferred and nothing runs yet)."""
        job = self.scheduler.jobs[action.job_id]
        if self._drop_deferred_start(job):  # it never ran: neither an attempt nor a preemption
            if not action.precheck and action.kind != "migrated":  # (not counted as one)
                job.preemptions -= 1
            return None
        if action.precheck:
            reason, kind, outcome = "its pre-run passed", "pre-run passed", "pre-run"
        else:
            reason, kind, outcome = self._stop_reason(job, action), action.kind, action.kind
            self.metrics.preemptions.labels(job.spec.vc, action.kind).inc()
        self._save_progress(job, status="PENDING", reason=reason)
        self.store.add_event(job.id, now, kind, reason)
        attempt = self._attempts.pop(job.id)
        self.telemetry.unwatch(job.id, now)
        self._ending.pop(job.id, None)
        self._draining[(job.id, attempt.number)] = attempt.gpus
        self.store.update_attempt(job.id, attempt.number, state="stopping", outcome=outcome)
        return job.id, attempt.number

    @staticmethod
    def _stop_reason(job: Job, action: Preempt) -> str:
        """Why the core stopped the job, in the words of its `kind`: preempted, migrated (to make
        room for a job), unpacked (split from the job whose GPUs it shared)."""
        by = action.by_job_id
        if by.startswith(DRAIN_PREFIX):  # an operator drained its node (corral.server.nodes)
            return f"preempted by {by}"
        if action.kind == "migrated":
            return f"migrated to make room for job {by}"
        if action.kind == "unpacked":
            if job.last_event.startswith("unpacked"):  # the stage's words, with the speeds
                return job.last_event
            return f"unpacked from job {by}: sharing its GPUs did not gain"
        return f"preempted by job {by}"

    def _record_respeed(self, respeed: Respeed, now: float) -> None:
        """The core changed a running job's speed (it started or stopped sharing its GPUs, or
        the pair was measured): nothing to carry out, the core keeps the work done; recorded."""
        self.store.add_event(
            respeed.job_id,
            now,
            "speed",
            f"speed {respeed.speed:.2f}: the jobs on its GPUs or their measured speeds changed",
        )

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

    # -- progress: what the jobs report ------------------------------------------------------

    def shape_of(self, job: Job, gpus: tuple[int, ...]) -> Shape:
        """The placement shape a job's throughput is measured on (corral.core.profiles), its
        VC's own."""
        cluster = self.cluster
        gpu_type = min(cluster.gpus[g].gpu_type for g in gpus)  # a gang never mixes types
        nodes = len({cluster.gpu_node[g] for g in gpus})
        return Shape(job.spec.model, gpu_type, len(gpus), nodes, vc=job.spec.vc)

    def share_model(self, model: str, shared: bool, by: str) -> bool:
        """An admin marks `model` shared (every VC reads every VC's measurements of it) or
        not; the next round decides with it. Returns whether it changed."""
        with self.lock:
            changed = self.telemetry.share(model, shared, by, self.clock())
            if changed:
                self._dirty = True
        if changed:
            self._wake.set()
        return changed

    def _read_progress(self, now: float) -> list[tuple[str, int]]:
        """Read the reports of the running attempts whose turn it is (each one's every
        `progress_check_s`: corral.server.telemetry); a pre-run passes on its first (the core's
        `progressed`). Returns the attempts to stop. A job sharing GPUs whose partner reported
        for the first time is measured from then on (not while the partner started up); a new
        measurement of a pair makes the next round judge it again (packing)."""
        first = self.telemetry.poll(now)
        if first and self._holders is not None and self._holders.shared:
            for job_id in first:
                for other in self._holders.partners(job_id):
                    self.telemetry.rebase(other)
        if self.telemetry.shared_measured:
            self.telemetry.shared_measured = False
            self._dirty = True
        stops = []
        for job_id in first:  # first reports: a pre-run passes on its first
            if job_id not in self.scheduler.jobs:
                continue
            passed = self.scheduler.progressed(job_id, now)
            if passed is not None:
                self._dirty = True
                stop = self._record_preempt(passed, now)
                if stop is not None:
                    stops.append(stop)
        return stops

    def _check_limits(self, now: float) -> list[tuple[str, int]]:
        """Every `progress_check_s`: stop the attempts that hung (no report for their
        `progress_timeout`: retried as the infrastructure's failure, as Philly's hang detection
        does) or ran past their `time_limit` (they fail, as in Slurm); send `signal_before_limit`.
        Returns the attempts to stop."""
        stops = []
        limited = self._limited_attempts()  # (most jobs set no limit: not looked at)
        for job_id, attempt in limited:
            model = self._spec_models.get(job_id)
            if model is None or (model.progress_timeout is None and model.time_limit is None):
                continue
            if job_id in self._ending:
                continue
            report = None
            last = self.telemetry.last_report_at(job_id) or attempt.started_at
            if model.progress_timeout is not None and now - last > model.progress_timeout:
                report = FailureReport(
                    f"hung: no progress report for {now - last:.0f} s "
                    f"(progress_timeout {model.progress_timeout:g} s)",
                    infrastructure=True,
                    signature="hung",
                )
            elif (
                model.time_limit is not None
                and (ran := self.scheduler.jobs[job_id].executed_at(now)) > model.time_limit
            ):
                report = FailureReport(
                    f"time limit: ran {ran:.0f} s (time_limit {model.time_limit:g} s)",
                    give_up=True,
                )
            if report is None:
                continue
            self._ending[job_id] = report
            self.store.add_event(job_id, now, "stopping", report.reason)
            stops.append((job_id, attempt.number))
        self._warn_before_limits(now, limited)
        return stops

    # -- jobs sharing GPUs (Gandiva's packing, shares of a GPU) ------------------------------------

    def _note_holder(self, job_id: str, number: int, gpus: tuple[int, ...]) -> None:
        """The attempt's processes hold these GPUs (started, or found running or stopping)."""
        if self._holders is not None:
            self._holders.add(job_id, number, gpus)

    def _drop_holder(self, job_id: str, number: int) -> None:
        """The attempt's processes are gone: its GPUs are not its any more."""
        if self._holders is not None:
            self._holders.remove(job_id, number)

    def _touch_holders(self, job_id: str) -> None:
        """The job left the core or came back to it: the jobs on its GPUs look at it again."""
        if self._holders is not None:
            self._holders.touch(job_id)

    def _follow_partners(self, now: float) -> None:
        """Measure each running attempt under the shape it runs in now: sharing with the models
        of the jobs on its GPUs (joined by "+"), or alone (telemetry folds what came before).
        Only the jobs whose partners may have changed are looked at; none where no GPU can be
        shared."""
        if self._holders is None or not self._holders.changed:
            return
        changed = self._holders.take_changed()
        watches = self.telemetry.watches
        jobs = self.scheduler.jobs
        shapes: dict[str, str] = {}
        for job_id in changed:
            watch = watches.get(job_id)
            if watch is None:  # not running
                continue
            partners = self._holders.partners(job_id)
            colocated = "+".join(sorted({jobs[o].spec.model for o in partners if o in jobs}))
            if watch.shape.colocated != colocated:
                shapes[job_id] = colocated
        # In the order the attempts are watched: what they fold into one profile keeps its order.
        for job_id in shapes if len(shapes) < 2 else [j for j in watches if j in shapes]:
            watch = watches[job_id]
            self.telemetry.reshape(job_id, replace(watch.shape, colocated=shapes[job_id]), now)

    def _sharing_note(self, job_id: str, gpus: tuple[int, ...]) -> str:
        """The note ", sharing with job N" when other running jobs hold these GPUs (packing)."""
        if self._holders is None or not self._holders.shared:
            return ""
        others = [
            other
            for other, number in self._holders.on(gpus)
            if other != job_id
            and (attempt := self._attempts.get(other)) is not None
            and attempt.number == number
        ]
        return f", sharing with job {', '.join(others)}" if others else ""

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
            self._drop_holder(*key)
            lost = self._lost_reasons.pop(key, None)  # its node was found unhealthy
            if lost is not None:
                outcome_fields["reason"] = lost
            self.store.update_attempt(end.job_id, end.attempt, **outcome_fields)
            self._dirty = True
            return
        attempt = self._attempts.get(end.job_id)
        if attempt is None or attempt.number != end.attempt:
            self.store.update_attempt(end.job_id, end.attempt, **outcome_fields)
            return
        del self._attempts[end.job_id]
        self._drop_holder(*key)
        self._dirty = True
        job = self.scheduler.jobs[end.job_id]
        self.telemetry.unwatch(job.id, now)
        judged = self._ending.pop(job.id, None)  # stopped by the manager: hung, over its limit
        if judged is not None:
            detail = outcome_fields["reason"] = judged.reason
        elif end.exit_code == 0 and not end.reason.startswith("lost"):
            self.scheduler.finished(job.id, now)
            if job.status is JobStatus.PENDING:  # its pre-run exited 0: that is a pass
                self.store.update_attempt(job.id, end.attempt, outcome="pre-run", **outcome_fields)
                self._save_progress(job, status="PENDING", reason="its pre-run passed")
                self.store.add_event(
                    job.id, now, "pre-run passed", f"attempt {end.attempt} (its pre-run) exited 0"
                )
                return
            self.store.update_attempt(job.id, end.attempt, outcome="succeeded", **outcome_fields)
            self._save_progress(
                job, status="SUCCEEDED", finished_at=now, exit_code=0, reason="succeeded"
            )
            self.store.add_event(job.id, now, "succeeded", f"attempt {end.attempt} exited 0")
            self.metrics.finished.labels(job.spec.vc, job.spec.user, "SUCCEEDED").inc()
            self._forget(job.id)
            return
        # A stop the manager did not ask for (someone signalled the supervisor, the machine is
        # shutting down) is not the job's failure either.
        lost = end.reason.startswith("lost") or end.stopped
        # The core's retry rule judges it (corral.core.retry): backoff, or the same fast failure
        # repeated (a user error; lost attempts too: a supervisor that dies at once, again and
        # again, is no passing fault of the machine, and must not be retried forever).
        report = FailureReport(
            detail,
            infrastructure=lost,
            signature=f"{end.exit_code}|{detail}",
            ran_s=end.ended_at - attempt.started_at,
        )
        if judged is not None:
            lost = judged.infrastructure
            report = replace(judged, ran_s=report.ran_s)
        self.scheduler.failed(job.id, now, report)
        verdict = job.verdict
        backoff = verdict.retry_after_s if verdict is not None else 0.0
        if job.status is JobStatus.FAILED and verdict is not None:
            detail = verdict.reason
        self.store.update_attempt(
            job.id, end.attempt, outcome="lost" if lost else "failed", **outcome_fields
        )
        self.metrics.failed(
            job.spec.vc, _failure_cause(judged, lost), retried=job.status is not JobStatus.FAILED
        )
        if job.status is JobStatus.FAILED:
            self.metrics.finished.labels(job.spec.vc, job.spec.user, "FAILED").inc()
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

    # -- cancelling (a request from the API) --------------------------------------------------

    def cancel(self, job_id: str) -> None:
        """Cancel a job: written before it takes effect (StoreUnavailable, with nothing changed
        for good, when the store cannot take it). A job that ended is left as it is."""
        with self._changing():
            if job_id in self._gated:  # held, or waiting for its dependencies or array cap
                self._cancel_gated(job_id, self.clock())
            elif job_id in self.scheduler.jobs:
                self._cancel_locked(job_id)
            else:  # ended (a job is stored and queued in one transaction, under the lock)
                return
        self._wake.set()

    def _cancel_locked(self, job_id: str, stops: list[tuple[str, int]] | None = None) -> None:
        """`stops`: the attempts to stop are added to it, for the caller to stop once its
        transaction is committed (None: stopped here)."""
        job = self.scheduler.jobs[job_id]
        if job.status.finished:
            return
        now = self.clock()
        self.scheduler.cancel(job_id, now)
        self._drop_deferred_start(job)
        attempt = self._attempts.pop(job_id, None)
        self.telemetry.unwatch(job_id, now)
        self._ending.pop(job_id, None)
        with self.store.batch():
            self._save_progress(
                job, status="CANCELLED", finished_at=now, reason="cancelled by request"
            )
            self.store.add_event(job_id, now, "cancelled", "cancelled by request")
            self.metrics.finished.labels(job.spec.vc, job.spec.user, "CANCELLED").inc()
            if attempt is not None:
                self._draining[(job_id, attempt.number)] = attempt.gpus
                self.store.update_attempt(
                    job_id, attempt.number, state="stopping", outcome="cancelled"
                )
        if attempt is not None and stops is not None:
            stops.append((job_id, attempt.number))
        elif attempt is not None:
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
        self._retrying.discard(job_id)
        self._ending.pop(job_id, None)
        self.telemetry.forget(job_id)
        self._cache_forget(job_id)
        self._forget_controls(job_id)


def _failure_cause(judged: FailureReport | None, lost: bool) -> str:
    """The `cause` of a failed attempt in /metrics (corral.server.metrics.FAILURE_CAUSES)."""
    if judged is not None and judged.signature == "hung":
        return "hung"
    if judged is not None and judged.give_up:
        return "time_limit"
    return "infrastructure" if lost else "user"
