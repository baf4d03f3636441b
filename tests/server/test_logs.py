"""Reading capped logs (a hole where the oldest part was), tails of huge sparse files, files a job
may have swapped for a link or a FIFO, and offsets past any file: corral.server.logread alone,
then through the API, the client and `corral logs`."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from corral.cli.main import app
from corral.client import Client
from corral.exec import logcap
from corral.server.boot import RunningServer
from corral.server.logread import UnreadableLog, dropped_marker, read_log, restart_marker
from tests.server.helpers import admin_token, api, kill_jobs_of, start_server, wait_for

LINE = 100  # bytes per line of the test logs: "line NNNNN ...\n"


def numbered(count: int, first: int = 0) -> bytes:
    return b"".join(
        f"line {i:05d} ".encode().ljust(LINE - 1, b".") + b"\n" for i in range(first, first + count)
    )


def capped_log(path: Path, lines: int = 200, cap: int = 8192) -> tuple[bytes, int]:
    """A log of `lines` lines whose supervisor capped it to `cap` bytes: (the whole text as
    written, the offset of the first byte kept)."""
    text = numbered(lines)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    try:
        os.write(fd, text)
        dropped = logcap.cap_file(fd, cap)
        start = logcap.data_start(fd)
    finally:
        os.close(fd)
    assert dropped == start > 0, "this filesystem cannot punch holes"
    assert path.stat().st_size == len(text)  # offsets stay valid
    return text, start


def sparse_log(path: Path, size: int = 2 << 30, lines: int = 20) -> bytes:
    """A 2 GiB file that is a hole but for `lines` lines at its end."""
    tail = numbered(lines)
    with path.open("wb") as file:
        file.truncate(size - len(tail))
        file.seek(size - len(tail))
        file.write(tail)
    return tail


# -- logread --------------------------------------------------------------------------------------


def test_a_capped_log_reads_as_a_marker_and_the_kept_part(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.stdout"
    text, start = capped_log(path)
    read = read_log(path, 0, 1 << 20)
    assert read.text == dropped_marker(start) + text[start:]
    assert (
        dropped_marker(start)
        == f"[corral: {start} earlier bytes of this log were dropped (log cap)]\n".encode()
    )
    assert (read.next_offset, read.data_bytes) == (len(text), len(text) - start)
    # from inside the hole: the marker counts from there; from the kept part: no marker
    assert read_log(path, 100, 1 << 20).text == dropped_marker(start - 100) + text[start:]
    assert read_log(path, start + 5, 1 << 20).text == text[start + 5 :]
    assert read_log(path, len(text), 1 << 20).text == b""
    # in pieces, as a follower reads: the offsets are the file's
    piece = read_log(path, 0, 1000)
    assert piece.next_offset == start + 1000 and piece.data_bytes == 1000


def test_a_tail_of_a_capped_log(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.stdout"
    text, start = capped_log(path)
    last3 = read_log(path, 0, 1 << 20, tail=3)
    assert last3.text == numbered(3, first=197) and last3.next_offset == len(text)
    assert read_log(path, 0, 1 << 20, tail=0).text == b""
    everything = read_log(path, 0, 1 << 20, tail=1000)  # more lines than were kept
    assert everything.text == dropped_marker(start) + text[start:]


def test_a_tail_of_a_2gb_sparse_file_reads_a_few_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "rank-0.stdout"
    tail = sparse_log(path)
    read_bytes: list[int] = []
    pread = os.pread

    def counting_pread(fd: int, size: int, offset: int) -> bytes:
        data = pread(fd, size, offset)
        read_bytes.append(len(data))
        return data

    monkeypatch.setattr(os, "pread", counting_pread)
    read = read_log(path, 0, 1 << 20, tail=5)
    monkeypatch.undo()
    assert read.text == tail[-5 * LINE :] and read.next_offset == 2 << 30
    assert sum(read_bytes) < 1 << 20, sum(read_bytes)  # a few blocks read, not 2 GB
    from_zero = read_log(path, 0, 1 << 20)  # the hole is skipped, not read as 2 GB of NULs
    hole = ((2 << 30) - len(tail)) // logcap.BLOCK * logcap.BLOCK  # data starts with its block
    assert from_zero.text == dropped_marker(hole) + tail.rjust((2 << 30) - hole, b"\0")


def test_an_offset_past_the_end_reads_again_from_the_start(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.stdout"
    path.write_bytes(b"after a truncation\n")
    for offset in (20, 2**44, 2**62):
        read = read_log(path, offset, 1 << 20)
        assert read.text == restart_marker(offset) + b"after a truncation\n"
        assert read.next_offset == 19


def test_what_is_not_a_regular_file_is_not_read(tmp_path: Path) -> None:
    secret = tmp_path / "admin.token"
    secret.write_text("the admin's secret\n")
    link = tmp_path / "rank-0.stdout"
    link.symlink_to(secret)
    with pytest.raises(UnreadableLog, match=r"^rank-0.stdout is a symbolic link: not followed$"):
        read_log(link, 0, 1 << 20)
    fifo = tmp_path / "rank-1.stdout"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer: it must not
    with pytest.raises(UnreadableLog, match=r"^rank-1.stdout is not a regular file: not read$"):
        read_log(fifo, 0, 1 << 20, tail=3)
    (tmp_path / "rank-2.stdout").mkdir()
    with pytest.raises(UnreadableLog, match="not a regular file"):
        read_log(tmp_path / "rank-2.stdout", 0, 1 << 20)
    assert read_log(tmp_path / "rank-3.stdout", 7, 1 << 20).text == b""  # not written yet
    assert read_log(tmp_path / ("x" * 300), 0, 1 << 20).text == b""


# -- through the API ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    data_dir = tmp_path_factory.mktemp("corral-logs")
    running = start_server(data_dir, gpus=1)
    try:
        yield running
    finally:
        running.stop()
        kill_jobs_of(data_dir)


@pytest.fixture(scope="module")
def admin(server: RunningServer) -> Iterator[httpx.Client]:
    with api(server.url, admin_token(server.manager.data_dir)) as client:
        yield client


@pytest.fixture
def finished_job(server: RunningServer, admin: httpx.Client) -> tuple[str, Path]:
    """A job that ran and ended; its rank 0 stdout is the test's to rewrite."""
    spec = {"name": "done", "gpus": 1, "command": [sys.executable, "-c", "print('hello')"]}
    response = admin.post("/api/v1/jobs", json=spec)
    assert response.status_code == 201, response.text
    job_id = str(response.json()["id"])
    assert wait_for(admin, job_id)["status"] == "SUCCEEDED"
    return job_id, server.manager.attempt_dir(job_id, 1) / "rank-0.stdout"


