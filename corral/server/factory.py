"""The live manager's scheduler factory: the scheduler its config describes, built by the core's
framework (corral.core.framework) from what a live manager knows.

`Manager` builds its scheduler here when it is made and again on each rebuild (`resync`). What it
offers the plugins: the cluster and its VCs; Gittins's job sizes from the jobs it finished; what
the jobs' progress reports taught it (corral.server.telemetry): the speeds measured per model and
placement shape (`hetero`, `profile`, ElasticFlow's scaling curves), the pairs' co-location
speeds (Gandiva's `packing`), the loss curves (`optimus`); the users' estimates of their jobs'
lengths (`time_limit`, `total_steps`: sjf and srtf, as Slurm orders by time limits); and FGD's
target workload, learnt from the jobs it was given (the task shapes of the latest
`workload_jobs` submitted, kept up to date as jobs arrive: `learn_workload`).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

from corral.core.cache import DataCache
from corral.core.cluster import MILLI, Cluster, NodeDef
from corral.core.fragmentation import TaskShape, Workload
from corral.core.framework import STAGES, build_scheduler
from corral.core.job import JobSpec
from corral.core.placement import PLACEMENTS
from corral.core.plugin import Services
from corral.core.profiles import Profiles
from corral.core.protocol import SchedulerCore
from corral.core.queues import QueueTree
from corral.core.tracefile import node_record, read_node
from corral.server.spec import JobSpecModel, model_key, parse_job_spec, to_core_spec, whole_gpus
from corral.server.state import Executor, ManagerSettings
from corral.server.store import Store
from corral.server.telemetry import Telemetry

#: The store's meta key under which the manager keeps the scheduler config it runs with.
CONFIG_KEY = "scheduler_config"
#: The store's meta key under which the manager keeps its cluster's nodes (corral.core.tracefile's
#: node records; every node it has had, the latest of each name), for `export-trace`.
NODES_KEY = "cluster_nodes"

#: Finished jobs needed before Gittins takes its job-size distribution from this manager's own.
MIN_GITTINS_HISTORY = 20

#: FGD's target workload before this manager has been given any job: one-GPU jobs.
DEFAULT_TASK = TaskShape(cpu_milli=0, memory_mib=0, num_gpu=1, gpu_milli=MILLI)


class SchedulerFactory:
    """The part of `Manager` that builds its core scheduler from the settings, the cluster and the
    VCs (`_make_scheduler`); Gittins learns its job sizes from the store (`_service_history`)."""

    # The manager's state this part reads (Manager.__init__ sets it).
    settings: ManagerSettings
    cluster: Cluster
    vc_quota: dict[str, int]
    vc_cells: dict[str, dict[str, int]]
    vc_tree: QueueTree | None
    store: Store
    telemetry: Telemetry
    scheduler: SchedulerCore
    executor: Executor
    #: The task shapes of the latest jobs submitted, when the placement shares GPUs (FGD's
    #: target workload); set by `_make_scheduler`, extended by `learn_workload`.
    _workload_shapes: deque[TaskShape] | None
    data_cache: DataCache | None

    if TYPE_CHECKING:  # the data caches' part (corral.server.datacache)

        def _new_data_cache(self) -> DataCache | None: ...

        # the reservations' part (corral.server.reservations)
        def _restore_reservations(self, scheduler: SchedulerCore) -> None: ...

    def _vc_cells(self) -> dict[str, dict[str, int]]:
        return self.vc_cells or {vc: {} for vc in self.vc_quota}

    def services(self) -> Services:
        return Services(
            self.cluster,
            vc_cells=self._vc_cells(),
            vc_quota=dict(self.vc_quota),
            vc_tree=self.vc_tree,
            service_history=self._service_history,
            speed_model_for=self.telemetry.profiles.speed_model,
            # Every job the manager queues under a policy that orders by length declared one
            # (`core_spec`; the committer refuses the others).
            durations_known=True,
            observe=self.telemetry.observe,
            throughput=self.telemetry.profiles.throughput,
            workload=self._target_workload(),
            pair_table=self.telemetry.profiles.pair_speeds,
            cache=self.data_cache,
        )

    def gpu_memory(self) -> dict[str, int | None]:
        """Each GPU type of the cluster with its memory in MiB, None where not known."""
        known = self.settings.gpu_memory_mib
        return {gpu_type: known.get(gpu_type) for gpu_type in self.cluster.gpu_types}

    # -- FGD's target workload, learnt live --------------------------------------------------

    def _target_workload(self) -> Workload | None:
        """The task shapes of the latest `workload_jobs` jobs in the store (any status), when the
        placement shares GPUs (the others take no workload); until there is one, one-GPU jobs."""
        self._workload_shapes = None
        if not PLACEMENTS[self.settings.scheduler.core.placement].shares:
            return None
        shapes: deque[TaskShape] = deque(maxlen=max(1, self.settings.workload_jobs))
        memory = self.gpu_memory()
        for row in self.store.recent_jobs(self.settings.workload_jobs):
            try:
                model = parse_job_spec(row.spec)
                spec = to_core_spec(model, row.id, row.submitted_at, row.user, gpu_memory=memory)
            except ValueError:  # a spec this manager can no longer read: not part of it
                continue
            shapes.append(TaskShape.of(spec))
        self._workload_shapes = shapes
        return self._workload_from(shapes)

    @staticmethod
    def _workload_from(shapes: Iterable[TaskShape]) -> Workload:
        found = list(shapes)
        return Workload.from_shapes(found or [DEFAULT_TASK])

    def learn_workload(self, specs: Iterable[JobSpec]) -> None:
        """Jobs were queued: their shapes join the target workload (the oldest leave it), and a
        placement that measures against it (`retarget`, FGD's) measures against the new one."""
        shapes = self._workload_shapes
        if shapes is None:  # no placement here measures against a workload
            return
        new = [TaskShape.of(spec) for spec in specs]
        if not new:
            return
        shapes.extend(new)
        retarget = getattr(self.scheduler.placement, "retarget", None)
        if retarget is not None:
            retarget(self._workload_from(shapes))

    def shares_gpus(self) -> bool:
        """May jobs' processes share a GPU under this config: its placement gives shares of one
        (FGD), or one of its round stages puts jobs together on GPUs (Gandiva's packing)."""
        core = self.settings.scheduler.core
        return PLACEMENTS[core.placement].shares or any(
            STAGES[name].shares_gpus for name in core.stages
        )

    def share_refusal(self, spec: JobSpec) -> str | None:
        """Why a share of one GPU cannot run here (None for other jobs): a placement that gives
        whole GPUs only, or an executor that cannot put two jobs on one GPU (Ray's)."""
        if not spec.shares_gpu:
            return None
        share = f"a share of one GPU ({spec.gpu_milli / MILLI:g})"
        placement = self.scheduler.placement
        if not placement.shares:
            sharing = ", ".join(sorted(name for name, cls in PLACEMENTS.items() if cls.shares))
            return (
                f"gpus: {share} needs a placement that shares GPUs ({sharing}); this manager "
                f"runs placement {placement.name}"
            )
        if not getattr(self.executor, "shares_gpus", True):
            return f"gpus: {share} runs under the local executor only"
        return None

    def core_spec(self, model: JobSpecModel, job_id: str, submit_time: float, user: str) -> JobSpec:
        """The core's view of a job, with what this manager measured of its model (`measured_spec`)."""
        return measured_spec(
            self.telemetry.profiles, model, job_id, submit_time, user, self.gpu_memory()
        )

    def length_refusal(self, spec: JobSpec) -> str | None:
        """Why a job cannot be queued under a policy that orders jobs by their length."""
        policy = self.scheduler.policy
        if not policy.needs_lengths or spec.duration_s is not None:
            return None
        if spec.total_steps is not None:
            return None  # its model's speed is not known yet: it sorts after those with lengths
        return (
            f"time_limit: policy {policy.name} orders jobs by their length: give time_limit "
            "(seconds) or total_steps"
        )

    def _make_scheduler(self) -> SchedulerCore:
        self.data_cache = self._new_data_cache()  # its start hook allocates the caches
        uses_cache = self.data_cache is not None
        scheduler = build_scheduler(self.settings.scheduler, self.services(), uses_cache=uses_cache)
        self._restore_reservations(scheduler)  # (corral.server.reservations)
        return scheduler

    def effective_config(self) -> dict[str, object]:
        """The config this manager runs with, `auto` resolved (what `config show --url` and
        `export-trace` give back)."""
        return self.settings.scheduler.resolved(self._vc_cells())

    def record_config(self) -> None:
        """Store the config this manager runs with, so a replay can use the same settings, and
        the cluster it runs on (`record_nodes`)."""
        self.store.set_meta(CONFIG_KEY, json.dumps(self.effective_config(), sort_keys=True))
        self.record_nodes()

    def record_nodes(self) -> None:
        """Add the cluster's nodes to those the store keeps (NODES_KEY), so that `export-trace`
        gives a replay the cluster its jobs ran on: a node that left stays (jobs ran there), a
        node whose definition changed is kept as it is now."""
        kept = {node.name: node for node in stored_nodes(self.store)}
        for node in self.cluster.node_defs():
            kept[node.name] = node
        value = json.dumps([node_record(node) for node in kept.values()])
        if value != self.store.get_meta(NODES_KEY):
            self.store.set_meta(NODES_KEY, value)

    def admission_name(self) -> str:
        """The admission the config's `auto` resolves to on this cluster."""
        return self.settings.scheduler.admission_for(self._vc_cells())

    def _service_history(self) -> list[float]:
        """Gittins's distribution of job sizes, as Tiresias learns it: the GPU-seconds of the jobs
        this manager finished; until there are enough, one spread over a minute to a day."""
        if self.settings.gittins_history_gpu_s:
            return list(self.settings.gittins_history_gpu_s)
        finished = [
            job.attained_gpu_s
            for job in self.store.finished_jobs()
            if job.status == "SUCCEEDED" and job.attained_gpu_s > 0
        ]
        return finished if len(finished) >= MIN_GITTINS_HISTORY else [60.0, 600.0, 3600.0, 86400.0]


def measured_spec(
    profiles: Profiles,
    model: JobSpecModel,
    job_id: str,
    submit_time: float,
    user: str,
    gpu_memory: dict[str, int | None] | None = None,
) -> JobSpec:
    """The core's view of a job with what `profiles` measured of its model, as its VC sees
    them: steps/s (its length, from `total_steps`) and its slowdown when spread over nodes
    (`profile`); `gpu_memory`: each GPU type's memory, for a share asked in GPU memory. The live
    manager queues this; `export-trace` writes it."""
    if not profiles:  # nothing measured yet: nothing to look up
        return to_core_spec(model, job_id, submit_time, user, gpu_memory=gpu_memory)
    key = model_key(model)
    return to_core_spec(
        model,
        job_id,
        submit_time,
        user,
        rate=profiles.best_rate(key, whole_gpus(model), vc=model.vc),
        spread_slowdown=profiles.spread_slowdown(key, whole_gpus(model), vc=model.vc),
        gpu_memory=gpu_memory,
    )


def stored_nodes(store: Store) -> list[NodeDef]:
    """The nodes `record_nodes` kept (none from a store written before it did)."""
    raw = store.get_meta(NODES_KEY)
    return [] if raw is None else [read_node(record) for record in json.loads(raw)]
