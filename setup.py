"""The compiled build of the scheduling core's hot path (docs/simulator.md, "The compiled build").

A wheel or a plain `pip install .` compiles the modules below with mypyc (part of mypy) where a C
compiler and Python's headers are present, and falls back to the pure Python package where they
are not or where compiling fails. An editable install (`pip install -e .`) stays pure Python: the
compiled modules (.so) would lie beside their sources and shadow later edits to them.
CORRAL_COMPILE chooses instead:

    CORRAL_COMPILE=0 pip install .     # pure Python
    CORRAL_COMPILE=1 pip install .     # compiled, or the install fails saying why (editable too)
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path

import setuptools
from setuptools import setup
from setuptools.command.build import build
from setuptools.command.build_ext import build_ext

#: The compiled modules: the scheduling core's round and the simulator's event loop.
COMPILED = [
    "corral/core/scheduler.py",
    "corral/core/state.py",
    "corral/core/walk.py",
    "corral/core/timers.py",
    "corral/core/index.py",
    "corral/core/preempt.py",
    "corral/core/statement.py",
    "corral/core/chain.py",
    "corral/core/lifecycle.py",
    "corral/core/precheck.py",
    "corral/core/actions.py",
    "corral/core/job.py",
    "corral/core/cluster.py",
    "corral/core/placement/base.py",
    "corral/core/placement/named.py",
    "corral/core/placement/algorithms.py",
    "corral/core/policy/base.py",
    "corral/core/policy/las.py",
    "corral/core/policy/gittins.py",
    "corral/sim/engine.py",
    "corral/sim/result.py",
]
#: What compiles them; pip's isolated build installs it (setup_requires, asked for below). The
#: version the compiled build is tested with (constraints.txt): mypyc type-checks what it compiles,
#: and a newer mypy may find fault where this one does not.
MYPYC = "mypy==2.4.1"


#: The first setuptools that reads pyproject.toml's `license = "Apache-2.0"` (an SPDX expression,
#: PEP 639); an older one (Python 3.11's venv brings 65.5) refuses the whole file.
SETUPTOOLS = 77


def main() -> None:
    major = int(setuptools.__version__.split(".")[0])
    if major < SETUPTOOLS:
        raise SystemExit(
            f"corral's build needs setuptools>={SETUPTOOLS} (pyproject.toml's license is an SPDX "
            f"expression), this environment has {setuptools.__version__}: pip install "
            f"'setuptools>={SETUPTOOLS}', or let pip build in isolation (no --no-build-isolation)"
        )
    asked = os.environ.get("CORRAL_COMPILE", "")
    if asked not in ("", "0", "1"):
        raise SystemExit(
            f"CORRAL_COMPILE={asked}: say 1 (compile), 0 (pure Python) or leave it unset"
        )
    forced = asked == "1"
    why_not = None if forced else _why_pure(asked)
    if why_not is not None:
        _say(f"corral: pure Python build ({why_not})")
        setup()
        return
    try:
        from mypyc.build import mypycify
    except ImportError:
        # pip's isolated build first asks for the build requirements (PEP 517's
        # get_requires_for_build_wheel); setuptools answers with setup_requires, leaving setup()
        # before anything is built. Any other build without mypy stops at `build` when compiling
        # was asked for, and builds pure Python when it was the default.
        setup(setup_requires=[MYPYC], cmdclass={"build": _NeedsMypyc if forced else _PureBuild})
        return
    if _metadata_only():
        setup()  # pip's metadata step (PEP 517): no modules to compile (some 10 s of mypyc saved)
        return
    # pip's isolated build environment holds mypy but not corral's dependencies: numpy's types
    # are then unknown, and the compiled code treats its values as any object (as Python does);
    # the `type: ignore`s that numpy's types call for are then unused, which is no error here.
    flags = ["--ignore-missing-imports", "--no-warn-unused-ignores"]
    try:
        modules = mypycify([*flags, *COMPILED], opt_level="3")
    except (Exception, SystemExit) as error:  # mypyc's type check fails by SystemExit
        if forced:
            raise
        _say(f"corral: pure Python build (mypyc could not compile the core: {error})")
        setup()
        return
    setup(ext_modules=modules, cmdclass={} if forced else {"build_ext": _BuildExtOrPure})


def _why_pure(asked: str) -> str | None:
    """Why the default build is pure Python here, or None to compile."""
    if asked == "0":
        return "CORRAL_COMPILE=0"
    if any(command in sys.argv for command in ("editable_wheel", "develop")):
        return "an editable install keeps its sources authoritative"
    compiler = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()
    if not compiler or shutil.which(compiler[0]) is None:
        return f"no C compiler: {compiler[0] if compiler else 'CC'} not found"
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").exists():
        return f"no Python headers: {include}/Python.h not found (python3-dev)"
    return None


def _metadata_only() -> bool:
    """Whether setup.py was asked only for the package's metadata (egg_info, dist_info)."""
    commands = [arg for arg in sys.argv[1:] if not arg.startswith("-")]
    return bool(commands) and commands[0] in ("egg_info", "dist_info")


def _say(line: str) -> None:
    print(line, file=sys.stderr)


class _NeedsMypyc(build):
    """`build`, refusing (see `main`)."""

    def run(self) -> None:
        raise SystemExit(
            "CORRAL_COMPILE=1 needs mypy (its mypyc) where the package is built: "
            f"pip install '{MYPYC}', or let pip build in isolation (no --no-build-isolation)"
        )


class _PureBuild(build):
    """`build` without mypy where it was not asked for: the pure Python package."""

    def run(self) -> None:
        _say(f"corral: pure Python build (no mypy here to compile the core: pip install '{MYPYC}')")
        super().run()


class _BuildExtOrPure(build_ext):
    """`build_ext` that leaves the package pure Python where a module fails to compile or link:
    the compiled modules import one another's native code, so it is all of them or none."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as error:  # distutils' CompileError, LinkError, CCompilerError
            for extension in self.extensions:
                Path(self.get_ext_fullpath(extension.name)).unlink(missing_ok=True)
            _say(f"corral: pure Python build (compiling the core failed: {error})")


if __name__ == "__main__":
    main()
