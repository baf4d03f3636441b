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
from typing import TYPE_CHECKING

from corral.core.cache import DataCache
from corral.core.cluster import Cluster
from corral.core.framework import build_scheduler
from corral.core.job import JobSpec
from corral.core.plugin import Services
from corral.core.protocol import SchedulerCore
from corral.server.spec import JobSpecModel, model_key, to_core_spec
from corral.server.state import ManagerSettings
from corral.server.store import Store
from corral.server.telemetry import Telemetry

#: The store's meta key under which the manager keeps the scheduler config it runs with.
CONFIG_KEY = "scheduler_config"

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
    data_cache: DataCache | None

    if TYPE_CHECKING:  # the data caches' part (corral.server.datacache)

        def _new_data_cache(self) -> DataCache | None: ...

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
            cache=self.data_cache,
        )

    def core_spec(self, model: JobSpecModel, job_id: str, submit_time: float, user: str) -> JobSpec:
        """The core's view of a job, with what this manager measured of its model: steps/s (its
        length, from `total_steps`) and its slowdown when spread over nodes (`profile`)."""
        profiles = self.telemetry.profiles
        key = model_key(model)
        return to_core_spec(
            model,
            job_id,
            submit_time,
            user,
            rate=profiles.best_rate(key, model.gpus),
            spread_slowdown=profiles.spread_slowdown(key, model.gpus),
        )

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
        self.data_cache = self._new_data_cache()  # its start hook allocates the caches
        uses_cache = self.data_cache is not None
        return build_scheduler(self.settings.scheduler, self.services(), uses_cache=uses_cache)

    def effective_config(self) -> dict[str, object]:
        """The config this manager runs with, `auto` resolved (what `config show --url` and
        `export-trace` give back)."""
        return self.settings.scheduler.resolved(self._vc_cells())

    def record_config(self) -> None:
        """Store the config this manager runs with, so a replay can use the same settings."""
        self.store.set_meta(CONFIG_KEY, json.dumps(self.effective_config(), sort_keys=True))

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
