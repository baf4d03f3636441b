"""`launcher: torchrun` and `env_from: submitter` on a live manager (`corral up` as a process of
its own, local executor, 4 declared GPUs) with a real PyTorch DDP job (CPU, gloo).

The manager's PATH has no torchrun: the job finds it on the submitter's PATH, which `corral
submit` (the Python client) sends with `env_from: submitter`."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.client import Client
from tests.server.helpers import (
    REPO,
    Corral,
    admin_token,
    job,
    kill_jobs_of,
    submit,
    wait_for,
    wait_until,
)

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="needs PyTorch (a test dependency)"
)

SCRIPT = str(REPO / "tests" / "server" / "torchrun_job.py")
VENV_BIN = str(Path(sys.executable).parent)

#: One machine of 4 GPUs; VCs `a` and `b` are guaranteed two each.
FOUR_GPUS = """\
cell_types:
  ONE: {child: gpu, count: 1}
  NODE: {child: ONE, count: 4, node: true}
physical_cells:
  - {type: NODE, count: 1}
virtual_clusters:
  a: {ONE: 2}
  b: {ONE: 2}
"""

#: Waits for its gate file, then exits 0: it holds a GPU of VC a while the test looks.
GATED = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.05)"


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[Corral]:
    config = tmp_path / "cluster.yaml"
    config.write_text(FOUR_GPUS)
    # The manager's environment has neither torchrun on its PATH nor the submitter's variables.
    path = ":".join(p for p in os.environ.get("PATH", "").split(":") if p and p != VENV_BIN)
    env = {key: value for key, value in os.environ.items() if not key.startswith("CORRAL_")}
    env.update(PATH=path or "/usr/bin:/bin", PYTHONPATH=str(REPO))
    env.pop("SUBMITTER_MARK", None)
    corral = Corral(tmp_path / "state", "--gpus", "4", "--config", str(config), env=env)
    try:
        yield corral
    finally:
        corral.stop()
        kill_jobs_of(corral.data_dir)


def seen(directory: Path, attempt: int) -> dict[int, dict] | None:
    """What each of an attempt's 4 processes saw, by RANK; None until all 4 wrote it."""
    found = {}
    for file in directory.glob(f"attempt-{attempt}-rank-*.json"):
        data = json.loads(file.read_text())
        found[int(data["RANK"])] = data
    return found if len(found) == 4 else None


def expected(rank: int, attempt: int) -> dict[str, object]:
    """Worked out by hand: 4 GPUs, 2 workers of 2, all on one node, so worker 0 (torchrun's node
    0) holds devices 0 and 1, worker 1 devices 2 and 3; torchrun numbers its processes
    RANK = node_rank * 2 + LOCAL_RANK, and each sees only its own worker's devices."""
    node_rank, local_rank = divmod(rank, 2)
    return {
        "CUDA_VISIBLE_DEVICES": "0,1" if node_rank == 0 else "2,3",
        "LOCAL_RANK": str(local_rank),
        "RANK": str(rank),
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "NODE_RANK": str(node_rank),
        "NNODES": "2",
        "CORRAL_GPUS_PER_WORKER": "2",
        "CORRAL_ATTEMPT": str(attempt),
        "SUBMITTER_MARK": "from-bob",  # the submitter's environment reached the job...
        "MY_API_TOKEN": None,  # ... less what looks like a secret
        "CORRAL_TOKEN": None,  # ... and corral's own credentials
        "device": str(rank),  # LOCAL_RANK picks the worker's own GPU: device = RANK here
    }


def log(client, job_id: str, attempt: int) -> str:
    return client.get(f"/api/v1/jobs/{job_id}/logs", params={"attempt": attempt}).text


