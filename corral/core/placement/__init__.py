"""Placements, chosen by name. A new placement is one module and one entry here: the class
declares its options (`Options`) and builds itself (`from_options`), see corral.core.plugin."""

from __future__ import annotations

from typing import Any

from corral.core.placement.base import NotPlaced, Placed, Placement
from corral.core.placement.cacheaware import CacheAware
from corral.core.placement.hetero import Hetero
from corral.core.placement.named import AnyFree, Consolidate, Profile, Relax
from corral.core.placement.sharing import BestFit, Fgd, GpuPacking, GpuPackingCpu, RandomFit
from corral.core.placement.yarn import Yarn

PLACEMENTS: dict[str, type[Placement]] = {
    "consolidate": Consolidate,
    "relax": Relax,
    "profile": Profile,
    "any": AnyFree,
    "hetero": Hetero,
    "cache-aware": CacheAware,
    "yarn": Yarn,  # Tiresias's simulator (the tiresias preset)
    # Jobs that share GPUs (a share of one GPU, CPU, memory): FGD and its paper's baselines.
    "fgd": Fgd,
    "best-fit": BestFit,
    "random-fit": RandomFit,
    "gpu-packing": GpuPacking,
    "gpu-packing-cpu": GpuPackingCpu,
}


def make_placement(name: str, **options: Any) -> Placement:
    try:
        factory = PLACEMENTS[name]
    except KeyError:
        raise ValueError(
            f"unknown placement {name!r}; choose one of {', '.join(PLACEMENTS)}"
        ) from None
    return factory(**options)


__all__ = ["PLACEMENTS", "NotPlaced", "Placed", "Placement", "make_placement"]
