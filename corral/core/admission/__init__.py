"""Admission schemes, chosen by name beside the policy and the placement. A new scheme is one
module and one entry here: the class declares its options and builds the scheduler."""

from __future__ import annotations

from corral.core.admission.base import AdmissionScheme, Assembly
from corral.core.admission.elasticflow import ElasticFlow
from corral.core.admission.fairshare import FairShare
from corral.core.admission.hived import Hived
from corral.core.admission.none import NoAdmission
from corral.core.admission.queues import HierarchicalQuota

ADMISSIONS: dict[str, type[AdmissionScheme]] = {
    "none": NoAdmission,
    "quota": HierarchicalQuota,
    "fairshare": FairShare,
    "hived": Hived,
    "elasticflow": ElasticFlow,
}

__all__ = ["ADMISSIONS", "AdmissionScheme", "Assembly"]
