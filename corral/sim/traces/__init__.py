"""Trace readers, chosen by format name: `load_trace("philly:/data/cluster_job_log")`.

A new format is one module that declares a `TraceFormat` (its name, a one-line summary, how
`--trace` names it, and a loader, a streaming reader or both) and one entry in FORMATS. The
`--trace` and `--stream` help, the unknown-format error, `corral config plugins` and the docs'
table of formats (scripts/plugin_tables.py) are generated from FORMATS.
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
    TraceFormat,
    TraceStream,
    finish,
    in_order,
)

FORMATS: dict[str, TraceFormat] = {
    "philly": philly.FORMAT,
    "tiresias": tiresias.FORMAT,
    "gavel": gavel.FORMAT,
    "alibaba": alibaba.FORMAT,
    "openb": openb.FORMAT,
    "helios": helios.FORMAT,
    "synthetic": synthetic.FORMAT,
    "corral": corral.FORMAT,
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
    entry = FORMATS.get(fmt)
    if entry is None and corral.is_corral_path(spec):
        entry, location = FORMATS.get("corral", corral.FORMAT), spec
    if entry is None:
        raise TraceError(
            f"unknown trace format {fmt!r} in {spec!r}; known formats: "
            f"{', '.join(FORMATS)} (write FORMAT:PATH)"
        )
    return finish(entry.load(location, perf=perf, seed=seed, **options), arrival_scale)


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
    entry = FORMATS.get(fmt)
    if entry is None:
        raise TraceError(
            f"unknown trace format {fmt!r} in {spec!r}; known formats: "
            f"{', '.join(FORMATS)} (write FORMAT:PATH)"
        )
    if entry.stream is None:
        raise TraceError(
            f"--stream: trace format {fmt!r} has no streaming reader (it is read whole); "
            f"formats that stream: {', '.join(streaming_formats()) or 'none'}"
        )
    records = entry.stream(location, perf=perf, seed=seed, **options)
    jobs = in_order(records, location, arrival_scale)
    first = next(jobs)
    return TraceStream(jobs=itertools.chain((first,), jobs), source=f"{fmt}:{location}")


def known_formats() -> list[str]:
    return list(FORMATS)


def streaming_formats() -> list[str]:
    """The formats `corral simulate --stream` reads."""
    return [name for name, entry in FORMATS.items() if entry.streams]


def usages() -> str:
    """How `--trace` names each format, as its help lists them."""
    return ", ".join(entry.usage for entry in FORMATS.values())


__all__ = [
    "FORMATS",
    "Reader",
    "Streamer",
    "Trace",
    "TraceError",
    "TraceFormat",
    "TraceStream",
    "known_formats",
    "load_trace",
    "stream_trace",
    "streaming_formats",
    "usages",
]
