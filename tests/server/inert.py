"""Test executors that run nothing and, unlike `corral up --executor inert`, keep no time of their
own: one whose attempts end at the next poll (`InstantExecutor`, for tests of what the API accepts
and answers: the fuzzer's random commands, large numbers of jobs), one whose attempts end when the
test says (`HeldExecutor`), and one whose attempts do scripted work on the manager's own (fake)
clock and report it (`PacedExecutor`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.exec.local import AttemptEnded, AttemptLaunch, LocalExecutor
from corral.server.boot import RunningServer, ServerOptions, build_manager
from tests.server.helpers import fast_settings


class Clock:
    """A manager's clock that a test moves by hand (`clock.now = ...`)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class InstantExecutor(LocalExecutor):
    """The local executor (so the API checks workdirs as it does for it) that starts nothing:
    each attempt ends, successfully, at the next poll."""

    def __init__(self) -> None:
        super().__init__()
        self.due: list[AttemptLaunch] = []

    def launch(self, launch: AttemptLaunch) -> None:
        self.due.append(launch)

    def stop(self, job_id: str, attempt: int) -> None:
        pass

    def poll(self) -> list[AttemptEnded]:
        due, self.due = self.due, []
        return [AttemptEnded(a.job_id, a.attempt, 0, None, False, "exit 0", "", 0.0) for a in due]

    def recover(self, job_id: str, attempt: int, attempt_dir: Path) -> str | AttemptEnded:
        return AttemptEnded(job_id, attempt, 0, None, False, "exit 0", "", 0.0)

    def close(self) -> None:
        pass


class HeldExecutor:
    """Attempts run until `end` is called; `recover` finds the running ones again."""

    def __init__(self) -> None:
        self.running: dict[tuple[str, int], AttemptLaunch] = {}
        self.stopped: list[tuple[str, int]] = []
        self.ended: list[AttemptEnded] = []

    def launch(self, launch: AttemptLaunch) -> None:
        self.running[(launch.job_id, launch.attempt)] = launch

    def stop(self, job_id: str, attempt: int) -> None:
        self.stopped.append((job_id, attempt))

    def end(self, job_id: str, attempt: int, reason: str, code: int | None = None) -> None:
        del self.running[(job_id, attempt)]
        self.ended.append(AttemptEnded(job_id, attempt, code, None, False, reason, "", 1000.0))

    def poll(self) -> list[AttemptEnded]:
        ended, self.ended = self.ended, []
        return ended

    def recover(self, job_id: str, attempt: int, attempt_dir: Path) -> str:
        return "running" if (job_id, attempt) in self.running else "never-started"

    def close(self) -> None:
        pass


@dataclass(slots=True)
class _Run:
    launch: AttemptLaunch
    steps_at_start: float
    rate: float
    #: When its restore ends (its start for a first attempt) and when its steps are done.
    working_from: float
    ends_at: float
    reported_at: float = -1.0

    def step_at(self, now: float) -> float:
        return self.steps_at_start + self.rate * max(0.0, now - self.working_from)


class PacedExecutor:
    """Attempts that run as training jobs do, on the manager's clock (a test's fake one): job J
    needs `steps[J]` steps and makes `rate(launch)` steps/s on the GPUs it was given; every attempt
    after the first restores its checkpoint for `restore_s` first, making none. From then on it
    appends its step to its rank-0 progress file (corral.server.telemetry measures the rate from
    it) each time it is polled, it exits 0 at the instant its steps are done (`poll` reports it
    once the clock has passed that instant, with that instant as its end), and it ends at once
    when stopped, its steps so far kept, as a checkpoint taken on the signal would keep them."""

    def __init__(
        self,
        clock: Callable[[], float],
        steps: dict[str, float],
        rate: Callable[[AttemptLaunch], float],
        restore_s: float,
    ) -> None:
        self.clock = clock
        self.steps = steps
        self.rate = rate
        self.restore_s = restore_s
        self.done: dict[str, float] = {}  # job id -> steps its checkpoint holds
        self.running: dict[tuple[str, int], _Run] = {}
        self.stopped: list[AttemptEnded] = []
        self.launched: list[AttemptLaunch] = []

    def launch(self, launch: AttemptLaunch) -> None:
        now = self.clock()
        launch.attempt_dir.mkdir(parents=True, exist_ok=True)
        rate = self.rate(launch)
        start = self.done.get(launch.job_id, 0.0)
        working_from = now + (self.restore_s if launch.attempt > 1 else 0.0)
        ends_at = working_from + (self.steps[launch.job_id] - start) / rate
        self.running[(launch.job_id, launch.attempt)] = _Run(
            launch, start, rate, working_from, ends_at
        )
        self.launched.append(launch)

    def next_end(self) -> float | None:
        """When the next running attempt exits on its own (None: none runs)."""
        return min((run.ends_at for run in self.running.values()), default=None)

    def _report(self, run: _Run, at: float) -> None:
        if at < run.working_from or at <= run.reported_at:
            return
        run.reported_at = at
        line = json.dumps({"step": run.step_at(at), "time": at})
        with (run.launch.attempt_dir / "rank-0.progress").open("a") as handle:
            handle.write(line + "\n")

    def stop(self, job_id: str, attempt: int) -> None:
        run = self.running.pop((job_id, attempt), None)
        if run is None:
            return
        now = self.clock()
        self.done[job_id] = run.step_at(now)
        self.stopped.append(
            AttemptEnded(job_id, attempt, None, 15, True, "stopped (signal 15)", "", now)
        )

    def poll(self) -> list[AttemptEnded]:
        now = self.clock()
        ended, self.stopped = self.stopped, []
        for key, run in list(self.running.items()):
            if run.ends_at > now:
                self._report(run, now)
                continue
            self._report(run, run.ends_at)
            del self.running[key]
            self.done[key[0]] = self.steps[key[0]]
            ended.append(AttemptEnded(key[0], key[1], 0, None, False, "exit 0", "", run.ends_at))
        return ended

    def recover(self, job_id: str, attempt: int, attempt_dir: Path) -> str:
        return "running" if (job_id, attempt) in self.running else "never-started"

    def leftover(self, job_id: str, attempt: int, attempt_dir: Path) -> int:
        return 0

    def close(self) -> None:
        pass


def start_inert(
    data_dir: Path, *, db_url: str | None = None, gpus: int = 2, **settings: Any
) -> RunningServer:
    """A live manager (HTTP on 127.0.0.1) whose jobs end as soon as they start."""
    options = ServerOptions(
        data_dir=data_dir,
        gpus=gpus,
        db_url=db_url,
        settings=fast_settings(**settings),
        single_user=True,
    )
    return RunningServer(build_manager(options, InstantExecutor())).start()
