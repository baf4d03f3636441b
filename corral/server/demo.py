"""`corral up --demo`: the embedded manager with declared GPUs runs a small workload of two teams.

Two VCs share one 4-GPU machine, 2 GPUs guaranteed each. Team vision (alice) starts two training
jobs; with team nlp idle, the second runs on nlp's GPUs, borrowed. When bob of nlp submits, his VC
takes its GPUs back: the borrowed job is preempted (SIGTERM, its checkpoint written), waits, and
resumes from its checkpoint when GPUs free up. A job with a typo fails fast the same way three
times and is stopped as a user error instead of being retried forever. Everything is real: the
API over HTTP, SQLite, one process per worker.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from corral.client import Client
from corral.core.framework import config_from_mapping, merge
from corral.server import identity
from corral.server.boot import RunningServer, ServerOptions, build_manager, prepare_data_dir


def _train_script(package: Path, cwd: Path) -> Path:
    """The clone's examples/train.py: beside the package (an editable install), else under the
    working directory (the README runs the demo from the clone's root, where a non-editable
    install's package lies in site-packages)."""
    beside = package.parents[2] / "examples" / "train.py"
    return beside if beside.is_file() else cwd / "examples" / "train.py"


TRAIN_SCRIPT = _train_script(Path(__file__).resolve(), Path.cwd())

DEMO_CLUSTER = """\
# The demo's machine: 4 GPUs as two pairs; each VC is guaranteed one pair.
cell_types:
  GPU-PAIR: {child: gpu, count: 2}
  DEMO-NODE: {child: GPU-PAIR, count: 2, node: true}
physical_cells:
  - {type: DEMO-NODE, count: 1}
virtual_clusters:
  vision: {GPU-PAIR: 1}
  nlp: {GPU-PAIR: 1}
"""

FINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def training_job(name: str, vc: str, gpus: int, steps: int, workers: int = 1) -> dict[str, object]:
    """examples/train.py for `steps` steps of 0.05 s, at the learning rate whose loss curve
    converges (by Optimus's fit, near step 8 / rate) about when the job ends: the losses it
    reports are a curve `--policy optimus` can fit."""
    return {
        "name": name,
        "vc": vc,
        "gpus": gpus,
        "workers": workers,
        "command": [sys.executable, str(TRAIN_SCRIPT)],
        "env": {
            "TRAIN_STEPS": str(steps),
            "STEP_SECONDS": "0.05",
            "LEARNING_RATE": f"{8 / steps:.2g}",
        },
        "grace_seconds": 10,
        "max_retries": 1,
    }


def run_demo(options: ServerOptions, console: Console) -> None:
    if not TRAIN_SCRIPT.is_file():
        from corral.server.boot import BootError

        raise BootError(
            f"{TRAIN_SCRIPT}: the demo's training script is missing (run from a clone's root)"
        )
    prepare_data_dir(options)  # checked before the demo writes its config there
    config = options.data_dir / "demo-cluster.yaml"
    config.write_text(DEMO_CLUSTER)
    options.config = config
    if options.gpus is None:
        options.gpus = 4
    quick_retries = {"retry": {"backoff_s": 1.0, "fast_fail_s": 30.0}}
    options.settings.scheduler = config_from_mapping(
        merge(options.settings.scheduler.to_mapping(), quick_retries)
    )
    account, whose = demo_account(options)
    manager = build_manager(options)
    server = RunningServer(manager, options.host, options.port).start()
    try:
        _play(server.url, options.data_dir, console, account, whose)
    finally:
        server.stop()


#: The demo's users have no Unix accounts of their own: as root, their jobs run as this one.
DEMO_ACCOUNT = "nobody"


def demo_account(options: ServerOptions) -> tuple[str | None, str]:
    """As root, the demo runs its jobs as `nobody` when that account can run them (this
    Python, the training script, the data dir); otherwise, or not as root, as the manager's own
    user. Returns the account (None: the manager's) and the line that says which, and why, in
    the words of `corral up`'s own (`identity.single_user_note`, `identity.multi_user_note`)."""
    if options.single_user or not identity.multi_user_possible():
        return None, identity.single_user_note()
    try:
        run_as = identity.account(DEMO_ACCOUNT)
    except identity.AccountError as error:
        problem: str | None = str(error)
    else:
        problem = (
            identity.may_use(Path(sys.executable), run_as, execute=True)
            or identity.may_use(TRAIN_SCRIPT, run_as)
            or identity.check_reachable(options.data_dir)
        )
    if problem is not None:
        options.single_user = True
        why = f"for the demo: its account {DEMO_ACCOUNT} cannot run its jobs here ({problem})"
        return None, identity.single_user_note(why)
    return DEMO_ACCOUNT, identity.multi_user_note(
        f"the demo's alice and bob: their tokens name account {DEMO_ACCOUNT}"
    )


class _Narrator:
    """Prints the demo's own steps and the manager's events of its jobs, in time order."""

    def __init__(self, client: Client, console: Console) -> None:
        self.client = client
        self.console = console
        self.started = time.time()
        self.names: dict[str, str] = {}
        self.printed: set[int] = set()

    def say(self, text: str, *, after_events: bool = True) -> None:
        """Print a step of the demo's, after the events so far (or before: an action's own
        consequences come after it)."""
        if after_events:
            self.events()
        self.console.print(f"t={time.time() - self.started:3.0f}s  {text}", highlight=False)

    def follow(self, job_ids: list[str]) -> None:
        for job_id in job_ids:
            self.names[job_id] = self.client.job(job_id)["name"]

    def events(self) -> list[dict[str, object]]:
        """Print the events not printed yet; returns the jobs' details."""
        details = [self.client.job(job_id) for job_id in self.names]
        news = sorted(
            (event for detail in details for event in detail["events"]),
            key=lambda event: event["id"],
        )
        for event in news:
            if event["id"] in self.printed or event["kind"] == "submitted":
                continue
            self.printed.add(event["id"])
            message = re.sub(
                r"job (\d+)", lambda m: self.names.get(m[1], m[0]), str(event["message"])
            )
            who = self.names[str(event["job_id"])]
            self.console.print(
                f"t={float(event['at']) - self.started:3.0f}s    {who}: {message}",  # type: ignore[arg-type]
                highlight=False,
            )
        return details


def _play(
    url: str, data_dir: Path, console: Console, account: str | None = None, whose: str = ""
) -> None:
    token = (data_dir / "admin.token").read_text().strip()
    admin = Client(url, token)
    console.print(f"corral demo: manager up at {url} (4 declared GPUs, VCs vision and nlp)")
    console.print(
        f"  dashboard  {url}/#token={token}   (live while the demo runs)",
        highlight=False,
        soft_wrap=True,
    )
    console.print(f"  state      {data_dir}", highlight=False)
    if whose:
        console.print(f"  jobs       {whose}", highlight=False, soft_wrap=True)
    alice = Client(url, admin.create_token("alice", vc="vision", unix_user=account)["token"])
    bob = Client(url, admin.create_token("bob", vc="nlp", unix_user=account)["token"])
    story = _Narrator(admin, console)
    ids = [
        alice.submit(training_job("resnet50", "vision", 2, steps=300))["id"],
        alice.submit(training_job("vit-base", "vision", 2, steps=300, workers=2))["id"],
    ]
    story.follow(ids)
    story.say(
        "alice (vision) submits resnet50 and vit-base (2 workers), 2 GPUs each",
        after_events=False,
    )
    _wait_until(admin, lambda jobs: all(j["status"] == "RUNNING" for j in jobs), ids, 30)
    story.say("both run: vit-base on nlp's idle GPUs, borrowed")
    time.sleep(5)
    bert = bob.submit(training_job("bert-large", "nlp", 2, steps=150))["id"]
    typo = bob.submit(
        {
            "name": "typo",
            "vc": "nlp",
            "gpus": 1,
            "command": [sys.executable, "-c", "import torchh"],
            "max_retries": 5,
        }
    )["id"]
    ids += [bert, typo]
    story.follow([bert, typo])
    story.say("bob (nlp) submits bert-large (2 GPUs): nlp takes its GPUs back", after_events=False)
    story.say("bob also submits a job with a typo in it, max_retries 5", after_events=False)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if all(detail["status"] in FINAL for detail in story.events()):
            break
        time.sleep(0.5)
    _summary(admin, ids, console)
    for job_id in ids:
        for attempt in range(2, int(admin.job(job_id)["attempts"]) + 1):
            text = admin.logs(job_id, attempt=attempt)[0]
            for line in text.splitlines():
                if "resumed from step" in line:
                    console.print(
                        f"  {story.names[job_id]}, attempt {attempt}: {line}", highlight=False
                    )
    console.print(
        f"done in {time.time() - story.started:.0f} s. The state stays in {data_dir}: "
        f"`corral up --gpus 4 --data-dir {data_dir} --config {data_dir / 'demo-cluster.yaml'}` "
        "serves it again.",
        highlight=False,
    )


def _wait_until(client: Client, done: object, ids: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = [j for j in client.jobs() if j["id"] in ids]
        if done(jobs):  # type: ignore[operator]
            return
        time.sleep(0.2)


def _summary(client: Client, ids: list[str], console: Console) -> None:
    table = Table(title="demo jobs")
    for column in ("id", "name", "user", "vc", "status", "gpus", "attempts", "preempted", "reason"):
        table.add_column(column)
    for job in sorted((j for j in client.jobs() if j["id"] in ids), key=lambda j: int(j["id"])):
        table.add_row(
            job["id"],
            job["name"],
            job["user"],
            job["vc"],
            job["status"],
            str(job["gpus"]),
            str(job["attempts"]),
            str(job["preemptions"]),
            str(job["reason"]),  # whole: the table wraps it
        )
    console.print(table)
