"""Instructions per API submission and per start in a round: the control plane's cost, load-proof.

`control_plane.py`'s jobs/s move by a fifth from one minute to the next on a shared 2-core
machine; the instructions executed do not. This counts them under valgrind's cachegrind
(`--cache-sim=no`, a fixed `PYTHONHASHSEED`), with `instructions.py`'s `count_instructions`, in
two in-process passes of different sizes whose difference is divided by the difference in
items (1,000), so that start-up and set-up cancel out (two runs of the same pass differ by 0.1
to 0.3 %: the figures move by up to 0.03 M instructions an item between runs):

- `submit`: POST /api/v1/jobs through the API's ASGI app (its middleware, authentication, the
  spec's checks, the answer), in groups of 8 submissions stored in one commit (as the committing
  thread stores 8 clients' submissions), on a manager of 1,000 declared 8-GPU nodes;
- `start`: one round that starts every job of a queue (the round's writes and the launches'
  records, an executor that starts nothing), less what queueing those jobs cost.

Without uvicorn's protocol and the threads: what the numbers leave out is the HTTP parsing, the
connection guard and the switching between threads, which `control_plane.py` includes.

Run: [PYTHONPATH=DIR] python benchmarks/control_plane_instructions.py [--what submit|start]
(DIR: a copy of another commit, measured with this script). Needs valgrind. With
BENCH_IDEMPOTENCY_KEYS=1 each submission carries an `Idempotency-Key`, as the SDK's and the CLI's
do (docs/ha.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
from pathlib import Path

from instructions import count_instructions  # (beside this script)

from corral.core.cluster import Cluster
from corral.server import auth
from corral.server.api import create_app
from corral.server.manager import Manager, ManagerSettings
from corral.server.spec import parse_job_spec
from corral.server.store import Store

SIZES = (1, 1, 1, 1, 2, 2, 4, 8)  # GPUs per job, as control_plane.py
GROUP = 8  # submissions stored in one commit


class _Inert:
    """An executor that starts nothing and reports nothing."""

    def launch(self, launch: object) -> None:
        pass

    def stop(self, job_id: str, attempt: int) -> None:
        pass

    def poll(self) -> list[object]:
        return []

    def recover(self, job_id: str, attempt: int, attempt_dir: Path) -> str:
        return "never-started"

    def close(self) -> None:
        pass


def _manager(data_dir: Path) -> tuple[Manager, str]:
    store = Store(Store.sqlite_url(data_dir))
    auth.ensure_admin_token(store, data_dir)
    token = (data_dir / "admin.token").read_text().strip()
    cluster = Cluster.shorthand(1000, 8, racks=31)
    manager = Manager(store, _Inert(), cluster, data_dir, settings=ManagerSettings())
    manager.recover()  # (not started: no threads; commits are made here, in groups)
    return manager, token


def _submit(manager: Manager, token: str, count: int) -> None:
    """`count` submissions through the app, GROUP at a time, each group one commit."""

    async def stored(
        model: object, user: str, unix_user: str | None = None, key: str | None = None
    ) -> object:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def finish(error: BaseException | None) -> None:
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(error)

        enqueue = manager._enqueue_submission
        if key is not None:  # (an older commit's manager takes no key)
            row = enqueue(model, user, finish, unix_user, key)  # type: ignore[arg-type,call-arg]
        else:
            row = (
                enqueue(model, user, finish, unix_user)
                if unix_user
                else enqueue(model, user, finish)
            )  # type: ignore[arg-type]
        if len(manager._inbox) >= GROUP:
            manager._commit_submissions()
        await done
        return row

    def keyed(index: int) -> list[tuple[bytes, bytes]]:
        """With BENCH_IDEMPOTENCY_KEYS set, each submission carries its key, as the SDK's do."""
        if not os.environ.get("BENCH_IDEMPOTENCY_KEYS"):
            return []
        return [(b"idempotency-key", f"key-{index}".encode())]

    manager.submit_async = stored  # type: ignore[method-assign]
    app = create_app(manager)
    headers = [
        (b"host", b"127.0.0.1"),
        (b"content-type", b"application/json"),
        (b"authorization", f"Bearer {token}".encode()),
    ]

    async def one(index: int) -> None:
        body = json.dumps(
            {"name": f"job-{index}", "gpus": SIZES[index % 8], "command": "true"}
        ).encode()
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/api/v1/jobs",
            "raw_path": b"/api/v1/jobs",
            "query_string": b"",
            "headers": [*headers, (b"content-length", str(len(body)).encode()), *keyed(index)],
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8000),
            "root_path": "",
            "state": {},
        }
        messages = [{"type": "http.request", "body": body, "more_body": False}]
        statuses: list[int] = []

        async def receive() -> dict[str, object]:
            if messages:
                return messages.pop()
            await asyncio.Event().wait()  # (never: the answer ends the call)
            return {}

        async def send(message: dict[str, object]) -> None:
            if message["type"] == "http.response.start":
                statuses.append(int(message["status"]))  # type: ignore[call-overload]

        await app(scope, receive, send)
        if statuses != [201]:
            raise SystemExit(f"control_plane_instructions.py: a submission got {statuses}")

    async def run() -> None:
        for first in range(0, count, GROUP):
            await asyncio.gather(*(one(first + k) for k in range(GROUP)))

    asyncio.run(run())


def _queue(manager: Manager, count: int) -> None:
    rng = random.Random(1)
    for index in range(count):
        spec = {"name": f"job-{index}", "gpus": rng.choice(SIZES), "command": "true"}
        manager._enqueue_submission(parse_job_spec(spec), "bench", lambda error: None)
    manager._commit_submissions()


def one_pass(what: str, count: int) -> None:
    """The measured work, once (run under valgrind by `main`)."""
    with tempfile.TemporaryDirectory() as tmp:
        manager, token = _manager(Path(tmp))
        if what == "submit":
            _submit(manager, token, count)
        else:  # "start" and "queue": the same queue; only "start" runs the round
            _queue(manager, count)
            if what == "start":
                manager.step()
                started = manager.scheduler.running_count
                if started < count:
                    raise SystemExit(f"control_plane_instructions.py: {started} of {count} started")


def counted(what: str, count: int) -> int:
    arguments = [__file__, "--one", what, str(count)]
    return count_instructions(arguments, "control_plane_instructions.py")[0]


def per_item(what: str, small: int, large: int) -> float:
    return (counted(what, large) - counted(what, small)) / (large - small)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--what", choices=("submit", "start", "both"), default="both")
    parser.add_argument("--one", nargs=2, metavar=("WHAT", "COUNT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        one_pass(args.one[0], int(args.one[1]))
        return
    if args.what in ("submit", "both"):
        submit = per_item("submit", 48, 1048)
        print(
            f"an API submission (groups of {GROUP}, one commit each): {submit / 1e6:.3f} M instructions"
        )
    if args.what in ("start", "both"):
        start = per_item("start", 200, 1200) - per_item("queue", 200, 1200)
        print(
            f"a start in a round (1,000 more jobs started at once): {start / 1e6:.3f} M instructions"
        )


if __name__ == "__main__":
    main()
