"""An executor that runs nothing (`corral up --executor inert`).

For trying a policy on the real control plane (API, store, control loop, metrics) and for
benchmarks of it: no process, file, cgroup or account. Each attempt "runs" until its time limit
(`AttemptLaunch.time_limit_at`: the spec's `time_limit` less what the job's earlier attempts
ran) and then exits 0, so the job succeeds; an attempt whose spec gives no `time_limit` runs
until it is stopped. A pre-run (its workers have CORRAL_PRECHECK=1) passes at once. `stop` ends
an attempt at once, as its stop signal would. Nothing outlives the manager: after a restart the
attempts it had are found never started (requeued).

The time limit is read on the manager's clock: `poll` ends an attempt once the clock has reached
its `time_limit_at`, the instant past which the manager would stop it as over its limit, so an
inert attempt always ends by itself first.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from corral.exec.local import AttemptEnded, AttemptLaunch

TIME_LIMIT_REASON = "exit code 0: reached its time_limit (inert executor)"
PRERUN_REASON = "exit code 0: a pre-run passes at once (inert executor)"
STOPPED_REASON = "stopped: ended at once (inert executor)"


def _is_prerun(launch: AttemptLaunch) -> bool:
    return any(worker.env.get("CORRAL_PRECHECK") == "1" for worker in launch.workers)


class InertExecutor:
    """Attempts that run nothing and end at their time limit; thread-safe. `poll` costs the
    attempts that end, not the attempts that run (their limits are kept in a heap)."""

    #: Shares of a GPU, packed guests: nothing runs, so anything may share.
    shares_gpus = True
    #: What `corral up` says at its start about the jobs' accounts.
    identity_text = "none runs: the inert executor starts no process, under no account"

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._running: dict[tuple[str, int], AttemptLaunch] = {}
        self._limits: list[tuple[float, str, int]] = []  # (time_limit_at, job, attempt), a heap
        self._ended: list[AttemptEnded] = []  # stopped, or pre-runs, not yet polled

    def launch(self, launch: AttemptLaunch) -> None:
        key = (launch.job_id, launch.attempt)
        with self._lock:
            if key in self._running:
                raise ValueError(f"attempt {launch.attempt} of job {launch.job_id} is running")
            if _is_prerun(launch):
                self._ended.append(self._end(launch, 0, None, False, PRERUN_REASON, self.clock()))
                return
            self._running[key] = launch
            if launch.time_limit_at is not None:
                heapq.heappush(self._limits, (launch.time_limit_at, launch.job_id, launch.attempt))

    def stop(self, job_id: str, attempt: int) -> None:
        with self._lock:
            launch = self._running.pop((job_id, attempt), None)
            if launch is not None:  # its entry in the heap is skipped when it comes up
                ended = self._end(launch, None, launch.stop_signal, True, STOPPED_REASON)
                self._ended.append(ended)

    def signal(self, job_id: str, attempt: int, number: int) -> None:
        """Nothing runs to receive it."""

    def poll(self) -> list[AttemptEnded]:
        now = self.clock()
        with self._lock:
            ended, self._ended = self._ended, []
            while self._limits and self._limits[0][0] <= now:
                at, job_id, attempt = heapq.heappop(self._limits)
                launch = self._running.pop((job_id, attempt), None)
                if launch is not None:
                    ended.append(self._end(launch, 0, None, False, TIME_LIMIT_REASON, at))
            return ended

    def recover(
        self, job_id: str, attempt: int, attempt_dir: Path
    ) -> Literal["running", "never-started"]:
        """Running: an attempt this executor runs (the manager rebuilding its state); never
        started: any other (after a restart nothing of it is left)."""
        with self._lock:
            return "running" if (job_id, attempt) in self._running else "never-started"

    def leftover(self, job_id: str, attempt: int, attempt_dir: Path) -> int:
        return 0

    def active(self) -> set[tuple[str, int]]:
        with self._lock:
            return set(self._running)

    def limits_text(self, pids_cap: str) -> str:
        """What `corral up` says at its start about the attempts' limits."""
        return "none: the inert executor runs no process"

    def close(self) -> None:
        with self._lock:
            self._running.clear()
            self._limits.clear()
            self._ended.clear()

    def _end(
        self,
        launch: AttemptLaunch,
        exit_code: int | None,
        signal: int | None,
        stopped: bool,
        reason: str,
        at: float | None = None,
    ) -> AttemptEnded:
        ended_at = self.clock() if at is None else at
        return AttemptEnded(
            launch.job_id, launch.attempt, exit_code, signal, stopped, reason, "", ended_at
        )
