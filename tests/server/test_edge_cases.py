"""Edge cases of stopping, restarting and failing half-way, with real processes."""

from __future__ import annotations

from pathlib import Path

from tests.server.helpers import (
    TWO_VCS,
    admin_token,
    alive,
    api,
    job,
    kill_jobs_of,
    python_job,
    start_server,
    submit,
    wait_for,
    wait_until,
)

# Ignores SIGTERM: only the SIGKILL after its grace period ends it.
STUBBORN = (
    "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print(os.getpid(), flush=True); time.sleep(600)"
)


def _pid(data_dir: Path, job_id: str, attempt: int = 1) -> int:
    out = data_dir / "jobs" / job_id / f"attempt-{attempt}" / "rank-0.stdout"
    wait_until(lambda: out.is_file() and out.read_text().strip(), f"job {job_id}'s pid")
    return int(out.read_text().split()[0])


def test_a_cancelled_job_still_stopping_keeps_its_gpu_across_a_restart(data_dir: Path) -> None:
    server = start_server(data_dir, gpus=1)
    try:
        client = api(server.url, admin_token(data_dir))
        stubborn = submit(client, **python_job("stubborn", STUBBORN, grace_seconds=3))
        wait_for(client, stubborn, ["RUNNING"])
        pid = _pid(data_dir, stubborn)
        client.post(f"/api/v1/jobs/{stubborn}/cancel")
    finally:
        server.stop()  # its process is still in its grace period
    server = start_server(data_dir, gpus=1)
    try:
        client = api(server.url, admin_token(data_dir))
        after = submit(client, **python_job("after", "print('mine')"))
        wait_for(client, after, ["RUNNING", "SUCCEEDED"])
        assert not alive(pid)  # the new job started only once the old process was gone
        assert wait_for(client, after)["status"] == "SUCCEEDED"
        assert [a["state"] for a in job(client, stubborn)["attempt_history"]] == ["ended"]
    finally:
        server.stop()


def test_a_preempted_job_does_not_restart_while_its_last_attempt_still_stops(
    data_dir: Path,
) -> None:
    server = start_server(data_dir, gpus=2, config=TWO_VCS, policy="fifo")
    try:
        admin = api(server.url, admin_token(data_dir))
        token = admin.post("/api/v1/tokens", json={"user": "bob", "vc": "b"}).json()["token"]
        bob = api(server.url, token)
        short = submit(bob, **python_job("short", "import time; time.sleep(1.5)"))
        stubborn = submit(bob, **python_job("stubborn", STUBBORN, grace_seconds=3))
        wait_for(bob, stubborn, ["RUNNING"])  # on a's idle GPU, borrowed
        _pid(data_dir, stubborn)
        mine = submit(admin, **python_job("a1", "import time; time.sleep(5)", vc="a"))
        wait_for(admin, mine, ["RUNNING"])  # a took its GPU back: stubborn stops, 3 s of grace
        wait_for(bob, short)  # its GPU is free while stubborn's first attempt still stops
        history = wait_until(
            lambda: len(found := job(bob, stubborn)["attempt_history"]) >= 2 and found,
            "stubborn's second attempt",
        )
        first, second = history[0], history[1]
        assert first["outcome"] == "preempted"
        # one job, one checkpoint directory: attempt 2 waits for attempt 1's processes
        assert second["started_at"] >= first["ended_at"]
        for job_id in (stubborn, mine):
            admin.post(f"/api/v1/jobs/{job_id}/cancel")
    finally:
        server.stop()


