"""No admission: every job is scheduled against the whole cluster; VCs are labels only."""

from __future__ import annotations

from typing import Any

from corral.core.admission.base import AdmissionScheme, Assembly
from corral.core.protocol import SchedulerCore


class NoAdmission(AdmissionScheme):
    name = "none"
    summary = "no VCs: one queue over the whole cluster"
    shares = True

    @classmethod
    def build(cls, options: Any, parts: Assembly) -> SchedulerCore:
        return parts.scheduler()
