"""Jobs whose processes leave their process group, and how a test finds what is left of them."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest

from corral.exec import contain

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
HAS_TORCH = importlib.util.find_spec("torch") is not None and Path(TORCHRUN).exists()
#: Every process of a test's job carries MARK=<a value of the test's own> in its environment.
MARK = "CORRAL_TEST_MARK"
MECHANISMS = ("cgroup2", "cgroup1", "subreaper")
ESCAPES = ("setsid", "double-fork", "torchrun")

#: Writes its pid to $READY/<its argument>, then sleeps where its starter put it.
ESCAPEE = 'echo $$ > "$READY/$1.tmp" && mv "$READY/$1.tmp" "$READY/$1"\nexec sleep 600\n'
#: torchrun's workers (started with start_new_session=True) meet, all_reduce, say so, and sleep.
TINY_TORCH = """\
import os, pathlib, sys, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
tensor = torch.ones(1)
dist.all_reduce(tensor)
ready = pathlib.Path(os.environ["READY"])
(ready / f"rank-{dist.get_rank()}.tmp").write_text(str(os.getpid()))
(ready / f"rank-{dist.get_rank()}.tmp").rename(ready / f"rank-{dist.get_rank()}")
time.sleep(600)
"""


def mechanism_or_skip(mechanism: str) -> str:
    why = contain.unavailable(mechanism)
    if why is not None:
        pytest.skip(f"{mechanism}: {why}")
    return mechanism


def escape(kind: str, scripts: Path) -> tuple[str, list[str]]:
    """A shell line that starts a process escaping the worker's process group or parentage,
    and the names of the files in $READY that say it runs."""
    scripts.mkdir(exist_ok=True)
    escapee = scripts / "escapee.sh"
    escapee.write_text(ESCAPEE)
    if kind == "setsid":
        return f"setsid sh {escapee} setsid &", ["setsid"]
    if kind == "double-fork":
        return f"sh -c '(sh {escapee} forked &) &'", ["forked"]
    if kind == "torchrun":
        if not HAS_TORCH:
            pytest.skip("torch (and torchrun) are not installed")
        tiny = scripts / "tiny_torch.py"
        tiny.write_text(TINY_TORCH)
        return f"{TORCHRUN} --standalone --nproc_per_node=2 {tiny} &", ["rank-0", "rank-1"]
    raise ValueError(kind)


def job_script(start_escape: str, ready: list[str], end: str) -> str:
    """The worker: starts the escape, then runs on (until stopped or killed) or, for "success",
    exits 0 once the escape runs and the test has seen it (it creates $READY/go)."""
    if end != "success":
        return f"{start_escape}\nexec sleep 600\n"
    missing = " || ".join(f'[ ! -e "$READY/{name}" ]' for name in [*ready, "go"])
    return f"{start_escape}\nwhile {missing}; do sleep 0.05; done\nexit 0\n"


def job_env(mark: str, ready_dir: Path) -> dict[str, str]:
    return {MARK: mark, "READY": str(ready_dir), "GLOO_SOCKET_IFNAME": "lo"}


def marked(mark: str) -> list[int]:
    """The live (not zombie) processes whose environment has MARK=mark."""
    wanted = f"{MARK}={mark}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if wanted in environ and state not in (b"Z", b"X"):
            found.append(int(entry))
    return found


def wait_files(directory: Path, names: list[str], timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not all((directory / name).exists() for name in names):
        assert time.monotonic() < deadline, f"{names} did not all appear in {directory}"
        time.sleep(0.05)


def wait_until_none(mark: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while left := marked(mark):
        assert time.monotonic() < deadline, f"processes of the job left: {left}"
        time.sleep(0.05)


def kill_marked(mark: str) -> None:
    """After a failed assertion: nothing of the test may linger."""
    for pid in marked(mark):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
