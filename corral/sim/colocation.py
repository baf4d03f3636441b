"""Gavel's co-location throughputs (simulation_throughputs.json) as a packing table for the core.

In the table, the entry of `('<model A>', g)` on GPU type T holds, besides its `"null"` throughput
alone, `"('<model B>', g)": [a, b]`: the steps/s of A and of B while they share the same g GPUs.
`load_pair_table` turns that into each job's speed relative to alone, `(a / alone_A, b / alone_B)`,
keyed by (T, g, A, B). Pairs with a zero (the two did not fit together) are left out, and so are
the `<type>_unconsolidated` tables (pairs were measured on one server). The table is complete: the
simulator measures nothing, so a pair it lacks (a zero, a GPU count Gavel measured no pairs at, a
model it does not list) cannot share: the packing stage's prior for pairs never measured
(`packing.unmeasured`, which the live manager tries once and then measures) never applies.
"""

from __future__ import annotations

import ast
import math
from pathlib import Path
from typing import Any

from corral.core.colocation import PairTable
from corral.sim.perfmodel import PerfModelError, read_throughput_table


def load_pair_table(path: str | Path) -> PairTable:
    path = Path(path)
    return PairTable(pair_speeds(read_throughput_table(path), str(path)), complete=True)


def pair_speeds(
    raw: dict[str, object], source: str
) -> dict[tuple[str, int, str, str], tuple[float, float]]:
    pairs: dict[tuple[str, int, str, str], tuple[float, float]] = {}
    for type_key, entries in raw.items():
        if "_" in type_key:
            continue  # <type>_unconsolidated
        if not isinstance(entries, dict):
            raise PerfModelError(f"{source}: {type_key}: expected an object")
        gpu_type = type_key.lower()
        alone = {key: _alone(source, type_key, key, entry) for key, entry in entries.items()}
        for key, entry in entries.items():
            model, gpus = _job_key(source, type_key, key)
            for other_key, measured in entry.items():
                if other_key == "null":
                    continue
                where = f"{source}: {type_key}: {key}: {other_key}"
                other, other_gpus = _job_key(source, type_key, other_key)
                if not (
                    isinstance(measured, list)
                    and len(measured) == 2
                    and all(_number(v) for v in measured)
                ):
                    raise PerfModelError(f"{where}: expected a pair of throughputs [this, other]")
                mine, theirs = float(measured[0]), float(measured[1])
                base, other_base = alone[key], alone.get(other_key, 0.0)
                if other_gpus != gpus or min(mine, theirs, base, other_base) <= 0:
                    continue  # not measured, or the pair did not fit on the GPUs together
                pairs[(gpu_type, gpus, model, other)] = (mine / base, theirs / other_base)
    return pairs


def _job_key(source: str, type_key: str, key: str) -> tuple[str, int]:
    try:
        model, gpus = ast.literal_eval(key)
    except (ValueError, SyntaxError, TypeError):
        model, gpus = None, None
    if not isinstance(model, str) or isinstance(gpus, bool) or not isinstance(gpus, int):
        raise PerfModelError(
            f"{source}: {type_key}: bad key {key!r} (expected \"('<job_type>', <gpus>)\")"
        )
    return model, gpus


def _alone(source: str, type_key: str, key: str, entry: object) -> float:
    value = entry.get("null") if isinstance(entry, dict) else None
    if not _number(value):
        raise PerfModelError(f'{source}: {type_key}: {key}: expected a "null" throughput')
    return float(value)  # type: ignore[arg-type]


def _number(value: object) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


def gandiva_summary(scheduler: object) -> dict[str, object]:
    """Summary entries of the Gandiva mechanisms a run used: packed GPU-hours (GPU time during
    which a GPU held two jobs), pairs formed, jobs migrated."""
    entries: dict[str, object] = {}
    packing = _stage(scheduler, "packing")
    if packing is not None:
        entries["packed_gpu_hours"] = packing.packed_gpu_s / 3600.0
        entries["packed_pairs"] = packing.pairs_formed
        if packing.pairs_unpacked:
            entries["unpacked_pairs"] = packing.pairs_unpacked
    migration = _stage(scheduler, "migration")
    if migration is not None:
        entries["migrations"] = migration.migrations
    return entries


def _stage(scheduler: object, name: str) -> Any:
    """The round stage of that name the scheduler runs (`Scheduler.stage`; ElasticFlow's keeps
    its migration as an attribute), or None."""
    find = getattr(scheduler, "stage", None)
    return find(name) if callable(find) else getattr(scheduler, name, None)


def gandiva_line(summary: dict[str, object]) -> str | None:
    parts = []
    if "packed_gpu_hours" in summary:
        parts.append(
            f"{summary['packed_pairs']} pairs packed, {summary['packed_gpu_hours']:.1f} packed GPU-hours"
        )
    if "migrations" in summary:
        parts.append(f"{summary['migrations']} migrations")
    return f"{summary['policy']}/{summary['placement']}: {', '.join(parts)}" if parts else None
