"""corral.cli has no import cycle: main imports the modules that hold commands, never the reverse."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import corral.cli

CLI_DIR = Path(corral.cli.__file__).parent
#: Every module of corral.cli but main (which registers the others' commands) and __main__ (which
#: runs main).
MODULES = sorted(
    path.stem for path in CLI_DIR.glob("*.py") if path.stem not in ("main", "__main__")
)


def imported_modules(path: Path) -> set[str]:
    """The modules a file imports anywhere (inside functions too): `from a.b import c` names
    both a.b and a.b.c, since c may be a module."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_modules_are_found() -> None:
    assert {"common", "client", "up", "fgd"} <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_no_module_imports_main(module: str) -> None:
    assert "corral.cli.main" not in imported_modules(CLI_DIR / f"{module}.py")


@pytest.mark.parametrize("module", MODULES)
def test_each_module_imports_alone_without_main(module: str) -> None:
    """Imported first, in a fresh interpreter, a module loads without corral.cli.main."""
    check = (
        "import importlib, sys\n"
        f"importlib.import_module('corral.cli.{module}')\n"
        "loaded = sorted(name for name in sys.modules if name.startswith('corral.cli.'))\n"
        "assert 'corral.cli.main' not in loaded, loaded\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


def test_main_registers_the_commands_with_ordinary_imports() -> None:
    source = (CLI_DIR / "main.py").read_text()
    assert "__import__" not in source
    assert {"corral.cli.up", "corral.cli.client", "corral.cli.fgd"} <= imported_modules(
        CLI_DIR / "main.py"
    )