def test_a_start_cancelled_while_waiting_for_gpus_is_no_attempt(data_dir: Path) -> None:
    server = start_server(data_dir, gpus=2, config=TWO_VCS)
    try:
        admin = api(server.url, admin_token(data_dir))
        # Grace long enough that the drain outlasts the checks below on a loaded machine (the
        # jobs are killed at the end anyway).
        borrower = submit(admin, **python_job("b-borrows", STUBBORN, vc="b", grace_seconds=30))
        other = submit(admin, **python_job("b-own", STUBBORN, vc="b", grace_seconds=30))
        wait_for(admin, borrower, ["RUNNING"])
        wait_for(admin, other, ["RUNNING"])
        _pid(data_dir, borrower)  # both ignore SIGTERM: whichever b gives back drains for 30 s
        _pid(data_dir, other)
        waiting = submit(admin, **python_job("a1", "pass", vc="a"))  # reclaims a's GPU
        # the borrower is stopping; a1 waits for its GPU to drain
        wait_until(
            lambda: "waiting for a stopped job's processes" in job(admin, waiting)["reason"],
            "a1 to wait for the borrower's processes",
        )
        admin.post(f"/api/v1/jobs/{waiting}/cancel")
        detail = job(admin, waiting)
        assert detail["status"] == "CANCELLED"
        assert detail["attempts"] == 0 and detail["attempt_history"] == []
        logs = admin.get(f"/api/v1/jobs/{waiting}/logs")
        assert logs.headers["X-Corral-Finished"] == "true"  # `logs -f` ends
        for job_id in (borrower, other):
            admin.post(f"/api/v1/jobs/{job_id}/cancel")
    finally:
        server.stop()


def test_a_job_id_with_a_leading_zero_names_the_same_job(data_dir: Path) -> None:
    server = start_server(data_dir, gpus=1)
    try:
        client = api(server.url, admin_token(data_dir))
        job_id = submit(client, **python_job("sleeper", "import time; time.sleep(600)"))
        wait_for(client, job_id, ["RUNNING"])
        response = client.post(f"/api/v1/jobs/0{job_id}/cancel")
        assert response.status_code == 200 and response.json()["status"] == "CANCELLED"
        assert job(client, job_id)["status"] == "CANCELLED"
    finally:
        server.stop()


def test_a_job_whose_vc_left_the_config_fails_at_restart_and_the_rest_runs(
    data_dir: Path,
) -> None:
    server = start_server(data_dir, gpus=2, config=TWO_VCS)
    try:
        client = api(server.url, admin_token(data_dir))
        hog = python_job("blocker", "import time; time.sleep(600)", gpus=2, vc="a")
        blocker = submit(client, **hog)
        wait_for(client, blocker, ["RUNNING"])
        # b asks for more than its quota: it cannot take back the GPU a borrowed, so it waits
        orphan = submit(client, **python_job("orphan", "pass", vc="b", gpus=2))
        survivor = submit(client, **python_job("survivor", "pass", vc="a"))
        assert job(client, orphan)["status"] == job(client, survivor)["status"] == "PENDING"
    finally:
        server.stop()  # the blocker keeps running; the other two wait in the store
    only_a = TWO_VCS.replace("  b: {ONE: 1}\n", "").replace("a: {ONE: 1}", "a: {ONE: 2}")
    server = start_server(data_dir, gpus=2, config=only_a)
    try:
        client = api(server.url, admin_token(data_dir))
        failed = wait_for(client, orphan)
        assert failed["status"] == "FAILED"
        assert failed["reason"].startswith("could not be recovered after a restart")
        assert job(client, blocker)["status"] == "RUNNING"  # found again
        client.post(f"/api/v1/jobs/{blocker}/cancel")
        assert wait_for(client, survivor)["status"] == "SUCCEEDED"
    finally:
        server.stop()


