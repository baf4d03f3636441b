"""Runs of one `corral simulate` side by side in worker processes (`--workers`).

Each run is independent (its own cluster, scheduler and random streams from the settings' seed),
so a run in a worker decides as the same run in the main process: only the wall time changes.
Workers are spawned, not forked (the main process has the progress bar's thread); each builds
what the runs share once (it reads the trace again), takes the next run not yet taken, and
reports its progress, then its result or its error, through one queue. A worker that ends
without a result (killed, out of memory) is reported in one line; when one run fails, or the
main process is interrupted, the other workers are stopped, not waited for. A worker whose main
process is gone (killed without a chance to stop them) ends within `POLL_S`.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

R = TypeVar("R")
S = TypeVar("S")

#: How long the main process waits for a message before it looks for workers that died.
POLL_S = 0.5


def worker_count(requested: int, runs: int) -> int:
    """The processes to run `runs` runs in, for `--workers requested` (0: one per CPU): never
    more than the runs; 1 means one by one in the main process."""
    return max(1, min(runs, requested or os.cpu_count() or 1))


class RunProgress:
    """What a run says as it goes: how far it is (e.g. jobs ended of all), and what it is doing
    now. This one shows nothing."""

    def advance(self, done: int, total: int) -> None:
        pass

    def describe(self, text: str) -> None:
        pass


class ShownProgress(RunProgress):
    """A run's line on the progress bar, started at once or at the run's first report."""

    def __init__(
        self, progress: Progress, label: str, total: int | None, *, started: bool = True
    ) -> None:
        self.progress = progress
        self.task: TaskID = progress.add_task(label, total=total, start=started)
        self.started = started

    def advance(self, done: int, total: int) -> None:
        self._start()
        self.progress.update(self.task, completed=done)

    def describe(self, text: str) -> None:
        self._start()
        self.progress.update(self.task, description=text)

    def _start(self) -> None:
        if not self.started:
            self.started = True
            self.progress.start_task(self.task)


class _Reported(RunProgress):
    """A worker's progress, sent to the main process."""

    def __init__(self, messages: Any, number: int) -> None:
        self.messages = messages
        self.number = number

    def advance(self, done: int, total: int) -> None:
        self.messages.put(("advance", self.number, done))

    def describe(self, text: str) -> None:
        self.messages.put(("describe", self.number, text))


class _ChildTraceback(Exception):
    """The traceback of an error raised in a worker (the cause of the error raised again)."""


def run_in_workers(
    setup: Callable[[], S],
    run: Callable[[S, int, RunProgress], R],
    labels: Sequence[str],
    workers: int,
    shown: Sequence[RunProgress],
) -> list[R]:
    """`run(state, number, progress)` for each of `labels`, in `workers` spawned processes,
    each of which calls `setup()` once for its `state` and then takes the next run not yet
    taken; the results in the order of `labels`. `setup` and `run` must be picklable
    (module-level functions, or functools.partial of them, with picklable arguments), and so
    must the results. A run's error is raised here again, with the worker's traceback as cause."""
    import multiprocessing  # (here: a run in one process does without it)

    context = multiprocessing.get_context("spawn")
    tasks = context.Queue()
    messages = context.Queue()
    for number in range(len(labels)):
        tasks.put(number)
    count = min(workers, len(labels))
    # The run each worker is in (-1: none), written at once: a queue's messages are sent by a
    # thread, and a worker killed by the kernel may take its last ones with it.
    doing = context.RawArray("i", [-1] * count)
    processes = [
        context.Process(
            target=_work,
            args=(setup, run, tasks, messages, doing, index, os.getpid()),
            name=f"corral-worker-{index}",
        )
        for index in range(count)
    ]
    for _ in processes:
        tasks.put(None)  # no more runs
    results: dict[int, R] = {}

    def take(message: tuple[str, int, Any]) -> None:
        kind, number, value = message
        if kind == "advance":
            shown[number].advance(value, 0)
        elif kind == "describe":
            shown[number].describe(value)
        elif kind == "error":
            error, text = value
            raise error from _ChildTraceback(text)
        else:
            results[number] = value

    try:
        for process in processes:
            process.start()
        while len(results) < len(labels):
            try:
                take(messages.get(timeout=POLL_S))
                continue
            except queue.Empty:
                pass
            ended = [
                index for index, process in enumerate(processes) if process.exitcode is not None
            ]
            if not ended:
                continue
            # What these workers sent was in the queue before they ended (a process joins its
            # queue's feeder thread at exit): take all of it before calling a run lost.
            try:
                while True:
                    take(messages.get(timeout=POLL_S))
            except queue.Empty:
                pass
            for index in ended:
                number = doing[index]
                if number >= 0 and number not in results:
                    raise ChildProcessError(
                        f"run {labels[number]}: its worker process ended (exit code "
                        f"{processes[index].exitcode}) before it gave its result"
                    )
            if len(ended) == len(processes) and len(results) < len(labels):
                lost = ", ".join(labels[n] for n in range(len(labels)) if n not in results)
                raise ChildProcessError(f"{lost}: every worker process ended before these runs")
        return [results[number] for number in range(len(labels))]
    finally:
        for process in processes:
            if process.exitcode is None:
                process.terminate()
        for process in processes:
            if process.pid is not None:
                process.join()
        tasks.cancel_join_thread()  # runs no worker took stay unsent: never wait on them at exit
        tasks.close()
        messages.close()


def _work(
    setup: Callable[[], Any],
    run: Callable[[Any, int, RunProgress], Any],
    tasks: Any,
    messages: Any,
    doing: Any,
    index: int,
    parent: int,
) -> None:
    """A worker process's body: its state, then runs until there are none left; each run's
    result or error goes back (an error ends the worker)."""
    threading.Thread(target=_end_when_orphaned, args=(parent,), daemon=True).start()
    number = -1
    try:
        state, ready = None, False
        while (number := tasks.get()) is not None:
            doing[index] = number
            if not ready:
                state, ready = setup(), True
            result = run(state, number, _Reported(messages, number))
            messages.put(("result", number, result))
    except BaseException as error:  # noqa: BLE001 - every error goes back to the main process
        import pickle  # (in the worker: a run in one process never needs it)

        text = traceback.format_exc()
        try:
            pickle.dumps(error)
        except Exception:  # noqa: BLE001 - an error that cannot travel: its text does
            error = RuntimeError(f"{type(error).__name__}: {error}")
        messages.put(("error", number, (error, text)))


def _end_when_orphaned(parent: int) -> None:
    """End this worker once the main process `parent` is gone (it is then no longer the parent):
    nobody would read its results, and a run may last hours."""
    while os.getppid() == parent:
        time.sleep(POLL_S)
    os._exit(1)
