"""The writer's side of the progress protocol: `corral.progress.report`."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import corral.progress as progress
from corral.progress import ENV_VAR, MAX_LINE_BYTES, encode, rank_zero, report
from corral.progress.reader import ProgressTail, parse_line

ROOT = Path(__file__).resolve().parents[2]


def lines(path: Path) -> list[dict[str, object]]:
    data = path.read_bytes()
    assert data.endswith(b"\n")
    return [json.loads(line) for line in data.splitlines()]


def test_unset_or_empty_variable_is_a_no_op(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert report(1, loss=0.5) is False
    monkeypatch.setenv(ENV_VAR, "")
    assert report(1, loss=0.5) is False
    assert list(tmp_path.iterdir()) == []


def test_lines_are_appended(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    path = tmp_path / "progress.jsonl"
    monkeypatch.setenv(ENV_VAR, str(path))
    before = time.time()
    assert report(1, loss=0.5, samples=128) is True
    after = time.time()
    assert report(2.5, acc=0.9, phase="warmup", done=False, lr=None, tokens=10) is True
    assert report(3, time=12.0) is True
    assert report(4, total_steps=400) is True
    first, second, third, fourth = lines(path)
    assert first["step"] == 1 and isinstance(first["step"], int)
    assert first["loss"] == 0.5 and first["samples"] == 128
    assert isinstance(first["time"], float) and before <= first["time"] <= after
    assert second == {
        "step": 2.5,
        "time": second["time"],
        "acc": 0.9,
        "phase": "warmup",
        "done": False,
        "lr": None,
        "tokens": 10,
    }
    assert third == {"step": 3, "time": 12.0}
    assert fourth == {"step": 4, "time": fourth["time"], "total_steps": 400}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_numpy_scalars_are_numbers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    np = pytest.importorskip("numpy")
    path = tmp_path / "progress.jsonl"
    monkeypatch.setenv(ENV_VAR, str(path))
    assert report(np.int64(7), loss=np.float32(0.25), samples=np.int32(64), acc=np.float64(1.0))
    (line,) = lines(path)
    assert line["step"] == 7 and line["loss"] == 0.25 and line["samples"] == 64
    assert line["acc"] == 1.0


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: report(True), r"progress step: must be a finite number, got True"),
        (lambda: report(-1), r"progress step: must be >= 0, got -1"),
        (lambda: report(float("nan")), r"progress step: must be a finite number, got nan"),
        (lambda: report(float("inf")), r"progress step: must be a finite number, got inf"),
        (lambda: report(10**400), r"progress step: must be a finite number, got 1000"),
        (lambda: report("3"), r"progress step: must be a finite number, got '3'"),  # type: ignore[arg-type]
        (lambda: report(None), r"progress step: must be a finite number, got None"),  # type: ignore[arg-type]
        (lambda: report(1, loss=float("nan")), r"progress loss: must be a finite number, got nan"),
        (lambda: report(1, loss=False), r"progress loss: must be a finite number, got False"),
        (lambda: report(1, samples=-3), r"progress samples: must be >= 0, got -3"),
        (lambda: report(1, samples=float("-inf")), r"progress samples: must be a finite number"),
        (lambda: report(1, time=float("nan")), r"progress time: must be a finite number, got nan"),
        (lambda: report(1, total_steps=0), r"progress total_steps: must be > 0, got 0"),
        (lambda: report(1, total_steps=-5.0), r"progress total_steps: must be > 0, got -5.0"),
        (
            lambda: report(1, total_steps=float("inf")),
            r"progress total_steps: must be a finite number, got inf",
        ),
        (lambda: report(1, acc=float("inf")), r"progress acc: must be a finite number, got inf"),
        (lambda: report(1, acc=[1, 2]), r"progress acc: must be a JSON scalar .* got \[1, 2\]"),
        (lambda: report(1, acc={"a": 1}), r"progress acc: must be a JSON scalar"),
        (lambda: report(1, acc=b"x"), r"progress acc: must be a JSON scalar .* got b'x'"),
        (lambda: report(1, note="x" * 257), r"progress note: a string of at most 256 characters"),
        (lambda: report(1, **{"": 1}), r"progress metric name '': must be a non-empty string"),
        (lambda: report(1, **{"n" * 65: 1}), r"progress metric name 'nnnn.*\.\.\.: must be"),
        (
            lambda: report(1, **{f"metric{i}": "x" * 200 for i in range(30)}),
            r"progress report: \d+ bytes long, the limit is 4096",
        ),
    ],
)
def test_values_the_protocol_refuses(
    call: object, message: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    path = tmp_path / "progress.jsonl"
    monkeypatch.setenv(ENV_VAR, str(path))
    with pytest.raises(ValueError, match=message) as caught:
        call()  # type: ignore[operator]
    assert "\n" not in str(caught.value)
    assert not path.exists()
    # refused the same way outside corral
    monkeypatch.delenv(ENV_VAR)
    with pytest.raises(ValueError, match=message):
        call()  # type: ignore[operator]


def test_a_multiline_repr_stays_on_one_line():
    class Odd:
        def __repr__(self) -> str:
            return "first\nsecond" + "x" * 100

    with pytest.raises(ValueError) as caught:
        encode(Odd())  # type: ignore[arg-type]
    assert "\n" not in str(caught.value) and "first second" in str(caught.value)


def test_the_longest_line_is_read_back():
    metrics: dict[str, object] = {"note": "x" * 256}
    line = encode(1, metrics=metrics)
    while len(line) <= MAX_LINE_BYTES:
        longest = line
        metrics[f"m{len(metrics)}"] = "y" * 256
        try:
            line = encode(1, metrics=metrics)
        except ValueError:
            break
    assert MAX_LINE_BYTES - 300 < len(longest) <= MAX_LINE_BYTES
    assert parse_line(longest[:-1], now=0.0).step == 1.0


def test_the_file_is_kept_open_and_survives_removal(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    path = tmp_path / "progress.jsonl"
    monkeypatch.setenv(ENV_VAR, str(path))
    report(1)
    assert progress._open is not None
    fd = progress._open.fd
    report(2)
    assert progress._open.fd == fd  # kept open across calls
    assert [line["step"] for line in lines(path)] == [1, 2]

    path.unlink()
    assert report(3) is True
    assert [line["step"] for line in lines(path)] == [3]

    replacement = tmp_path / "new"
    replacement.write_bytes(b'{"step": 0}\n')
    os.replace(replacement, path)
    assert report(4) is True
    assert [line["step"] for line in lines(path)] == [0, 4]


def test_a_new_variable_value_opens_the_new_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    first, second = tmp_path / "attempt-1", tmp_path / "attempt-2"
    monkeypatch.setenv(ENV_VAR, str(first))
    report(1)
    monkeypatch.setenv(ENV_VAR, str(second))
    report(2)
    monkeypatch.setenv(ENV_VAR, str(first))
    report(3)
    assert [line["step"] for line in lines(first)] == [1, 3]
    assert [line["step"] for line in lines(second)] == [2]


def test_a_forked_child_with_its_own_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    parent_file, child_file = tmp_path / "parent", tmp_path / "child"
    monkeypatch.setenv(ENV_VAR, str(parent_file))
    report(1)
    pid = os.fork()
    if pid == 0:  # the child: inherits the open fd, reports where its variable says
        try:
            report(2)
            os.environ[ENV_VAR] = str(child_file)
            report(3)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    report(4)
    assert [line["step"] for line in lines(parent_file)] == [1, 2, 4]
    assert [line["step"] for line in lines(child_file)] == [3]


def test_a_write_failure_warns_and_returns_false(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "no-such-dir" / "progress.jsonl"))
    with pytest.warns(RuntimeWarning, match=r"corral.progress: could not write to .*no-such-dir"):
        assert report(1) is False


def test_rank_zero(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("RANK", raising=False)
    assert rank_zero()
    for value, expected in [("", True), ("0", True), (" 0 ", True), ("1", False), ("x", False)]:
        monkeypatch.setenv("RANK", value)
        assert rank_zero() is expected, value


def test_threads_write_whole_lines(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    path = tmp_path / "progress.jsonl"
    monkeypatch.setenv(ENV_VAR, str(path))
    per_thread, pad = 300, "p" * 250

    def write(writer: int) -> None:
        for step in range(per_thread):
            report(step, writer=writer, a=pad, b=pad, c=pad)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    _check_whole_lines(path, writers=4, per_writer=per_thread)


WRITER = """
import sys
from corral.progress import report
writer, count = int(sys.argv[1]), int(sys.argv[2])
pad = "w" * 250
for step in range(count):
    assert report(step, loss=1.0 / (step + 1), samples=step * 32, writer=writer,
                  a=pad, b=pad, c=pad, d=pad, e=pad, f=pad, g=pad, h=pad, i=pad, j=pad)