def test_a_torchrun_job_sees_its_own_gpus_and_resumes_after_a_preemption(
    manager: Corral, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    admin = manager.start()
    made = admin.post("/api/v1/tokens", json={"user": "bob", "vc": "b"})
    assert made.status_code == 201, made.text
    bob_token = made.json()["token"]
    out = tmp_path / "seen"
    out.mkdir()
    gate = tmp_path / "gate"
    # The submitter's shell: torchrun on its PATH (its virtualenv), a variable of its own, a
    # secret-looking one and corral's credentials, which must not reach the job.
    monkeypatch.setenv("PATH", f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    monkeypatch.setenv("SUBMITTER_MARK", "from-bob")
    monkeypatch.setenv("MY_API_TOKEN", "hunter2")
    monkeypatch.setenv("CORRAL_URL", manager.url)
    monkeypatch.setenv("CORRAL_TOKEN", bob_token)
    spec = {
        "name": "ddp-torchrun",
        "gpus": 4,
        "workers": 2,
        "launcher": "torchrun",
        "env_from": "submitter",
        "command": [SCRIPT],
        "env": {
            "SEEN_DIR": str(out),
            "TRAIN_STEPS": 150,
            "STEP_SECONDS": 0.1,
            "CHECKPOINT_EVERY": 5,
        },
        "grace_seconds": 60,
    }
    with Client() as bob_client:
        job_id = str(bob_client.submit(spec)["id"])
    stored = job(admin, job_id)["spec"]
    assert stored["submitter_env"]["SUBMITTER_MARK"] == "from-bob"
    assert not {"MY_API_TOKEN", "CORRAL_TOKEN", "CORRAL_URL"} & set(stored["submitter_env"])

    first = wait_until(lambda: seen(out, 1), "the 4 processes of attempt 1", timeout=180)
    assert first == {rank: expected(rank, 1) for rank in range(4)}
    wait_until(
        lambda: (job(admin, job_id)["progress"] or {}).get("step", 0) >= 5,
        "attempt 1 training",
        timeout=180,
    )

    # VC a takes one of its GPUs back: bob's job, which borrowed two of them, is preempted.
    taker = submit(
        admin, name="taker", gpus=1, vc="a", command=[sys.executable, "-c", GATED, str(gate)]
    )
    try:
        preempted = wait_until(
            lambda: (
                (found := job(admin, job_id))["attempt_history"]
                and found["attempt_history"][0]["state"] == "ended"
                and found
            ),
            "attempt 1 preempted and ended",
        )
        attempt = preempted["attempt_history"][0]
        # torchrun exits 1 (a SignalException's traceback) when stopped: still a preemption.
        assert (attempt["outcome"], attempt["exit_code"]) == ("preempted", 1), attempt
        assert preempted["preemptions"] == 1 and preempted["failures"] == 0, preempted
        # torchrun forwarded the stop to its processes: rank 0 saved and said so.
        assert "rank 0: stopped at step" in log(admin, job_id, 1)
    finally:
        gate.touch()
    assert wait_for(admin, taker)["status"] == "SUCCEEDED"

    done = wait_for(admin, job_id, timeout=300)
    assert done["status"] == "SUCCEEDED", done
    assert done["preemptions"] == 1 and done["failures"] == 0, done
    assert [a["outcome"] for a in done["attempt_history"]] == ["preempted", "succeeded"]
    assert seen(out, 2) == {rank: expected(rank, 2) for rank in range(4)}
    text = log(admin, job_id, 2)
    assert "rank 0/4: resumed from step" in text and "rank 0: done" in text
    resumed_at = int(text.split("rank 0/4: resumed from step ")[1].split()[0])
    assert resumed_at >= 5  # from the checkpoint, not from step 0
    assert done["progress"]["step"] == 150


def test_a_cancelled_torchrun_job_is_cancelled_whatever_torchrun_exits_with(
    manager: Corral, tmp_path: Path
) -> None:
    admin = manager.start()
    out = tmp_path / "seen"
    out.mkdir()
    path = f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    spec = {
        "name": "cancelled",
        "vc": "a",
        "gpus": 2,
        "workers": 1,
        "launcher": "torchrun",
        "env_from": "submitter",
        "command": SCRIPT,  # a string: split into words, no shell
        "env": {"SEEN_DIR": str(out), "TRAIN_STEPS": 100000, "STEP_SECONDS": 0.05},
    }
    job_id = submit(admin, **spec | {"submitter_env": {"PATH": path}})  # as a client sends it
    wait_until(
        lambda: (job(admin, job_id)["progress"] or {}).get("step", 0) >= 2, "the job training"
    )
    admin.post(f"/api/v1/jobs/{job_id}/cancel")
    done = wait_for(admin, job_id)
    assert done["status"] == "CANCELLED" and done["failures"] == 0
    ended = wait_until(
        lambda: (a := job(admin, job_id)["attempt_history"][0])["state"] == "ended" and a,
        "the cancelled attempt's end",
    )
    assert (ended["outcome"], ended["exit_code"]) == ("cancelled", 1), ended


#: A 2-process gloo job: each process sums its rank + 1 with the other's (1 + 2 = 3), then
#: writes three lines to stdout and one to stderr, each naming its RANK.
RANKED = """\
import sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
total = torch.tensor([rank + 1.0])
dist.all_reduce(total)
for line in range(3):
    print(f"process {rank} line {line} sum {total.item():g}", flush=True)
print(f"process {rank} on stderr", file=sys.stderr, flush=True)
dist.barrier()
dist.destroy_process_group()
"""


def test_each_torchrun_process_has_its_own_log_by_rank(manager: Corral, tmp_path: Path) -> None:
    admin = manager.start()
    script = tmp_path / "ranked.py"
    script.write_text(RANKED)
    path = f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    spec = {
        "name": "ranked",
        "vc": "a",
        "gpus": 2,
        "workers": 1,  # one torchrun agent, 2 processes: RANK 0 and 1
        "launcher": "torchrun",
        "command": [str(script)],
        "env": {"PATH": path},
    }
    job_id = submit(admin, **spec)
    done = wait_for(admin, job_id, timeout=300)
    assert done["status"] == "SUCCEEDED", done

    def lines(rank: int, stream: str = "stdout") -> list[str]:
        params: dict[str, Any] = {"attempt": 1, "rank": rank, "stream": stream}
        text = admin.get(f"/api/v1/jobs/{job_id}/logs", params=params).text
        return [line for line in text.splitlines() if line.startswith("process ")]

    # Each RANK's file has its own lines only, whole, in order (torchrun's own messages, if
    # any, go with RANK 0's, its first process's: none start with "process ").
    for rank in (0, 1):
        assert lines(rank) == [f"process {rank} line {i} sum 3" for i in range(3)]
        assert lines(rank, "stderr") == [f"process {rank} on stderr"]
    # `corral logs JOB --rank 1` reads the same.
    token = admin_token(manager.data_dir)
    env = {**os.environ, "CORRAL_URL": manager.url, "CORRAL_TOKEN": token}
    ran = subprocess.run(
        [sys.executable, "-m", "corral.cli", "logs", job_id, "--rank", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    shown = [line for line in ran.stdout.splitlines() if line.startswith("process ")]
    assert shown == [f"process 1 line {i} sum 3" for i in range(3)]
