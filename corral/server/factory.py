"""The live manager's scheduler factory: the scheduler its config describes, built by the core's
framework (corral.core.framework) from what a live manager knows.

`Manager` builds its scheduler here when it is made and again on each rebuild (`resync`). What it
offers the plugins: the cluster and its VCs; Gittins's job sizes from the jobs it finished; what
the jobs' progress reports taught it (corral.server.telemetry): the speeds measured per model and
placement shape (`hetero`, `profile`, ElasticFlow's scaling curves), the loss curves (`optimus`);
and the users' estimates of their jobs' lengths (`time_limit`, `total_steps`: sjf and srtf, as
Slurm orders by time limits). A plugin that needs what a live manager cannot give (a pair table
for packing, FGD's target workload) refuses to build, in one line, and `corral up` stops with it.
"""

from __future__ import annotations

import json

from corral.core.cluster import Cluster, NodeDef
from corral.core.framework import build_scheduler
from corral.core.job import JobSpec
from corral.core.plugin import Services
from corral.core.profiles import Profiles
from corral.core.protocol import SchedulerCore
from corral.core.tracefile import node_record, read_node
from corral.server.spec import JobSpecModel, model_key, to_core_spec
from corral.server.state import ManagerSettings
from corral.server.store import Store
from corral.server.telemetry import Telemetry

#: The store's meta key under which the manager keeps the scheduler config it runs with.
CONFIG_KEY = "scheduler_config"
#: The store's meta key under which the manager keeps its cluster's nodes (corral.core.tracefile's
#: node records; every node it has had, the latest of each name), for `export-trace`.
NODES_KEY = "cluster_nodes"

#: Finished jobs needed before Gittins takes its job-size distribution from this manager's own.
MIN_GITTINS_HISTORY = 20


class SchedulerFactory:
    """The part of `Manager` that builds its core scheduler from the settings, the cluster and the
    VCs (`_make_scheduler`); Gittins learns its job sizes from the store (`_service_history`)."""

    # The manager's state this part reads (Manager.__init__ sets it).
    settings: ManagerSettings
    cluster: Cluster
    vc_quota: dict[str, int]
    vc_cells: dict[str, dict[str, int]]
    store: Store
    telemetry: Telemetry
    scheduler: SchedulerCore

    def _vc_cells(self) -> dict[str, dict[str, int]]:
        return self.vc_cells or {vc: {} for vc in self.vc_quota}

    def services(self) -> Services:
        return Services(
            self.cluster,
            vc_cells=self._vc_cells(),
            vc_quota=dict(self.vc_quota),
            service_history=self._service_history,
            speed_model_for=self.telemetry.profiles.speed_model,
            # Every job the manager queues under a policy that orders by length declared one
            # (`core_spec`; the committer refuses the others).
            durations_known=True,
            observe=self.telemetry.observe,
            throughput=self.telemetry.profiles.throughput,
        )

    def core_spec(self, model: JobSpecModel, job_id: str, submit_time: float, user: str) -> JobSpec:
        """The core's view of a job, with what this manager measured of its model (`measured_spec`)."""
        return measured_spec(self.telemetry.profiles, model, job_id, submit_time, user)

    def length_refusal(self, spec: JobSpec) -> str | None:
        """Why a job cannot be queued under a policy that orders jobs by their length."""
        policy = self.scheduler.policy
        if not getattr(policy, "needs_lengths", False) or spec.duration_s is not None:
            return None
        if spec.total_steps is not None:
            return None  # its model's speed is not known yet: it sorts after those with lengths
        return (
            f"time_limit: policy {policy.name} orders jobs by their length: give time_limit "
            "(seconds) or total_steps"
        )

    def _make_scheduler(self) -> SchedulerCore:
        return build_scheduler(self.settings.scheduler, self.services())

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
    profiles: Profiles, model: JobSpecModel, job_id: str, submit_time: float, user: str
) -> JobSpec:
    """The core's view of a job with what `profiles` measured of its model: steps/s (its length,
    from `total_steps`) and its slowdown when spread over nodes (`profile`). The live manager
    queues this; `export-trace` writes it."""
    key = model_key(model)
    return to_core_spec(
        model,
        job_id,
        submit_time,
        user,
        rate=profiles.best_rate(key, model.gpus),
        spread_slowdown=profiles.spread_slowdown(key, model.gpus),
    )


def stored_nodes(store: Store) -> list[NodeDef]:
    """The nodes `record_nodes` kept (none from a store written before it did)."""
    raw = store.get_meta(NODES_KEY)
    return [] if raw is None else [read_node(record) for record in json.loads(raw)]
