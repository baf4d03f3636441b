"""Trace readers, chosen by format name: `load_trace("philly:/data/cluster_job_log")`.

A new format is one module with a `read(location, *, perf, seed, **options) -> Trace` function
and one entry in READERS.
"""

from __future__ import annotations

import itertools
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
from corral.sim.traces.base import (
    Reader,
    Streamer,
    Trace,
    TraceError,
    TraceStream,
    finish,
    in_order,
)

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

#: The formats that can be read as the simulation goes (`stream_trace`): one entry each.
STREAMERS: dict[str, Streamer] = {
    "tiresias": tiresias.stream,
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


def stream_trace(
    spec: str,
    *,
    perf: PerfModel | None = None,
    seed: int = 0,
    arrival_scale: float = 1.0,
    **options: Any,
) -> TraceStream:
    """A trace "FORMAT:PATH" read as the simulation reaches each job, in bounded memory; the
    file must be in submission order. The first job is read at once, so that a missing file or
    a bad header is refused before the run starts. Raises TraceError with a one-line message."""
    fmt, _, location = spec.partition(":")
    fmt = fmt.strip().lower()
    streamer = STREAMERS.get(fmt)
    if streamer is None:
        raise TraceError(
            f"--stream: trace format {fmt!r} is not read as a stream; formats that are: "
            f"{', '.join(STREAMERS)}"
        )
    jobs = in_order(streamer(location, perf=perf, seed=seed, **options), location, arrival_scale)
    first = next(jobs)
    return TraceStream(jobs=itertools.chain((first,), jobs), source=f"{fmt}:{location}")


def known_formats() -> list[str]:
    return list(READERS)


__all__ = [
    "READERS",
    "STREAMERS",
    "Trace",
    "TraceError",
    "TraceStream",
    "known_formats",
    "load_trace",
    "stream_trace",
]
