"""No admission: every job is scheduled against the whole cluster; VCs are labels only."""

from __future__ import annotations

from corral.core.admission.base import AdmissionScheme


class NoAdmission(AdmissionScheme):
    """No verdict of its own: the plain scheduler, with the admissions chained after it."""

    name = "none"
    summary = "no VCs: one queue over the whole cluster"
    shares = True
    queues = True  # it uses no VC, so no department either
