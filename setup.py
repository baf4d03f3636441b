"""An opt-in compiled build of the simulator's hot path (docs/simulator.md, "Simulator speed").

Without CORRAL_COMPILE=1 this adds nothing: pyproject.toml describes the (pure Python) package.
With it, the modules below are compiled with mypyc (part of mypy):

    CORRAL_COMPILE=1 pip install .

Not editable: an editable install would leave the compiled modules (.so) beside their sources,
where they shadow later edits to those sources.
"""

from __future__ import annotations

import os

import setuptools
from setuptools import setup
from setuptools.command.build import build

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
    if os.environ.get("CORRAL_COMPILE") != "1":
        setup()
        return
    try:
        from mypyc.build import mypycify
    except ImportError:
        # pip's isolated build first asks for the build requirements (PEP 517's
        # get_requires_for_build_wheel); setuptools answers with setup_requires, leaving setup()
        # before anything is built. Any other build without mypy stops at `build`.
        setup(setup_requires=[MYPYC], cmdclass={"build": _NeedsMypyc})
        return
    # pip's isolated build environment holds mypy but not corral's dependencies: numpy's types
    # are then unknown, and the compiled code treats its values as any object (as Python does);
    # the `type: ignore`s that numpy's types call for are then unused, which is no error here.
    flags = ["--ignore-missing-imports", "--no-warn-unused-ignores"]
    setup(ext_modules=mypycify([*flags, *COMPILED], opt_level="3"))


class _NeedsMypyc(build):
    """`build`, refusing (see `main`)."""

    def run(self) -> None:
        raise SystemExit(
            "CORRAL_COMPILE=1 needs mypy (its mypyc) where the package is built: "
            f"pip install '{MYPYC}', or let pip build in isolation (no --no-build-isolation)"
        )


if __name__ == "__main__":
    main()
