"""How often the manager reads each running attempt's progress file (corral.server.telemetry):
every `progress_check_s`, but never more than `max_reads_per_s` reads a second in all."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.core.profiles import Shape
from corral.server.store import Store
from corral.server.telemetry import Telemetry

SHAPE = Shape("bert-large", "gpu", 1, vc="nlp")
POLL_S = 0.05  # a round every 50 ms, as a busy control loop runs them


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store(Store.sqlite_url(tmp_path))
    try:
        yield store
    finally:
        store.close()


def reads(telemetry: Telemetry, attempts: int, seconds: float, tmp_path: Path) -> Counter[str]:
    """Watch `attempts` attempts at time 0 (their files not written yet), poll every POLL_S
    until `seconds`; how many times each one's file was read."""
    read: Counter[str] = Counter()
    for index in range(attempts):
        job_id = str(index)
        telemetry.watch(job_id, 1, tmp_path / f"{job_id}.progress", SHAPE, 0.0, resumed=False)
        tail = telemetry.watches[job_id].tail

        def counted(now: float, job_id: str = job_id, read_tail=tail.read) -> list:  # type: ignore[no-untyped-def]
            read[job_id] += 1
            return read_tail(now)

        tail.read = counted  # type: ignore[method-assign]
    for tick in range(1, round(seconds / POLL_S) + 1):
        telemetry.poll(tick * POLL_S)
    return read


def test_each_attempt_is_read_once_every_progress_check_s_while_few_run(
    store: Store, tmp_path: Path
) -> None:
    # 100 attempts, a period of 1 s, at most 1,000 reads/s: 100 reads/s fit, the period stays
    # 1 s. Each one's first turn falls at a fraction of it in (0, 1), then every 1 s: in 10 s,
    # turns at t0, t0 + 1, ..., t0 + 9 (t0 + 10 > 10): 10 reads each, 1,000 in all.
    telemetry = Telemetry(store, read_every_s=1.0, max_reads_per_s=1000.0)
    read = reads(telemetry, 100, 10.0, tmp_path)
    assert set(read.values()) == {10}
    assert len(read) == 100


def test_with_more_attempts_than_the_bound_allows_each_is_read_less_often(
    store: Store, tmp_path: Path
) -> None:
    # 3,000 attempts at most 1,000 reads/s: the period is 3,000 / 1,000 = 3 s, not 1 s. Each
    # one's first turn falls in (0, 3), then every 3 s: in 30 s, t0, t0 + 3, ..., t0 + 27: 10
    # reads each, 30,000 in all, 1,000 a second. Without the bound: every 1 s, 30 each.
    telemetry = Telemetry(store, read_every_s=1.0, max_reads_per_s=1000.0)
    read = reads(telemetry, 3000, 30.0, tmp_path)
    assert set(read.values()) == {10}
    assert sum(read.values()) == 30_000

    unbounded = Telemetry(store, read_every_s=1.0, max_reads_per_s=None)
    assert set(reads(unbounded, 3000, 30.0, tmp_path / "unbounded").values()) == {30}
