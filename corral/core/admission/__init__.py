"""Admission schemes, chosen by name beside the policy and the placement. A new scheme is one
module and one entry here: the class declares its options and builds the scheduler. An entry
says where the class and its options are, and the class is imported when a run asks for it
(corral.core.registry)."""

from __future__ import annotations

from corral.core.admission.base import AdmissionScheme, Assembly
from corral.core.registry import Lazy, Registry

A = "corral.core.admission."
ADMISSIONS: Registry[type[AdmissionScheme]] = Registry(
    {
        "none": Lazy(A + "none:NoAdmission"),
        "quota": Lazy(A + "queues:HierarchicalQuota", A + "quota_options:QuotaOptions"),
        "fairshare": Lazy(A + "fairshare:FairShare", A + "fairshare_options:FairShareOptions"),
        "hived": Lazy(A + "hived:Hived", A + "hived_options:HivedOptions"),
        "elasticflow": Lazy(
            A + "elasticflow:ElasticFlow", A + "elasticflow_options:ElasticFlowOptions"
        ),
    }
)

__all__ = ["ADMISSIONS", "AdmissionScheme", "Assembly"]