def test_a_preempted_jobs_escaped_processes_are_gone_before_its_gpu_is_given_on(
    data_dir: Path, tmp_path: Path
) -> None:
    """The borrower starts a process in a session of its own that ignores SIGTERM (as torchrun's
    workers live in sessions of their own); the job that takes the GPU back counts, as its
    first act, the processes of the borrower that still live: none."""
    mark = f"corral-borrower-{tmp_path.name}"
    escaped = tmp_path / "escaped"
    borrower_code = (
        "import os, subprocess, time\n"
        "subprocess.Popen(['setsid', 'sh', '-c', "
        + repr(f'trap "" TERM; echo $$ > {escaped}; exec sleep 600')
        + "])\n"
        "time.sleep(600)\n"
    )
    counter = (
        "import os\n"
        f"mark = b'BORROWER_MARK={mark}'\n"
        "left = []\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try:\n"
        "        env = open(f'/proc/{pid}/environ', 'rb').read().split(b'\\0')\n"
        "        state = open(f'/proc/{pid}/stat', 'rb').read().rsplit(b')', 1)[1].split()[0]\n"
        "    except OSError:\n"
        "        continue\n"
        "    if mark in env and state not in (b'Z', b'X'):\n"
        "        left.append(pid)\n"
        "print('borrower processes left:', len(left), flush=True)\n"
    )
    server = start_server(data_dir, gpus=2, config=TWO_VCS, policy="fifo")
    try:
        admin = api(server.url, admin_token(data_dir))
        env = {"BORROWER_MARK": mark}
        own = submit(admin, **python_job("b-own", "import time; time.sleep(600)", vc="b"))
        borrower = submit(
            admin, **python_job("b-borrows", borrower_code, vc="b", env=env, grace_seconds=2)
        )
        wait_for(admin, own, ["RUNNING"])
        wait_for(admin, borrower, ["RUNNING"])  # on a's GPU
        wait_until(lambda: escaped.exists() and escaped.read_text().strip(), "the escapee")
        reclaim = submit(admin, **python_job("a-reclaims", counter, vc="a"))
        assert wait_for(admin, reclaim)["status"] == "SUCCEEDED"
        log = admin.get(f"/api/v1/jobs/{reclaim}/logs").text
        assert "borrower processes left: 0" in log, log
        assert job(admin, borrower)["attempt_history"][0]["outcome"] == "preempted"
        for job_id in (own, borrower):
            admin.post(f"/api/v1/jobs/{job_id}/cancel")
    finally:
        server.stop()
        kill_jobs_of(data_dir)


# Fails loudly when stopped, as torchrun does: a traceback and exit code 1 on SIGTERM.
LOUD = (
    "import os, signal, time\n"
    "def stopped(*_):\n"
    "    raise RuntimeError('SignalException: got SIGTERM')\n"
    "signal.signal(signal.SIGTERM, stopped)\n"
    "print(os.getpid(), flush=True)\n"
    "time.sleep(600)\n"
)


def test_a_stop_the_manager_asked_for_is_its_outcome_whatever_the_exit_code(
    data_dir: Path,
) -> None:
    server = start_server(data_dir, gpus=2, config=TWO_VCS, policy="fifo")
    try:
        admin = api(server.url, admin_token(data_dir))
        token = admin.post("/api/v1/tokens", json={"user": "bob", "vc": "b"}).json()["token"]
        bob = api(server.url, token)
        loud = submit(bob, **python_job("loud", LOUD, gpus=2, max_retries=0))
        wait_for(bob, loud, ["RUNNING"])  # on a's idle GPU too, borrowed
        _pid(data_dir, loud)
        mine = submit(admin, **python_job("a1", "print('mine')", vc="a"))
        assert wait_for(admin, mine)["status"] == "SUCCEEDED"  # a took its GPU back
        first = wait_until(
            lambda: (a := job(bob, loud)["attempt_history"][0])["state"] == "ended" and a,
            "the preempted attempt's end",
        )
        assert (first["outcome"], first["exit_code"]) == ("preempted", 1), first
        found = job(bob, loud)
        assert (found["preemptions"], found["failures"]) == (1, 0), found
        assert found["status"] in ("PENDING", "RUNNING")  # not FAILED, for all max_retries 0
        running = wait_until(
            lambda: (
                (f := job(bob, loud))["status"] == "RUNNING"
                and len(f["attempt_history"]) == 2
                and f
            ),
            "the second attempt",
        )
        _pid(data_dir, loud, running["attempt_history"][1]["number"])
        bob.post(f"/api/v1/jobs/{loud}/cancel")
        assert wait_for(bob, loud)["status"] == "CANCELLED"
        second = wait_until(
            lambda: (a := job(bob, loud)["attempt_history"][1])["state"] == "ended" and a,
            "the cancelled attempt's end",
        )
        assert (second["outcome"], second["exit_code"]) == ("cancelled", 1), second
        assert job(bob, loud)["failures"] == 0
    finally:
        server.stop()
