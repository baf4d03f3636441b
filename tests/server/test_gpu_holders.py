"""Who shares which GPU, in the manager: kept only where jobs may share GPUs (a stage that packs
them, a placement that gives shares of one), so that a manager configured without either spends
nothing of a round on it; where they may, the jobs on a GPU are known as attempts start and end.

The manager is driven by hand (`step`) on a fake clock, with an executor whose attempts run until
the test ends them: no process, no thread."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.core.cluster import Cluster
from corral.server.holders import GpuHolders
from corral.server.manager import Manager
from corral.server.spec import parse_job_spec
from corral.server.store import Store
from corral.server.telemetry import Telemetry
from tests.server.helpers import manager_settings, python_job
from tests.server.inert import Clock, HeldExecutor


def manager(
    tmp_path: Path, executor: HeldExecutor, clock: Clock, gpus: int, **settings: Any
) -> Manager:
    """A manager on one node of `gpus` GPUs (its store closed by the caller)."""
    return Manager(
        Store(Store.sqlite_url(tmp_path)),
        executor,
        Cluster.shorthand(1, gpus),
        tmp_path,
        settings=manager_settings(**settings),
        clock=clock,
    )


@pytest.fixture
def made(tmp_path: Path) -> Iterator[Callable[..., Manager]]:
    """`manager`, each one's store closed at the end of the test."""
    stores: list[Store] = []

    def make(executor: HeldExecutor, clock: Clock, gpus: int, **settings: Any) -> Manager:
        m = manager(tmp_path, executor, clock, gpus, **settings)
        stores.append(m.store)
        return m

    try:
        yield make
    finally:
        for store in stores:
            store.close()


def submit(m: Manager, name: str, model: str) -> str:
    return m.submit(parse_job_spec(python_job(name, "pass") | {"model": model}), "u").id


def started(m: Manager, job_id: str) -> list[str]:
    return [e.message for e in m.store.events(job_id) if e.kind == "started"]


def colocated(m: Manager, job_id: str) -> str:
    return m.telemetry.watches[job_id].shape.colocated


class Spy:
    """Counts the calls of the sharing bookkeeping: the index's and the reshaping of a watch."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: dict[str, int] = {}
        for cls, name in [
            (GpuHolders, "add"),
            (GpuHolders, "remove"),
            (GpuHolders, "partners"),
            (GpuHolders, "on"),
            (Telemetry, "reshape"),
        ]:
            self._count(monkeypatch, cls, name)

    def _count(self, monkeypatch: pytest.MonkeyPatch, cls: type, name: str) -> None:
        real = getattr(cls, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            return real(*args, **kwargs)

        monkeypatch.setattr(cls, name, counted)


def test_without_packing_or_shares_no_round_spends_anything_on_who_shares_gpus(
    made: Callable[..., Manager], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two GPUs, no stage, placement relax (whole GPUs): no GPU can be shared, so the manager
    # keeps no index and its rounds, starts and ends never touch one (nor reshape a watch).
    spy = Spy(monkeypatch)
    executor, clock = HeldExecutor(), Clock()
    m = made(executor, clock, gpus=2, policy="fifo")
    assert not m.shares_gpus() and m._holders is None
    a, b, c = (submit(m, name, model) for name, model in [("a", "x"), ("b", "y"), ("c", "z")])
    m.step()  # a and b start, one GPU each; c waits
    assert sorted(executor.running) == [(a, 1), (b, 1)]
    executor.end(a, 1, "exit code 0", 0)
    clock.now += 1
    m.step()  # a's end, then c's start on its GPU
    assert (c, 1) in executor.running
    assert started(m, c) == ["attempt 1 started on node-0000/0"]
    assert m._holders is None
    assert spy.calls == {}


def test_with_packing_a_job_started_on_a_running_jobs_gpu_is_noted_and_measured_as_sharing(
    made: Callable[..., Manager], monkeypatch: pytest.MonkeyPatch
) -> None:
    # One GPU, fifo, Gandiva's packing. A (model alpha) takes the GPU; B (beta) cannot be
    # placed nor preempt (fifo), and the pair, never measured, is tried on the prior
    # (0.6 + 0.6 > 1.1): B starts on A's GPU. Its start says whom it shares with, and each is
    # measured under the shape "sharing with the other's model". When B ends, A runs alone
    # again and is measured so.
    spy = Spy(monkeypatch)
    executor, clock = HeldExecutor(), Clock()
    m = made(executor, clock, gpus=1, policy="fifo", stages=["packing"])
    assert m.shares_gpus() and m._holders is not None
    a = submit(m, "a", "alpha")
    m.step()
    assert started(m, a) == ["attempt 1 started on node-0000/0"]
    assert colocated(m, a) == ""
    b = submit(m, "b", "beta")
    clock.now += 1
    m.step()
    assert started(m, b) == [f"attempt 1 started on node-0000/0, sharing with job {a}"]
    assert (colocated(m, a), colocated(m, b)) == ("beta", "alpha")
    assert m._holders.partners(a) == {b} and m._holders.partners(b) == {a}
    executor.end(b, 1, "exit code 0", 0)
    clock.now += 1
    m.step()
    assert colocated(m, a) == ""
    assert m._holders.partners(a) == set() and m._holders.shared == 0
    assert spy.calls["reshape"] == 3  # a and b when b joined, a when b left
    assert spy.calls["add"] == 2 and spy.calls["remove"] == 1


def test_shares_of_a_gpu_keep_the_index_too(made: Callable[..., Manager]) -> None:
    m = made(HeldExecutor(), Clock(), gpus=1, placement="fgd")
    assert m.shares_gpus() and m._holders is not None


def test_attempts_found_sharing_a_gpu_after_a_restart_are_followed_whatever_the_config(
    tmp_path: Path,
) -> None:
    # A and B were packed on one GPU by a manager with packing; the next one runs without it.
    # It finds both running on that GPU. Without packing B cannot be restored there: it is
    # failed and its processes are stopped. Until they are gone A still shares its GPU with
    # them, and is measured so: the manager keeps the index, though its config shares nothing;
    # once they are gone A runs alone, and the next rebuild from the store keeps no index.
    executor, clock = HeldExecutor(), Clock()
    first = manager(tmp_path, executor, clock, gpus=1, policy="fifo", stages=["packing"])
    try:
        a = submit(first, "a", "alpha")
        first.step()
        b = submit(first, "b", "beta")
        clock.now += 1
        first.step()
        assert sorted(executor.running) == [(a, 1), (b, 1)]
    finally:
        first.store.close()
    again = manager(tmp_path, executor, clock, gpus=1, policy="fifo")
    try:
        assert again._holders is None
        again.recover()
        assert executor.stopped == [(b, 1)]
        assert again._holders is not None and again._holders.partners(a) == {b}
        again.step()
        assert colocated(again, a) == "beta"
        executor.end(b, 1, "stopped by signal", None)
        clock.now += 1
        again.step()
        assert colocated(again, a) == ""
        assert again._holders.shared == 0
        again.resync()
        assert again._holders is None
    finally:
        again.store.close()