def logs(client: httpx.Client, job_id: str, **params: object) -> httpx.Response:
    return client.get(f"/api/v1/jobs/{job_id}/logs", params=params)


def test_the_api_reads_a_capped_log_with_its_marker(
    admin: httpx.Client, finished_job: tuple[str, Path]
) -> None:
    job_id, path = finished_job
    text, start = capped_log(path)
    whole = logs(admin, job_id)
    assert whole.status_code == 200
    assert whole.content == dropped_marker(start) + text[start:]
    assert whole.headers["X-Corral-Offset"] == str(len(text))
    assert whole.headers["X-Corral-Finished"] == "true"
    last = logs(admin, job_id, tail=2)
    assert last.content == numbered(2, first=198)
    assert last.headers["X-Corral-Offset"] == str(len(text))
    after = logs(admin, job_id, offset=len(text))
    assert (after.status_code, after.content) == (200, b"")


def test_the_api_tails_a_2gb_sparse_log_quickly(
    admin: httpx.Client, finished_job: tuple[str, Path]
) -> None:
    job_id, path = finished_job
    tail = sparse_log(path)
    started = time.perf_counter()
    response = logs(admin, job_id, tail=5)
    elapsed = time.perf_counter() - started
    assert response.status_code == 200 and response.content == tail[-5 * LINE :]
    assert response.headers["X-Corral-Offset"] == str(2 << 30)
    # About 5 ms here; the bound only catches a read of the whole 2 GB (the test above counts
    # the bytes read), and holds on a loaded machine.
    assert elapsed < 30.0, elapsed


