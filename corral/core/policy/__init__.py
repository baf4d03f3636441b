"""Ordering policies, chosen by name. A new policy is one module and one entry here: the class
declares its options (`Options`) and builds itself (`from_options`), see corral.core.plugin."""

from __future__ import annotations

from typing import Any

from corral.core.policy.base import Key, Policy
from corral.core.policy.edf import EarliestDeadlineFirst, ElasticFlowOrder
from corral.core.policy.fifo import Fifo
from corral.core.policy.gittins import Gittins, gittins_index
from corral.core.policy.las import LeastAttainedService
from corral.core.policy.optimus import Optimus
from corral.core.policy.shortest import ShortestJobFirst, ShortestRemainingTimeFirst
from corral.core.policy.timeslice import TimeSlice

POLICIES: dict[str, type[Policy]] = {
    "fifo": Fifo,
    "sjf": ShortestJobFirst,
    "srtf": ShortestRemainingTimeFirst,
    "las": LeastAttainedService,
    "gittins": Gittins,
    "optimus": Optimus,
    "timeslice": TimeSlice,
    "edf": EarliestDeadlineFirst,
    "elasticflow": ElasticFlowOrder,  # runs inside the elasticflow admission (core.elastic)
}


def make_policy(name: str, **options: Any) -> Policy:
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None
    return factory(**options)


__all__ = ["POLICIES", "Key", "Policy", "gittins_index", "make_policy"]
