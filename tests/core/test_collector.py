"""The collector's thresholds a manager or a simulation runs with (corral.core.collector)."""

from __future__ import annotations

import gc

from corral.core.collector import GC_THRESHOLDS, raise_gc_thresholds


def test_thresholds_are_raised_and_a_higher_setting_is_kept() -> None:
    kept = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)  # Python's default
        raise_gc_thresholds()
        assert gc.get_threshold() == GC_THRESHOLDS == (20_000, 20, 20)
        gc.set_threshold(50_000, 5, 5)  # the process asked for more: left alone
        raise_gc_thresholds()
        assert gc.get_threshold() == (50_000, 5, 5)
    finally:
        gc.set_threshold(*kept)
