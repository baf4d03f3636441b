"""The manager's side of the progress protocol: `corral.progress.reader.ProgressTail`."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from corral.progress import ENV_VAR
from corral.progress.reader import ProgressTail, Report

NOW = 1000.0


def append(path: Path, data: bytes | str) -> None:
    with open(path, "ab") as file:
        file.write(data.encode() if isinstance(data, str) else data)


def test_a_missing_file_reads_nothing(tmp_path: Path):
    tail = ProgressTail(tmp_path / "progress.jsonl")
    assert tail.read(NOW) == []
    assert tail.malformed == 0 and tail.last_error == ""


def test_reports_are_read_incrementally(tmp_path: Path):
    path = tmp_path / "progress.jsonl"
    tail = ProgressTail(path)
    append(path, '{"step": 1, "time": 5.5, "loss": 2.0, "samples": 32}\n{"step": 2}\n')
    assert tail.read(NOW) == [
        Report(time=5.5, step=1.0, loss=2.0, samples=32.0),
        Report(time=NOW, step=2.0),
    ]
    assert tail.read(NOW) == []
    append(path, '{"step": 3, "loss": 1.5, "acc": 0.5, "note": "extra metrics are ignored"}\n')
    assert tail.read(NOW + 1) == [Report(time=NOW + 1, step=3.0, loss=1.5)]
    assert tail.read(NOW) == []
    assert tail.malformed == 0 and tail.last_error == ""


def test_the_runs_total_steps_are_read(tmp_path: Path):
    path = tmp_path / "progress.jsonl"
    append(path, '{"step": 1, "total_steps": 500}\n{"step": 2, "total_steps": null}\n')
    assert ProgressTail(path).read(NOW) == [
        Report(time=NOW, step=1.0, total_steps=500.0),
        Report(time=NOW, step=2.0),
    ]


def test_steps_going_backwards_are_reports(tmp_path: Path):
    path = tmp_path / "progress.jsonl"
    append(path, '{"step": 100}\n{"step": 40}\n{"step": 41.5}\n')
    assert [r.step for r in ProgressTail(path).read(NOW)] == [100.0, 40.0, 41.5]


def test_a_partial_last_line_waits_for_its_end(tmp_path: Path):
    path = tmp_path / "progress.jsonl"
    tail = ProgressTail(path)
    append(path, '{"step": 1}\n{"ste')
    assert tail.read(NOW) == [Report(NOW, 1.0)]
    append(path, 'p": 2, "lo')
    assert tail.read(NOW) == []
    append(path, 'ss": 0.5}\n')
    assert tail.read(NOW) == [Report(NOW, 2.0, loss=0.5)]
    assert tail.malformed == 0


def test_blank_lines_and_crlf_are_fine(tmp_path: Path):
    path = tmp_path / "progress.jsonl"
    append(path, '\n  \n{"step": 1}\r\n{"step": 2}\n')
    tail = ProgressTail(path)
    assert [r.step for r in tail.read(NOW)] == [1.0, 2.0]
    assert tail.malformed == 0


@pytest.mark.parametrize(
    ("line", "error"),
    [
        (b"not json", "not JSON"),
        (b'{"step": 1', "not JSON"),
        (b"[1, 2]", "not a JSON object but an array"),
        (b"3", "not a JSON object but a number"),
        (b'"step"', "not a JSON object but a string"),
        (b"null", "not a JSON object but null"),
        (b'{"loss": 1.0}', 'no "step"'),
        (b'{"step": null}', '"step" is null'),
        (b'{"step": true}', '"step" is a bool, not a number'),
        (b'{"step": "3"}', '"step" is a string, not a number'),
        (b'{"step": [3]}', '"step" is an array, not a number'),
        (b'{"step": -1}', '"step" is negative'),
        (b'{"step": NaN}', "NaN is not JSON"),
        (b'{"step": Infinity}', "Infinity is not JSON"),
        (b'{"step": -Infinity}', "-Infinity is not JSON"),
        (b'{"step": 1e999}', '"step" is not finite'),
        (b'{"step": 1' + b"0" * 400 + b"}", '"step" is not finite'),
        (b'{"step": 1, "loss": NaN}', "NaN is not JSON"),
        (b'{"step": 1, "loss": 1e400}', '"loss" is not finite'),
        (b'{"step": 1, "loss": "low"}', '"loss" is a string, not a number'),
        (b'{"step": 1, "samples": -5}', '"samples" is negative'),
        (b'{"step": 1, "samples": false}', '"samples" is a bool, not a number'),
        (b'{"step": 1, "time": "now"}', '"time" is a string, not a number'),
        (b'{"step": 1, "total_steps": 0}', '"total_steps" is not positive'),
        (b'{"step": 1, "total_steps": -10}', '"total_steps" is not positive'),
        (b'{"step": 1, "total_steps": "100"}', '"total_steps" is a string, not a number'),
        (b'{"step": 1, "note": "\xff\xfe"}', "not UTF-8"),
        (b"\xff\xfe\x00", "not UTF-8"),
        (b"[" * 1500 + b"]" * 1500, "not JSON"),  # too deep for the parser
    ],
)
def test_malformed_lines_are_counted_and_skipped(line: bytes, error: str, tmp_path: Path):
    path = tmp_path / "progress.jsonl"
    append(path, b'{"step": 1}\n' + line + b'\n{"step": 2}\n')
    tail = ProgressTail(path)
    assert [r.step for r in tail.read(NOW)] == [1.0, 2.0]
    assert tail.malformed == 1
    assert tail.last_error == f"{path}: line 2: {error}"


def test_malformed_lines_are_counted_over_calls(tmp_path: Path):
    path = tmp_path / "progress.jsonl"
    tail = ProgressTail(path)
    append(path, 'oops\n{"step": 1}\n')
    assert len(tail.read(NOW)) == 1
    append(path, '{"step": true}\n{"step": 2}\n[]\n')
    assert len(tail.read(NOW)) == 1
    assert tail.malformed == 3
    assert tail.last_error.endswith("line 5: not a JSON object but an array")


def test_a_long_line_is_skipped_whole_across_calls(tmp_path: Path):
    path = tmp_path / "progress.jsonl"
    tail = ProgressTail(path, max_line_bytes=64)
    append(path, '{"step": 1}\n{"step": 9, "note": "' + "a" * 30)
    assert tail.read(NOW) == [Report(NOW, 1.0)]  # 50 bytes: kept, it may yet end in time
    append(path, "a" * 30)
    assert tail.read(NOW) == []  # past 64 bytes: dropped, and the rest of it will be
    assert tail._partial == b""
    append(path, "a" * 1000)
    assert tail.read(NOW) == []
    append(path, 'a"}\n{"step": 2}\n')
    assert tail.read(NOW) == [Report(NOW, 2.0)]
    assert tail.malformed == 1
    assert tail.last_error == f"{path}: line 2: longer than 64 bytes"


def test_a_long_line_within_one_call(tmp_path: Path):
    path = tmp_path / "progress.jsonl"
    exact = '{"step": 3, "note": "' + "b" * 41 + '"}'
    assert len(exact) == 64
    append(path, '{"step": 1, "note": "' + "a" * 100 + '"}\n{"step": 2}\n' + exact + "\n")
    tail = ProgressTail(path, max_line_bytes=64)
    assert [r.step for r in tail.read(NOW)] == [2.0, 3.0]  # 64 bytes is not too long
    assert tail.malformed == 1 and "line 1: longer than 64 bytes" in tail.last_error


def test_a_line_spanning_small_reads(tmp_path: Path):
    path = tmp_path / "progress.jsonl"
    append(path, '{"step": 1, "loss": 0.25}\n{"step": 2}\n')
    tail = ProgressTail(path, max_read_bytes=7)
    reports = []
    for _ in range(6):
        reports.extend(tail.read(NOW))
    assert reports == [Report(NOW, 1.0, loss=0.25), Report(NOW, 2.0)]


def test_reads_are_bounded_on_a_large_file(tmp_path: Path):
    path = tmp_path / "progress.jsonl"
    line = b'{"step": %d, "loss": 0.5, "samples": 1024, "note": "' + b"x" * 40 + b'"}\n'
    count = 5 * 1024 * 1024 // len(line % 0) + 1
    append(path, b"".join(line % i for i in range(count)))
    size = path.stat().st_size
    assert size > 5 * 1024 * 1024
    tail = ProgressTail(path)  # 1 MiB per call
    steps: list[float] = []
    calls = 0
    while tail.offset < size:
        before = tail.offset
        steps.extend(r.step for r in tail.read(NOW))
        assert tail.offset - before <= 1 << 20
        calls += 1
    assert calls >= 5
    assert steps == [float(i) for i in range(count)]
    assert tail.read(NOW) == [] and tail.malformed == 0


def test_a_hostile_line_without_end_is_read_in_bounded_steps(tmp_path: Path):
    path = tmp_path / "progress.jsonl"
    append(path, b"x" * (3 * 1024 * 1024))
    tail = ProgressTail(path)
    for _ in range(3):
        assert tail.read(NOW) == []
        assert len(tail._partial) <= tail.max_line_bytes
    append(path, b'\n{"step": 1}\n')
    assert tail.read(NOW) == [Report(NOW, 1.0)]
    assert tail.malformed == 1 and "line 1: longer than 4096 bytes" in tail.last_error


def test_a_truncated_file_is_read_again_from_its_start(tmp_path: Path):
    path = tmp_path / "progress.jsonl"
    append(path, '{"step": 1}\n{"step": 2}\n{"step": 3}\n{"ste')
    tail = ProgressTail(path)
    assert len(tail.read(NOW)) == 3
    path.write_text('{"step": 7}\n')  # truncated, then a new start
    assert tail.read(NOW) == [Report(NOW, 7.0)]
    append(path, '{"step": 8}\n')
    assert tail.read(NOW) == [Report(NOW, 8.0)]


def test_a_replaced_file_is_read_again_from_its_start(tmp_path: Path):
    path = tmp_path / "progress.jsonl"
    append(path, '{"step": 1}\n')
    tail = ProgressTail(path)
    assert len(tail.read(NOW)) == 1
    replacement = tmp_path / "new"
    append(replacement, "".join(f'{{"step": {i}}}\n' for i in range(10, 15)))
    os.replace(replacement, path)  # another inode, larger than what was read
    assert [r.step for r in tail.read(NOW)] == [10.0, 11.0, 12.0, 13.0, 14.0]
    path.unlink()
    assert tail.read(NOW) == []
    append(path, "oops\n")
    assert tail.read(NOW) == [] and tail.last_error.endswith("line 1: not JSON")


def test_a_symlink_is_not_followed(tmp_path: Path):
    target = tmp_path / "elsewhere"
    append(target, '{"step": 1}\n')
    path = tmp_path / "progress.jsonl"
    path.symlink_to(target)
    tail = ProgressTail(path)
    assert tail.read(NOW) == []
    assert tail.last_error == f"{path}: a symlink, not followed"
    path.unlink()
    path.symlink_to(tmp_path / "dangling")
    assert tail.read(NOW) == [] and "symlink" in tail.last_error
    path.unlink()
    append(path, '{"step": 2}\n')
    assert tail.read(NOW) == [Report(NOW, 2.0)]


def test_a_fifo_is_refused_without_blocking(tmp_path: Path):
    path = tmp_path / "progress.jsonl"
    os.mkfifo(path)
    tail = ProgressTail(path)
    result: list[list[Report]] = []
    reader = threading.Thread(target=lambda: result.append(tail.read(NOW)), daemon=True)
    reader.start()
    reader.join(timeout=30)  # an open that blocked on the FIFO would never return
    assert not reader.is_alive(), "read blocked on a FIFO"
    assert result == [[]]
    assert tail.last_error == f"{path}: not a regular file, not read"


def test_a_directory_is_refused(tmp_path: Path):
    path = tmp_path / "progress.jsonl"
    path.mkdir()
    tail = ProgressTail(path)
    assert tail.read(NOW) == [] and "not a regular file" in tail.last_error


def test_an_unreadable_file_says_why(tmp_path: Path):
    if os.geteuid() == 0:
        pytest.skip("root reads any file")
    path = tmp_path / "progress.jsonl"
    append(path, '{"step": 1}\n')
    path.chmod(0)
    tail = ProgressTail(path)
    assert tail.read(NOW) == [] and "Permission denied" in tail.last_error


def test_limits_must_be_positive(tmp_path: Path):
    with pytest.raises(ValueError, match="must be positive"):
        ProgressTail(tmp_path / "p", max_line_bytes=0)
    with pytest.raises(ValueError, match="must be positive"):
        ProgressTail(tmp_path / "p", max_read_bytes=-1)


def test_a_shell_job_speaks_the_protocol(tmp_path: Path):
    path = tmp_path / "progress.jsonl"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), ENV_VAR: str(path)}
    script = (
        'echo "{\\"step\\": 3}" >> "$CORRAL_PROGRESS_FILE"; '
        'printf \'{"step": %d, "loss": %s, "time": %s}\\n\' 4 0.75 12.5 >> "$CORRAL_PROGRESS_FILE"'
    )
    subprocess.run(["/bin/sh", "-c", script], env=env, check=True, timeout=60)
    tail = ProgressTail(path)
    assert tail.read(NOW) == [Report(NOW, 3.0), Report(12.5, 4.0, loss=0.75)]
    assert tail.malformed == 0


def test_what_report_writes_the_tail_reads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    from corral.progress import report

    path = tmp_path / "progress.jsonl"
    monkeypatch.setenv(ENV_VAR, str(path))
    report(10, loss=0.5, samples=320, time=99.0, lr=1e-3, phase="train")
    report(11)
    reports = ProgressTail(path).read(NOW)
    assert reports[0] == Report(time=99.0, step=10.0, loss=0.5, samples=320.0)
    assert reports[1].step == 11.0 and reports[1].time != NOW
