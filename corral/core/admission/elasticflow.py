"""The `elasticflow` admission scheme: ElasticFlow's admission control and gang sizing
(corral.core.elastic.ElasticScheduler) over the deadline order."""

from __future__ import annotations

from typing import Any

from corral.core.admission.base import AdmissionScheme, Assembly
from corral.core.admission.elasticflow_options import ElasticFlowOptions as ElasticFlowOptions
from corral.core.plugin import needs
from corral.core.protocol import SchedulerCore


class ElasticFlow(AdmissionScheme):
    name = "elasticflow"
    summary = "ElasticFlow: admit a job only if its deadline can be met, size gangs elastically"
    Options = ElasticFlowOptions
    stages = frozenset()
    leads = False  # it sizes and places every gang itself
    picks_victims = True
    why_not = {
        "packing": "it sizes and places every gang itself",
        "migration": "it migrates by itself (elasticflow.migrate)",
        "cache": "it sizes and places every gang itself",
    }

    @classmethod
    def build(cls, options: Any, parts: Assembly) -> SchedulerCore:
        # (here: its scheduler's module, some 10 ms of imports, only for a run that uses it)
        from corral.core.elastic import ElasticScheduler

        services = parts.services
        needs(services.throughput, "admission elasticflow", "a throughput table (a gavel trace)")
        assert services.throughput is not None
        speed_for = services.speed_model_for
        return ElasticScheduler(
            services.cluster,
            parts.placement,
            services.throughput,
            speed_model=speed_for(services.cluster) if speed_for is not None else None,
            restore_s=parts.restore_s,
            policy=parts.policy,
            migrate=options.migrate,
            retry=parts.retry,
        )
