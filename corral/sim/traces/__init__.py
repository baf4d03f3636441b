"""Trace readers, chosen by format name: `load_trace("philly:/data/cluster_job_log")`.

A new format is one module with a `read(location, *, perf, seed, **options) -> Trace` function
and one entry in READERS.
"""

from __future__ import annotations

from typing import Any

from corral.sim.perfmodel import PerfModel
from corral.sim.traces import (
    alibaba,
    corral,
    gavel,
    helios,
    openb,
    philly,
    synthetic,
    tiresias,
)
from corral.sim.traces.base import Reader, Trace, TraceError, finish

READERS: dict[str, Reader] = {
    "philly": philly.read,
    "tiresias": tiresias.read,
    "gavel": gavel.read,
    "alibaba": alibaba.read,
    "openb": openb.read,
    "helios": helios.read,
    "synthetic": synthetic.read,
    "corral": corral.read,
}


def load_trace(
    spec: str,
    *,
    perf: PerfModel | None = None,
    seed: int = 0,
    arrival_scale: float = 1.0,
    **options: Any,
) -> Trace:
    """Read a trace named "FORMAT:PATH" ("synthetic:KEY=VAL,..." for the generator; a bare path
    ending `.corral.jsonl` is corral's own format).

    The jobs come back sorted by submit time (file order breaks ties), the first submitted at 0,
    with every gap between arrivals multiplied by `arrival_scale` (0.5: twice the arrival rate).
    `perf` gives durations and spread slowdowns (default: Gavel's table for gavel traces, the
    default slowdown table otherwise). Raises TraceError with a one-line message.
    """
    fmt, _, location = spec.partition(":")
    fmt = fmt.strip().lower()
    reader = READERS.get(fmt)
    if reader is None and corral.is_corral_path(spec):
        reader, location = corral.read, spec
    if reader is None:
        raise TraceError(
            f"unknown trace format {fmt!r} in {spec!r}; known formats: "
            f"{', '.join(READERS)} (write FORMAT:PATH)"
        )
    return finish(reader(location, perf=perf, seed=seed, **options), arrival_scale)


def known_formats() -> list[str]:
    return list(READERS)


__all__ = ["READERS", "Trace", "TraceError", "known_formats", "load_trace"]
