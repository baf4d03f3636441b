"""Make packages unimportable in a child Python, as if they were not installed: a sys.meta_path
finder, first in line, that raises ModuleNotFoundError for them (and a sitecustomize.py that
installs it, for a child started as `python -m corral.cli ...`)."""

from __future__ import annotations

import os
from pathlib import Path

FINDER = '''
import sys


class _NotInstalled:
    """Raises ModuleNotFoundError for the blocked packages, as if they were not installed."""

    def __init__(self, names):
        self.names = frozenset(names)

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
        return None


sys.meta_path.insert(0, _NotInstalled(NAMES))
'''


def blocking_env(directory: Path, *names: str) -> dict[str, str]:
    """The environment of a child Python in which `names` cannot be imported: a sitecustomize.py
    in `directory`, first on PYTHONPATH (the rest of PYTHONPATH kept)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(f"NAMES = {list(names)!r}\n{FINDER}")
    paths = [str(directory), os.environ.get("PYTHONPATH", "")]
    return os.environ | {"PYTHONPATH": os.pathsep.join(path for path in paths if path)}
