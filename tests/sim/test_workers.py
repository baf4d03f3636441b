"""`corral simulate --workers N`: the policies' runs side by side in worker processes give what
they give one by one in the main process; a failed or lost run is reported in one line and
stops the other workers."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest
from rich.console import Console

from corral.sim.runner import RunSettings, SimulationError, run_simulations
from corral.sim.workers import RunProgress, run_in_workers, worker_count

HEADER = "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"


def busy_trace(path: Path, jobs: int = 150) -> str:
    """Sizes 1 to 8 GPUs, arrivals every 90 s and lengths 10 min to 2 h on 4 x 8 GPUs: jobs
    wait and the preemptive policies preempt."""
    rows = [
        f"j{i},{(1, 2, 4, 8)[i % 4]},{i * 90},,,{600 + (i * 7919) % 7200},\n" for i in range(jobs)
    ]
    path.write_text(HEADER + "".join(rows))
    return f"tiresias:{path}"


def simulate(out: Path, trace: str, **changes: object) -> list[dict]:
    settings = RunSettings(trace=trace, nodes=4, gpus_per_node=8, spread_slowdown=False)
    for name, value in changes.items():
        setattr(settings, name, value)
    return run_simulations(settings, out=out, plot=False, console=Console(quiet=True))


@pytest.mark.parametrize("stream", [False, True])
def test_runs_in_workers_give_the_same_results_files_and_summary(tmp_path, stream):
    trace = busy_trace(tmp_path / "busy.csv")
    # gittins learns from a history file when streamed (a streamed run cannot read it first).
    history = tmp_path / "history.csv"
    history.write_text("duration\n" + "".join(f"{600 * g}\n" for g in range(1, 30)))
    changes = dict(
        policies=["fifo", "las", "gittins"],
        decisions=True,
        stream=stream,
        gittins_history=history,
        failure_rate=0.05,  # the runs' random streams: each run's own, wherever it runs
    )
    alone = simulate(tmp_path / "one", trace, workers=1, **changes)
    side_by_side = simulate(tmp_path / "three", trace, workers=3, **changes)
    assert [run["policy"] for run in side_by_side] == ["fifo", "las", "gittins"]
    assert sum(run["preemptions"] for run in alone) > 0  # the trace is busy enough to preempt
    for one, other in zip(alone, side_by_side, strict=True):
        one.pop("wall_s"), other.pop("wall_s")
        assert other == one
    names = sorted(path.name for path in (tmp_path / "one").iterdir())
    assert names == sorted(path.name for path in (tmp_path / "three").iterdir())
    assert "decisions-gittins-relax.jsonl" in names
    for name in names:
        written = (tmp_path / "three" / name).read_text()
        if name == "summary.json":
            continue  # compared above, without the wall times
        assert written == (tmp_path / "one" / name).read_text(), name
    assert json.loads((tmp_path / "three" / "summary.json").read_text())["runs"][2]["jobs"] == 150


def test_a_run_that_fails_in_a_worker_is_refused_in_one_line_as_in_the_main_process(tmp_path):
    # A streamed trace is read as the run goes: line 5's bad field is met by each run, in a
    # worker, after the main process has checked the settings and printed the first line.
    path = tmp_path / "bad.csv"
    path.write_text(HEADER + "a,1,0,,,5,\nb,1,1,,,5,\nc,1,2,,,5,\nd,two,3,,,5,\n")
    expected = f"{path}: line 5: num_gpu: must be a positive integer, got 'two'"
    for workers in (1, 2):
        out = tmp_path / f"out{workers}"
        with pytest.raises(SimulationError) as error:
            simulate(
                out, f"tiresias:{path}", policies=["fifo", "las"], stream=True, workers=workers
            )
        assert str(error.value) == expected
    assert multiprocessing.active_children() == []


def test_a_negative_number_of_workers_is_refused(tmp_path):
    with pytest.raises(SimulationError, match=r"^--workers: must not be negative$"):
        simulate(tmp_path, busy_trace(tmp_path / "t.csv", 2), workers=-1)


# -- run_in_workers, with runs of its own (module-level: a spawned worker imports them) --------


class Recorded(RunProgress):
    def __init__(self) -> None:
        self.said: list[object] = []

    def advance(self, done: int, total: int) -> None:
        self.said.append(done)

    def describe(self, text: str) -> None:
        self.said.append(text)


def setup_pid() -> int:
    return os.getpid()


def run_numbered(signals: Path, pid: int, number: int, progress: RunProgress) -> tuple[int, int]:
    """Run 1 ends before run 0, which waits for its file; each reports as it goes."""
    progress.describe(f"run {number}")
    if number == 0:
        deadline = time.monotonic() + 120
        while not (signals / "1").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    (signals / str(number)).touch()
    progress.advance(number * 10, 100)
    return number * number, pid


def run_or_die(pid: int, number: int, progress: RunProgress) -> int:
    if number == 1:
        os._exit(3)  # as a worker killed by the kernel would: no word, no result
    return number


def run_or_fail(pid: int, number: int, progress: RunProgress) -> int:
    if number == 0:
        time.sleep(3600)  # stopped by the main process when run 1 fails
    raise ValueError(f"run {number}: the trace is bad")


def run_and_say(pid: int, number: int, progress: RunProgress) -> int:
    return number


def setup_fails() -> int:
    raise OSError("trace.csv: no such file")


def shown(count: int) -> list[Recorded]:
    return [Recorded() for _ in range(count)]


def test_results_come_in_the_order_of_the_runs_with_their_progress(tmp_path):
    progress = shown(4)
    run = partial(run_numbered, tmp_path)
    results = run_in_workers(setup_pid, run, ["a", "b", "c", "d"], 2, progress)
    assert (tmp_path / "0").stat().st_mtime_ns >= (tmp_path / "1").stat().st_mtime_ns
    assert [square for square, _ in results] == [0, 1, 4, 9]
    # each worker set itself up once, in a process other than this one
    pids = {pid for _, pid in results}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2
    assert [recorded.said for recorded in progress] == [
        ["run 0", 0],
        ["run 1", 10],
        ["run 2", 20],
        ["run 3", 30],
    ]
    assert multiprocessing.active_children() == []


def test_a_worker_that_ends_without_its_result_is_named_in_one_line():
    with pytest.raises(ChildProcessError) as error:
        run_in_workers(setup_pid, run_or_die, ["fifo/relax", "las/relax"], 1, shown(2))
    assert str(error.value) == (
        "run las/relax: its worker process ended (exit code 3) before it gave its result"
    )
    assert multiprocessing.active_children() == []


def test_a_failed_run_is_raised_again_and_stops_the_other_workers():
    started = time.monotonic()
    with pytest.raises(ValueError, match=r"^run 1: the trace is bad$") as error:
        run_in_workers(setup_pid, run_or_fail, ["a", "b"], 2, shown(2))
    assert "run_or_fail" in str(error.value.__cause__)  # the worker's traceback
    assert time.monotonic() - started < 600  # run 0's hour-long sleep was not waited for
    assert multiprocessing.active_children() == []


def test_a_setup_that_fails_is_raised_again():
    with pytest.raises(OSError, match=r"^trace.csv: no such file$"):
        run_in_workers(setup_fails, run_and_say, ["a", "b", "c"], 2, shown(3))
    assert multiprocessing.active_children() == []


def test_the_worker_count_is_what_was_asked_but_never_more_than_the_runs():
    assert worker_count(3, 10) == 3
    assert worker_count(8, 2) == 2  # a worker with no run would only start Python
    assert worker_count(1, 10) == 1  # one by one, in the main process
    assert worker_count(0, 1000) == (os.cpu_count() or 1)  # 0: one per CPU
    assert worker_count(4, 0) == 1


def run_slow_last(number: int, pid: int, run: int, progress: RunProgress) -> int:
    """Run 1 lasts `number` tenths of a second; run 0 ends at once."""
    if run == 1:
        time.sleep(number / 10)
    return run


def test_results_read_after_every_worker_ended_are_all_taken():
    # One worker ends (run 0 done) while the other still works on run 1, whose result then comes
    # while the main process reads what the ended worker left, or just after; the worker of
    # run 1 then ends too. Its result counts: no run is lost (an earlier version said so).
    for tenths in range(4, 16):
        assert run_in_workers(
            setup_pid, partial(run_slow_last, tenths), ["a", "b"], 2, shown(2)
        ) == [
            0,
            1,
        ]


def run_forever(pids: Path, pid: int, number: int, progress: RunProgress) -> int:
    """Say which process runs it, then run for an hour."""
    (pids / f"{number}.tmp").write_text(str(os.getpid()))
    (pids / f"{number}.tmp").rename(pids / str(number))
    time.sleep(3600)
    return number


ORPHANING = """
import sys
from functools import partial
from pathlib import Path
from corral.sim.workers import RunProgress, run_in_workers
from tests.sim.test_workers import run_forever, setup_pid
run_in_workers(setup_pid, partial(run_forever, Path(sys.argv[1])), ["a", "b"], 2,
               [RunProgress(), RunProgress()])
"""


def alive(pid: int) -> bool:
    """The process exists and has not ended (a zombie has ended: nobody reaped it yet)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return "\nState:\tZ" not in status


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_workers_end_when_the_main_process_is_killed(tmp_path):
    root = Path(__file__).resolve().parents[2]
    main = subprocess.Popen([sys.executable, "-c", ORPHANING, str(tmp_path)], cwd=root)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while len(workers) < 2 and time.monotonic() < deadline and main.poll() is None:
            workers = [int(p.read_text()) for p in tmp_path.iterdir() if p.suffix != ".tmp"]
            time.sleep(0.05)
        assert len(workers) == 2, "the workers did not start their runs"
        main.kill()  # no chance to stop its workers
        main.wait()
        deadline = time.monotonic() + 60
        while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(pid) for pid in workers)
    finally:
        main.kill()
        main.wait()
        for pid in workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
