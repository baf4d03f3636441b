"""Placements, chosen by name. A new placement is one module and one entry here: the class
declares its options (`Options`) and builds itself (`from_options`), see corral.core.plugin. An
entry says where the class and its options are, and the class is imported when a run asks for
it (corral.core.registry)."""

from __future__ import annotations

from typing import Any

from corral.core.placement.base import NotPlaced, Placed, Placement
from corral.core.registry import Lazy, Registry

P = "corral.core.placement."
PLACEMENTS: Registry[type[Placement]] = Registry(
    {
        "consolidate": Lazy(P + "named:Consolidate"),
        "relax": Lazy(P + "named:Relax", P + "named_options:RelaxOptions"),
        "profile": Lazy(P + "named:Profile", P + "named_options:ProfileOptions"),
        "any": Lazy(P + "named:AnyFree"),
        "hetero": Lazy(P + "hetero:Hetero", P + "hetero_options:HeteroOptions"),
        "cache-aware": Lazy(P + "cacheaware:CacheAware"),
        "yarn": Lazy(P + "yarn:Yarn"),  # Tiresias's simulator (the tiresias preset)
        # Jobs that share GPUs (a share of one GPU, CPU, memory): FGD and its paper's baselines.
        "fgd": Lazy(P + "sharing:Fgd", P + "sharing_options:FgdOptions"),
        "best-fit": Lazy(P + "sharing:BestFit"),
        "random-fit": Lazy(P + "sharing:RandomFit", P + "sharing_options:RandomFitOptions"),
        "gpu-packing": Lazy(P + "sharing:GpuPacking"),
        "gpu-packing-cpu": Lazy(P + "sharing:GpuPackingCpu"),
    }
)


def make_placement(name: str, **options: Any) -> Placement:
    try:
        factory = PLACEMENTS[name]
    except KeyError:
        raise ValueError(
            f"unknown placement {name!r}; choose one of {', '.join(PLACEMENTS)}"
        ) from None
    return factory(**options)


__all__ = ["PLACEMENTS", "NotPlaced", "Placed", "Placement", "make_placement"]
