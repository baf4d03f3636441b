"""The cyclic garbage collector's thresholds for a process that holds a whole cluster's jobs: the
live manager (corral.server.manager) and a simulation (`corral simulate`)."""

from __future__ import annotations

import gc

#: Python's default is (700, 10, 10). A manager keeps hundreds of thousands of objects (jobs,
#: specs, indexes, queues) and each round and submission allocates thousands more, nearly all
#: freed by reference counting; in benchmarks/control_plane.py, the collector switched off gave
#: 15-20 % more API submissions and a control loop a third cheaper per job. A simulation holds
#: every job of its trace, which each collection of the older generations walks again (the
#: 100,000-job trace of benchmarks/sim_philly_preempt.py: 6 full collections and 81 of the middle
#: generation at Python's default, none and 2 with these). Cyclic garbage waits longer, no more;
#: no decision reads the collector.
GC_THRESHOLDS = (20_000, 20, 20)


def raise_gc_thresholds() -> None:
    """The collector's thresholds raised to `GC_THRESHOLDS`, unless the process set more."""
    if gc.get_threshold()[0] < GC_THRESHOLDS[0]:
        gc.set_threshold(*GC_THRESHOLDS)
