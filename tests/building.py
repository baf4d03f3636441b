"""What the tests that build corral's package share: a copy of the sources to build from, and
whether this machine can build the compiled core."""

from __future__ import annotations

import shlex
import shutil
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def source_copy(destination: Path) -> Path:
    """What a build reads (the package, setup.py, pyproject.toml, README.md), copied to
    `destination` without build outputs: building writes beside the sources (corral.egg-info,
    build/), and an editable install's compiled modules must not come along."""
    destination.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.c")
    shutil.copytree(ROOT / "corral", destination / "corral", ignore=ignore)
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, destination / name)
    return destination


def compiler_and_headers() -> bool:
    """A C compiler (the one Python was built with) and Python's headers: checked here on its
    own, not by setup.py's `_why_pure`, which the tests prove."""
    command = shlex.split(sysconfig.get_config_var("CC") or "cc")
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    return bool(command) and shutil.which(command[0]) is not None and headers.exists()
