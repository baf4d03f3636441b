"""Ordering policies, chosen by name. A new policy is one module and one entry here: the class
declares its options (`Options`) and builds itself (`from_options`), see corral.core.plugin. An
entry says where the class and its options are, and the class is imported when a run asks for
it (corral.core.registry)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from corral.core.policy.base import Key, Policy
from corral.core.registry import Lazy, Registry

if TYPE_CHECKING:
    import numpy as np

P = "corral.core.policy."
POLICIES: Registry[type[Policy]] = Registry(
    {
        "fifo": Lazy(P + "fifo:Fifo"),
        "sjf": Lazy(P + "shortest:ShortestJobFirst"),
        "srtf": Lazy(P + "shortest:ShortestRemainingTimeFirst"),
        "las": Lazy(P + "las:LeastAttainedService", P + "las_options:LasOptions"),
        "gittins": Lazy(P + "gittins:Gittins", P + "gittins_options:GittinsOptions"),
        "optimus": Lazy(P + "optimus:Optimus", P + "optimus_options:OptimusOptions"),
        "timeslice": Lazy(P + "timeslice:TimeSlice", P + "timeslice_options:TimeSliceOptions"),
        "edf": Lazy(P + "edf:EarliestDeadlineFirst"),
        # runs inside the elasticflow admission (core.elastic)
        "elasticflow": Lazy(P + "edf:ElasticFlowOrder"),
    }
)


def gittins_index(samples_sorted: np.ndarray, attained: float) -> float:
    """Gittins' index (corral.core.policy.gittins, imported when first asked for)."""
    from corral.core.policy.gittins import gittins_index as index

    return index(samples_sorted, attained)


def make_policy(name: str, **options: Any) -> Policy:
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None
    return factory(**options)


__all__ = ["POLICIES", "Key", "Policy", "gittins_index", "make_policy"]
