"""A manager that runs nothing: for tests of what the API accepts and answers (the fuzzer's
random commands, large numbers of jobs), where a job's processes do not matter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from corral.exec.local import AttemptEnded, AttemptLaunch, LocalExecutor
from corral.server.boot import RunningServer, ServerOptions, build_manager
from tests.server.helpers import fast_settings


class InertExecutor(LocalExecutor):
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
    return RunningServer(build_manager(options, InertExecutor())).start()
