"""The simulator's extra: scipy and matplotlib come with `corral[sim]`, not with the manager.

`corral simulate`, `corral plot-vcs` and `corral fgd --plot` call `require_sim()` first, so that
an install without them says so in one line rather than failing half-way through a run."""

from __future__ import annotations

import importlib.util

from corral.cli.common import fail
from corral.cli.extras import install_hint

SIM_PACKAGES = ("scipy", "matplotlib")
MESSAGE = f"the simulator needs the sim extra: {install_hint('sim')}"


def missing_sim_packages() -> list[str]:
    """The packages of the extra that cannot be imported (found without importing them)."""
    missing = []
    for name in SIM_PACKAGES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing


def require_sim() -> None:
    """Exit 2 with the one line when the extra is not installed."""
    if missing_sim_packages():
        fail(MESSAGE)
