"""LocalExecutor and its shim with real processes: environment, exit codes, stop, gang, recover."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from corral.exec.local import (
    LOST_REASON,
    AttemptEnded,
    LocalExecutor,
    command_argv,
    free_port,
    launch_argv,
    placement_worker_envs,
    share_env,
    worker_envs,
)
from corral.exec.shim import is_alive
from tests.exec.helpers import PYTHON, make_launch, sh, wait_ended, wait_for_text

DUMP_ENV = (
    "import json, os, sys\n"
    "rank = os.environ['RANK']\n"
    "with open(sys.argv[1] + '/env-' + rank + '.json', 'w') as out:\n"
    "    json.dump({'env': dict(os.environ), 'cwd': os.getcwd()}, out)\n"
    "print('hello from', rank)\n"
    "print('note from', rank, file=sys.stderr)\n"
)


def test_each_worker_gets_its_environment_and_output_files(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    argv = [PYTHON, "-c", DUMP_ENV, str(dumps)]
    launch = make_launch(
        tmp_path,
        [argv, argv],
        job_id="12",
        attempt=3,
        gpus=[2, 3, 5, 6],
        extra_env={"FOO": "bar", "RANK": "99", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"},
    )
    executor.launch(launch)
    assert executor.active() == {("12", 3)}
    ended = wait_ended(executor)

    assert ended == AttemptEnded("12", 3, 0, None, False, "exit code 0", "", ended.ended_at)
    assert abs(ended.ended_at - time.time()) < 10
    assert executor.active() == set()
    port = launch.workers[0].env["MASTER_PORT"]
    for rank, own_gpus in ((0, "0,1"), (1, "2,3")):
        dump = json.loads((dumps / f"env-{rank}.json").read_text())
        env = dump["env"]
        # corral's variables win over the spec's env, which is otherwise passed through.
        assert env["CUDA_VISIBLE_DEVICES"] == "2,3,5,6"
        assert env["CORRAL_LOCAL_GPUS"] == own_gpus
        assert env["RANK"] == env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "2"
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert env["MASTER_PORT"] == port
        assert env["CORRAL_JOB_ID"] == "12"
        assert env["CORRAL_ATTEMPT"] == "3"
        assert env["CORRAL_CHECKPOINT_DIR"] == str(tmp_path / "jobs" / "12" / "checkpoint")
        assert env["FOO"] == "bar"
        assert env["PATH"] == os.environ["PATH"]  # the server's environment underneath
        assert dump["cwd"] == launch.workdir
        assert (launch.attempt_dir / f"rank-{rank}.stdout").read_text() == f"hello from {rank}\n"
        assert (launch.attempt_dir / f"rank-{rank}.stderr").read_text() == f"note from {rank}\n"
    result = json.loads((launch.attempt_dir / "result.json").read_text())
    assert [(w["rank"], w["exit_code"], w["signal"]) for w in result["workers"]] == [
        (0, 0, None),
        (1, 0, None),
    ]
    # Polled once, reported once.
    assert executor.poll() == []


def test_stop_lets_a_worker_that_handles_the_signal_exit_within_grace(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    launch = make_launch(
        tmp_path,
        [sh('trap "echo caught; exit 7" TERM; echo ready; while :; do sleep 0.05; done')],
        grace_s=5.0,
    )
    executor.launch(launch)
    wait_for_text(launch.attempt_dir / "rank-0.stdout", "ready")
    stop_at = time.monotonic()
    executor.stop("1", 1)
    executor.stop("1", 1)  # idempotent
    ended = wait_ended(executor)

    assert time.monotonic() - stop_at < 3.0  # well inside the 5 s grace: no SIGKILL wait
    assert (ended.exit_code, ended.signal, ended.stopped) == (7, None, True)
    assert ended.reason == "stopped: exit code 7 after SIGTERM"
    assert "caught" in (launch.attempt_dir / "rank-0.stdout").read_text()
    executor.stop("1", 1)  # after the end: nothing to do, no error
    executor.stop("nope", 1)


def test_stop_kills_a_worker_that_ignores_the_signal_after_grace(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    ignore = sh("trap '' TERM; echo ready; while :; do sleep 0.05; done")
    launch = make_launch(tmp_path, [ignore, ignore], grace_s=0.4)
    executor.launch(launch)
    wait_for_text(launch.attempt_dir / "rank-1.stdout", "ready")
    wait_for_text(launch.attempt_dir / "rank-0.stdout", "ready")
    stop_at = time.monotonic()
    executor.stop("1", 1)
    ended = wait_ended(executor)

    assert time.monotonic() - stop_at >= 0.4
    assert (ended.exit_code, ended.signal, ended.stopped) == (None, signal.SIGKILL, True)
    assert ended.reason == "stopped: killed by SIGKILL after 0.4 s grace"


def test_a_custom_stop_signal_is_sent(executor: LocalExecutor, tmp_path: Path) -> None:
    launch = make_launch(
        tmp_path,
        [sh('trap "exit 9" USR1; echo ready; while :; do sleep 0.05; done')],
        stop_signal=signal.SIGUSR1,
    )
    executor.launch(launch)
    wait_for_text(launch.attempt_dir / "rank-0.stdout", "ready")
    executor.stop("1", 1)
    ended = wait_ended(executor)
    assert (ended.exit_code, ended.stopped, ended.reason) == (
        9,
        True,
        "stopped: exit code 9 after SIGUSR1",
    )


def test_stop_right_after_launch_is_a_clean_stop(executor: LocalExecutor, tmp_path: Path) -> None:
    # The shim has not installed its SIGTERM handler yet: the signal must wait for it.
    executor.launch(make_launch(tmp_path, [sh("sleep 30")]))
    executor.stop("1", 1)
    ended = wait_ended(executor)
    assert ended.stopped
    assert ended.reason in ("stopped before the workers started", "stopped: ended by SIGTERM")


def test_a_failing_worker_ends_the_gang_with_its_exit_code(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    launch = make_launch(
        tmp_path,
        [
            sh("echo ready; exec sleep 30"),
            sh('sleep 0.2; echo "first line" >&2; echo "boom: bad thing  " >&2; echo >&2; exit 3'),
        ],
        grace_s=5.0,
    )
    started = time.monotonic()
    executor.launch(launch)
    ended = wait_ended(executor)

    assert time.monotonic() - started < 4.0  # rank 0's sleep 30 ended by SIGTERM, not grace
    assert (ended.exit_code, ended.signal, ended.stopped) == (3, None, False)
    assert ended.reason == "exit code 3 (rank 1)"
    assert ended.error_tail == "boom: bad thing"
    workers = json.loads((launch.attempt_dir / "result.json").read_text())["workers"]
    assert [(w["exit_code"], w["signal"]) for w in workers] == [(None, signal.SIGTERM), (3, None)]


def test_a_worker_killed_by_a_signal_fails_the_attempt(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    launch = make_launch(
        tmp_path,
        [sh("echo dying >&2; kill -USR1 $$; sleep 5"), sh("exec sleep 30")],
    )
    executor.launch(launch)
    ended = wait_ended(executor)
    assert (ended.exit_code, ended.signal, ended.stopped) == (None, signal.SIGUSR1, False)
    assert ended.reason == "killed by SIGUSR1 (rank 0)"
    assert ended.error_tail == "dying"


def test_a_worker_that_cannot_start_fails_with_a_clear_reason(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    missing = str(tmp_path / "no-such-program")
    launch = make_launch(tmp_path, [sh("exec sleep 30"), [missing, "--flag"]])
    executor.launch(launch)
    ended = wait_ended(executor)

    assert (ended.exit_code, ended.signal, ended.stopped) == (127, None, False)
    assert ended.reason.startswith("cannot start rank 1: [Errno 2] No such file or directory")
    assert missing in ended.reason
    assert ended.error_tail == f"corral: {ended.reason}"
    assert "Traceback" not in (launch.attempt_dir / "shim.log").read_text()


def test_a_missing_workdir_is_named_in_the_reason(executor: LocalExecutor, tmp_path: Path) -> None:
    launch = make_launch(tmp_path, [sh("echo hi")])
    launch.workdir = str(tmp_path / "gone")
    executor.launch(launch)
    ended = wait_ended(executor)
    assert ended.exit_code == 127
    assert ended.reason.startswith("cannot start rank 0: [Errno 2] No such file or directory")
    assert launch.workdir in ended.reason


def test_a_file_that_is_not_executable_exits_126(executor: LocalExecutor, tmp_path: Path) -> None:
    script = tmp_path / "script.sh"
    script.write_text("echo hi\n")
    script.chmod(stat.S_IRUSR | stat.S_IWUSR)
    executor.launch(make_launch(tmp_path, [[str(script)]]))
    ended = wait_ended(executor)
    assert ended.exit_code == 126
    assert ended.reason.startswith("cannot start rank 0: [Errno 13] Permission denied")


def test_launching_a_running_attempt_twice_is_refused(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    launch = make_launch(tmp_path, [sh("exec sleep 30")])
    executor.launch(launch)
    with pytest.raises(ValueError, match="attempt 1 of job 1 is running"):
        executor.launch(launch)
    executor.stop("1", 1)
    assert wait_ended(executor).stopped


def test_recover_finds_a_running_attempt_and_polls_its_end(
    make_executor: Callable[[], LocalExecutor], tmp_path: Path
) -> None:
    before_restart = make_executor()
    launch = make_launch(tmp_path, [sh("echo ready; sleep 0.6; echo bye >&2; exit 4")], job_id="7")
    before_restart.launch(launch)
    wait_for_text(launch.attempt_dir / "rank-0.stdout", "ready")
    before_restart.close()  # the server goes away; the attempt goes on
    assert before_restart.active() == set()

    after_restart = make_executor()
    assert after_restart.recover("7", 1, launch.attempt_dir) == "running"
    assert after_restart.active() == {("7", 1)}
    assert after_restart.poll() == []
    ended = wait_ended(after_restart)
    assert (ended.job_id, ended.attempt, ended.exit_code, ended.stopped) == ("7", 1, 4, False)
    assert ended.error_tail == "bye"
    assert after_restart.active() == set()

    # Once ended, recovering again gives the recorded result, from result.json.
    again = make_executor().recover("7", 1, launch.attempt_dir)
    assert again == ended


def test_a_recovered_attempt_can_be_stopped(
    make_executor: Callable[[], LocalExecutor], tmp_path: Path
) -> None:
    before_restart = make_executor()
    launch = make_launch(
        tmp_path, [sh('trap "exit 5" TERM; echo ready; while :; do sleep 0.05; done')]
    )
    before_restart.launch(launch)
    wait_for_text(launch.attempt_dir / "rank-0.stdout", "ready")
    before_restart.close()

    after_restart = make_executor()
    assert after_restart.recover("1", 1, launch.attempt_dir) == "running"
    after_restart.stop("1", 1)
    ended = wait_ended(after_restart)
    assert (ended.exit_code, ended.stopped) == (5, True)


def _kill_shim(attempt_dir: Path) -> dict[str, Any]:
    """SIGKILL an attempt's shim and return its workers.json once the shim is dead."""
    wait_for_text(attempt_dir / "workers.json", "pgid")
    shim = json.loads((attempt_dir / "shim.json").read_text())
    os.kill(shim["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 30.0
    while is_alive(shim["pid"], shim["start_time"]):
        assert time.monotonic() < deadline, "the shim survived SIGKILL"
        time.sleep(0.01)
    return json.loads((attempt_dir / "workers.json").read_text())


def _wait_dead(workers: list[dict[str, Any]]) -> None:
    deadline = time.monotonic() + 30.0
    while any(is_alive(w["pid"], w["start_time"]) for w in workers):
        assert time.monotonic() < deadline, "workers still alive"
        time.sleep(0.01)


def test_an_attempt_whose_shim_was_killed_is_lost(
    make_executor: Callable[[], LocalExecutor], tmp_path: Path
) -> None:
    before_restart = make_executor()
    launch = make_launch(tmp_path, [sh("echo ready; exec sleep 30")] * 2)
    before_restart.launch(launch)
    wait_for_text(launch.attempt_dir / "rank-1.stdout", "ready")
    before_restart.close()
    workers = _kill_shim(launch.attempt_dir)
    os.killpg(workers["pgid"], signal.SIGKILL)
    _wait_dead(workers["workers"])

    ended = make_executor().recover("1", 1, launch.attempt_dir)
    assert isinstance(ended, AttemptEnded)
    assert (ended.exit_code, ended.signal, ended.stopped) == (None, None, False)
    assert ended.reason == LOST_REASON


def test_a_lost_attempts_orphaned_workers_are_killed(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    launch = make_launch(tmp_path, [sh("echo ready; exec sleep 30")] * 2)
    executor.launch(launch)
    wait_for_text(launch.attempt_dir / "rank-0.stdout", "ready")
    wait_for_text(launch.attempt_dir / "rank-1.stdout", "ready")
    workers = _kill_shim(launch.attempt_dir)["workers"]
    # The workers live on, holding their GPUs.
    assert all(is_alive(w["pid"], w["start_time"]) for w in workers)

    ended = wait_ended(executor)
    assert ended.reason == f"{LOST_REASON}; killed 2 orphaned worker process(es)"
    assert ended.exit_code is None and not ended.stopped
    _wait_dead(workers)


def test_an_attempt_without_shim_json_never_started(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    attempt_dir = tmp_path / "jobs" / "3" / "attempt-1"
    assert executor.recover("3", 1, attempt_dir) == "never-started"
    attempt_dir.mkdir(parents=True)
    (attempt_dir / "launch.json").write_text("{}")
    assert executor.recover("3", 1, attempt_dir) == "never-started"
    assert executor.active() == set()


def test_the_shim_reports_a_bad_launch_file(tmp_path: Path) -> None:
    (tmp_path / "launch.json").write_text('{"workers": []')
    subprocess.run([PYTHON, "-m", "corral.exec.shim", str(tmp_path)], check=True, timeout=120)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["reason"].startswith("bad launch.json: ")
    assert (result["exit_code"], result["stopped"]) == (None, False)
    usage = subprocess.run(
        [PYTHON, "-m", "corral.exec.shim"], capture_output=True, text=True, timeout=120
    )
    (tmp_path / "result.json").unlink()
    (tmp_path / "launch.json").write_text(
        '{"workers": [{"rank": 0, "argv": []}], "stop_signal": 15, "grace_s": 1, "workdir": "/"}'
    )
    subprocess.run([PYTHON, "-m", "corral.exec.shim", str(tmp_path)], check=True, timeout=120)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["reason"] == "bad launch.json: a worker without argv"
    assert usage.returncode == 2
    assert usage.stderr.strip() == "usage: python -m corral.exec.shim ATTEMPT_DIR"


def test_worker_envs_split_the_gpus_in_rank_order(tmp_path: Path) -> None:
    envs = worker_envs("5", 2, [4, 5, 6, 7, 0, 1], 3, tmp_path, 29500, {"A": "b"})
    assert [env["CORRAL_LOCAL_GPUS"] for env in envs] == ["0,1", "2,3", "4,5"]
    assert {env["CUDA_VISIBLE_DEVICES"] for env in envs} == {"4,5,6,7,0,1"}
    assert [env["RANK"] for env in envs] == ["0", "1", "2"]
    assert all(env["A"] == "b" and env["MASTER_PORT"] == "29500" for env in envs)
    single = worker_envs("5", 1, [3], 1, tmp_path, 1234)
    assert (single[0]["CUDA_VISIBLE_DEVICES"], single[0]["CORRAL_LOCAL_GPUS"]) == ("3", "0")
    with pytest.raises(ValueError, match=r"workers: must divide gpus \(3 does not divide 4\)"):
        worker_envs("5", 1, [0, 1, 2, 3], 3, tmp_path, 1234)
    with pytest.raises(ValueError, match="workers: must be at least 1"):
        worker_envs("5", 1, [0], 0, tmp_path, 1234)


def test_plain_workers_get_the_torchrun_users_variables(tmp_path: Path) -> None:
    # Ranks 0 and 2 on node a (devices 1,3 and 0,2), rank 1 on node b: nodes in rank order.
    placement = [("a", [1, 3]), ("b", [5, 6]), ("a", [0, 2])]
    envs = placement_worker_envs("7", 1, placement, tmp_path, {"NNODES": "99"})
    assert [env["CUDA_VISIBLE_DEVICES"] for env in envs] == ["1,3,0,2", "5,6", "1,3,0,2"]
    assert [env["CORRAL_LOCAL_GPUS"] for env in envs] == ["0,1", "0,1", "2,3"]
    assert [env["LOCAL_RANK"] for env in envs] == ["0", "0", "1"]
    assert [env["NODE_RANK"] for env in envs] == ["0", "1", "0"]
    assert {env["NNODES"] for env in envs} == {"2"}  # corral's over the spec's
    assert {env["CORRAL_GPUS_PER_WORKER"] for env in envs} == {"2"}
    assert {env["WORLD_SIZE"] for env in envs} == {"3"}


def test_torchrun_workers_see_only_their_own_gpus(tmp_path: Path) -> None:
    # Each worker is one of torchrun's "nodes": NODE_RANK is its rank, NNODES the worker count,
    # and its processes' LOCAL_RANK 0..n-1 index its own devices.
    placement = [("a", [1, 3]), ("b", [5, 6]), ("a", [0, 2])]
    envs = placement_worker_envs(
        "7", 1, placement, tmp_path, {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, launcher="torchrun"
    )
    assert [env["CUDA_VISIBLE_DEVICES"] for env in envs] == ["1,3", "5,6", "0,2"]
    assert {env["CORRAL_LOCAL_GPUS"] for env in envs} == {"0,1"}
    assert [env["NODE_RANK"] for env in envs] == ["0", "1", "2"]
    assert {env["NNODES"] for env in envs} == {"3"}
    assert {env["CORRAL_GPUS_PER_WORKER"] for env in envs} == {"2"}
    share = placement_worker_envs("8", 1, [("a", [4])], tmp_path, launcher="torchrun")[0]
    assert (share["CUDA_VISIBLE_DEVICES"], share["CORRAL_GPUS_PER_WORKER"]) == ("4", "1")
    assert (share["NODE_RANK"], share["NNODES"]) == ("0", "1")
    with pytest.raises(ValueError, match=r"launcher: must be one of none, torchrun \(got 'mpi'\)"):
        placement_worker_envs("9", 1, [("a", [0])], tmp_path, launcher="mpi")


def test_the_torchrun_argv_runs_torchrun_with_the_workers_placement(tmp_path: Path) -> None:
    string = launch_argv("train.py --lr 0.1 --name 'a b'", "torchrun")
    listed = launch_argv(["train.py", "--lr", "0.1", "--name", "a b"], "torchrun")
    assert string == listed
    # The outer shell runs torchrun; each of torchrun's processes runs the process script ($1)
    # with the job's program after it.
    assert string[:2] == ["/bin/sh", "-c"] and string[3] == "torchrun"
    process = string[4]
    assert string[5:] == ["train.py", "--lr", "0.1", "--name", "a b"]
    assert launch_argv("-m pkg.train --x 1", "torchrun")[5:] == ["-m", "pkg.train", "--x", "1"]
    assert launch_argv(["--no_python", "./a.out"], "torchrun")[5:] == ["--no-python", "./a.out"]
    # Another of torchrun's own flags first: passed to torchrun as it is (no per-rank files).
    plain = launch_argv(["--standalone", "train.py"], "torchrun")
    assert plain[3:] == ["torchrun", "--standalone", "train.py"]
    assert launch_argv("echo $A", "none") == ["/bin/sh", "-c", "echo $A"]
    assert launch_argv(["python", "x.py"]) == ["python", "x.py"]
    with pytest.raises(ValueError, match="launcher: must be one of none, torchrun"):
        launch_argv("x", "deepspeed")
    # The shell fills in the flags from the worker's environment; a stand-in `torchrun` on the
    # PATH prints the argv it got, one argument a line.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "torchrun"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    fake.chmod(0o755)
    env = placement_worker_envs(
        "7",
        1,
        [("a", [0, 1]), ("a", [2, 3])],
        tmp_path,
        master_addr="10.0.0.1",
        master_port=29400,
        launcher="torchrun",
    )[1]
    env["PATH"] = f"{bin_dir}:/usr/bin:/bin"
    ran = subprocess.run(string, env=env, capture_output=True, text=True, check=True, timeout=60)
    assert ran.stdout.splitlines() == [
        "--nnodes=2",
        "--node_rank=1",
        "--nproc_per_node=2",
        "--rdzv_backend=static",
        "--master_addr=10.0.0.1",
        "--master_port=29400",
        "--max_restarts=0",
        "--no-python",
        "/bin/sh",
        "-c",
        process,
        "corral-process",
        "train.py",
        "--lr",
        "0.1",
        "--name",
        "a b",
    ]
    assert env["CORRAL_PROCESS_RANKS"] == "2,3"  # worker 1's two processes: RANKs 2 and 3


def test_each_torchrun_process_writes_its_own_files_on_torchruns_interpreter(
    tmp_path: Path,
) -> None:
    # What torchrun runs per process (launch_argv's element 4), started as torchrun starts it:
    # by a Python process (here this test's interpreter, as torchrun's would be), with the RANK
    # it gives and the directory the supervisor named.
    process = launch_argv(["x.py"], "torchrun")[4]
    script = tmp_path / "show.py"
    script.write_text(
        "import sys\n"
        "unbuffered = type(sys.stdout.buffer).__name__ == 'FileIO'\n"
        "print(sys.executable, int(unbuffered), *sys.argv[1:])\n"
        "print('to stderr', file=sys.stderr)\n"
    )
    parent = "import subprocess, sys; sys.exit(subprocess.run(sys.argv[1:]).returncode)"
    env = {"PATH": "/usr/bin:/bin", "RANK": "3", "CORRAL_RANK_LOGS": str(tmp_path)}
    for program in ([str(script), "a b"], ["-m", "show", "a b"]):
        ran = subprocess.run(
            [sys.executable, "-c", parent, "/bin/sh", "-c", process, "corral-process", *program],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert ran.returncode == 0 and ran.stdout == "", ran
        # The parent's interpreter (a virtualenv's path, not the binary it links to), with
        # -u as torchrun passes it; the output in RANK 3's files, not the parent's.
        assert (tmp_path / "rank-3.stdout").read_text() == f"{sys.executable} 1 a b\n"
        assert (tmp_path / "rank-3.stderr").read_text() == "to stderr\n"
        for stream in ("stdout", "stderr"):
            (tmp_path / f"rank-3.{stream}").unlink()
    # --no-python runs the program itself; without CORRAL_RANK_LOGS (Ray) nothing is redirected.
    del env["CORRAL_RANK_LOGS"]
    ran = subprocess.run(
        ["/bin/sh", "-c", process, "corral-process", "--no-python", "echo", "plain"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (ran.returncode, ran.stdout) == (0, "plain\n")


def test_a_share_gets_its_mps_limits_rounded_down() -> None:
    assert share_env(500, 16384) == {
        "CORRAL_GPU_SHARE": "0.5",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8192M",
    }
    assert share_env(333, 24576) == {
        "CORRAL_GPU_SHARE": "0.333",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "33",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8183M",  # 24576 x 0.333 = 8183.8
    }
    tiny = share_env(1)  # the GPU's memory not known: no memory limit
    assert tiny == {"CORRAL_GPU_SHARE": "0.001", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "1"}
    assert share_env(250, 81920, device=2)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "2=20480M"
    for whole in (0, 1000):
        with pytest.raises(ValueError, match="a share of a GPU is 1..999 milli-GPU"):
            share_env(whole)


def test_command_argv_and_free_port() -> None:
    assert command_argv("echo $HOME && ls") == ["/bin/sh", "-c", "echo $HOME && ls"]
    assert command_argv(["python", "train.py"]) == ["python", "train.py"]
    port = free_port()
    assert 1024 <= port <= 65535


def test_many_attempts_are_each_reported_once_and_polling_is_cheap(
    executor: LocalExecutor, tmp_path: Path
) -> None:
    for job in range(1, 7):
        script = f"echo ready; while [ ! -e {tmp_path}/go ]; do sleep 0.02; done; exit {job}"
        executor.launch(make_launch(tmp_path, [sh(script)], job_id=str(job)))
    for job in range(1, 7):
        wait_for_text(tmp_path / "jobs" / str(job) / "attempt-1" / "rank-0.stdout", "ready")
    started = time.perf_counter()
    for _ in range(100):
        assert executor.poll() == []
    # 100 polls over 6 running attempts: a few thousand syscalls, far below the 0.2 s period.
    assert time.perf_counter() - started < 0.5
    (tmp_path / "go").touch()
    ended: list[AttemptEnded] = []
    deadline = time.monotonic() + 60
    while len(ended) < 6 and time.monotonic() < deadline:
        ended += executor.poll()
        time.sleep(0.02)
    assert sorted((e.job_id, e.exit_code) for e in ended) == [(str(j), j) for j in range(1, 7)]
    assert executor.active() == set()


SERVER = """
import signal, sys, time
from pathlib import Path
from corral.exec.local import AttemptLaunch, LocalExecutor, WorkerLaunch
attempt_dir, workdir, script = sys.argv[1:]
LocalExecutor().launch(AttemptLaunch(
    "9", 1, [WorkerLaunch(0, ["/bin/sh", "-c", script], {})], workdir, signal.SIGTERM, 0.5,
    Path(attempt_dir),
))
print("launched", flush=True)
time.sleep(60)
"""


def test_attempts_survive_the_server_being_killed(executor: LocalExecutor, tmp_path: Path) -> None:
    attempt_dir = tmp_path / "jobs" / "9" / "attempt-1"
    go = tmp_path / "go"
    script = f"echo ready; while [ ! -e {go} ]; do sleep 0.02; done; echo finished"
    server = subprocess.Popen(
        [PYTHON, "-c", SERVER, str(attempt_dir), str(tmp_path), script],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None and server.stdout.readline() == "launched\n"
        wait_for_text(attempt_dir / "rank-0.stdout", "ready")
        server.kill()  # kill -9 the server
    finally:
        server.kill()
        server.wait()
    shim = json.loads((attempt_dir / "shim.json").read_text())
    # A hang-up or Ctrl-C aimed at the shim does not end the attempt either.
    os.kill(shim["pid"], signal.SIGHUP)
    os.kill(shim["pid"], signal.SIGINT)
    time.sleep(0.1)

    assert executor.recover("9", 1, attempt_dir) == "running"
    go.touch()
    ended = wait_ended(executor)
    assert (ended.exit_code, ended.stopped, ended.reason) == (0, False, "exit code 0")
    assert (attempt_dir / "rank-0.stdout").read_text() == "ready\nfinished\n"
