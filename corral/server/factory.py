"""The live manager's scheduler factory: the scheduler its config describes, built by the core's
framework (corral.core.framework) from what a live manager knows.

`Manager` builds its scheduler here when it is made and again on each rebuild (`resync`). What it
offers the plugins: the cluster and its VCs; Gittins's job sizes from the jobs it finished; no
speed model (jobs run at the speed they run), no job lengths, no loss curves. A plugin that needs
one of those refuses to build, in one line, and `corral up` stops with it.
"""

from __future__ import annotations

import json

from corral.core.cluster import Cluster
from corral.core.framework import build_scheduler
from corral.core.plugin import Services
from corral.core.protocol import SchedulerCore
from corral.server.state import ManagerSettings
from corral.server.store import Store

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

    def _vc_cells(self) -> dict[str, dict[str, int]]:
        return self.vc_cells or {vc: {} for vc in self.vc_quota}

    def services(self) -> Services:
        return Services(
            self.cluster,
            vc_cells=self._vc_cells(),
            vc_quota=dict(self.vc_quota),
            service_history=self._service_history,
        )

    def _make_scheduler(self) -> SchedulerCore:
        return build_scheduler(self.settings.scheduler, self.services())

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