def test_the_api_does_not_follow_a_symlinked_log(
    admin: httpx.Client, finished_job: tuple[str, Path], server: RunningServer
) -> None:
    job_id, path = finished_job
    path.unlink()
    path.symlink_to(server.manager.data_dir / "admin.token")  # what a job's account could do
    for params in ({}, {"tail": 1}):
        response = logs(admin, job_id, **params)
        assert response.status_code == 409
        assert response.json() == {
            "detail": f"job {job_id} attempt 1: rank-0.stdout is a symbolic link: not followed"
        }
        assert admin_token(server.manager.data_dir) not in response.text
    path.unlink()
    os.mkfifo(path)
    response = logs(admin, job_id)
    assert response.status_code == 409 and "not a regular file" in response.json()["detail"]


def test_offsets_past_any_file_and_bad_parameters(
    admin: httpx.Client, finished_job: tuple[str, Path]
) -> None:
    """2**44 answered 500: ext4 files end before 2**44 bytes and lseek refused the offset.
    Now an offset past the end of the log reads it again from the start (the cap truncates
    on filesystems without holes, and a follower's offset is then past the end), and offsets
    past 2**62 are refused."""
    job_id, _ = finished_job
    for offset in (2**44, 2**62):
        response = logs(admin, job_id, offset=offset)
        assert response.status_code == 200, response.text
        assert response.content == restart_marker(offset) + b"hello\n"
        assert response.headers["X-Corral-Offset"] == "6"
    for params in ({"offset": 2**62 + 1}, {"offset": -1}, {"tail": -1}, {"rank": 10**30}):
        response = logs(admin, job_id, **params)
        assert response.status_code == 422, (params, response.text)
    both = logs(admin, job_id, tail=3, offset=5)
    assert (both.status_code, both.json()) == (
        422,
        {"detail": "tail: give either tail or offset, not both"},
    )
    assert logs(admin, job_id, rank=999_999).content == b""  # no such worker: nothing yet


def test_client_and_cli_tail(
    server: RunningServer, finished_job: tuple[str, Path], tmp_path: Path
) -> None:
    job_id, path = finished_job
    text, start = capped_log(path)
    token = admin_token(server.manager.data_dir)
    with Client(server.url, token) as client:
        assert client.logs(job_id, tail=1) == (numbered(1, first=199).decode(), len(text), True)
        followed = "".join(client.follow_logs(job_id, tail=2))
        assert followed == numbered(2, first=198).decode()
    env = {"CORRAL_URL": server.url, "CORRAL_TOKEN": token}
    for args in (["--tail", "3"], ["-n", "3"], ["-f", "--tail", "3"]):
        result = CliRunner().invoke(app, ["logs", job_id, *args], env=env)
        assert result.exit_code == 0, result.output
        assert result.stdout == numbered(3, first=197).decode()
    everything = CliRunner().invoke(app, ["logs", job_id], env=env)
    assert everything.stdout == (dropped_marker(start) + text[start:]).decode()
    # more than one call's worth (1 MiB): the CLI reads on from the tail's offset
    big = numbered(15_000)
    path.write_bytes(big)
    result = CliRunner().invoke(app, ["logs", job_id, "--tail", "12000"], env=env)
    assert result.stdout == numbered(12_000, first=3000).decode()
    bad = CliRunner().invoke(app, ["logs", job_id, "--tail", "-1"], env=env)
    assert bad.exit_code == 2