"""


def test_concurrent_processes_write_whole_lines(tmp_path: Path):
    """Several processes append to one file (as torchrun's workers sharing a worker's variable
    would): every line is whole (each ~2.8 KB, one write), and none is lost."""
    path = tmp_path / "progress.jsonl"
    env = {**os.environ, ENV_VAR: str(path), "PYTHONPATH": str(ROOT)}
    writers, per_writer = 4, 400
    processes = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(w), str(per_writer)], env=env, cwd=ROOT)
        for w in range(writers)
    ]
    for process in processes:
        assert process.wait(timeout=120) == 0
    _check_whole_lines(path, writers=writers, per_writer=per_writer)
    tail = ProgressTail(path)
    reports = []
    while tail.offset < path.stat().st_size:
        reports.extend(tail.read(now=0.0))
    assert len(reports) == writers * per_writer and tail.malformed == 0


def _check_whole_lines(path: Path, *, writers: int, per_writer: int) -> None:
    data = path.read_bytes()
    assert data.endswith(b"\n")
    steps: dict[int, list[int]] = {w: [] for w in range(writers)}
    raw = data.split(b"\n")[:-1]
    assert len(raw) == writers * per_writer
    for line in raw:
        fields = json.loads(line)  # a mixed line would not parse
        steps[fields["writer"]].append(fields["step"])
    assert all(steps[w] == list(range(per_writer)) for w in range(writers))


FORBIDDEN = (
    "torch",
    "numpy",
    "pydantic",
    "sqlalchemy",
    "yaml",
    "httpx",
    "lightning",
    "transformers",
)


def test_importing_corral_progress_is_light():
    code = "import sys, json, corral.progress; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
    )
    modules = json.loads(result.stdout)
    assert [m for m in modules if m.startswith("corral")] == ["corral", "corral.progress"]
    heavy = [m for m in modules if m.split(".")[0].lower() in FORBIDDEN]
    assert heavy == []
    # -X importtime lists every module the import loaded, the interpreter's own included
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines()[1:]}
    assert {"corral", "corral.progress"} <= imported
    assert not any(name.split(".")[0].lower() in FORBIDDEN for name in imported)
