"""Which extra each of the manager's and the simulator's commands needs (pyproject.toml).

`pip install corral` is the client: the client commands, the SDK and corral.progress. `corral up`
and `corral export-trace` need `corral[server]`; `corral simulate`, `vc-config`, `plot-vcs` and
`fgd` need `corral[sim]`; `corral config` either (it reads the scheduling core). corral.cli.main
calls `missing_extra` before it imports such a command, so that a client-only install answers in
one line what to install instead of a traceback half-way through the imports. It imports only the
standard library: the packages are looked for, not imported.
"""

from __future__ import annotations

import importlib.util

#: The packages (their import names) of the scheduling core and the typer commands: both extras'.
CORE = ("numpy", "sortedcontainers", "typer", "rich")
#: extra -> the import names of the packages it brings (those a command cannot do without).
EXTRAS: dict[str, tuple[str, ...]] = {
    "server": (*CORE, "fastapi", "uvicorn", "sqlalchemy", "alembic", "prometheus_client"),
    "sim": (*CORE, "scipy", "matplotlib"),
}
#: command -> the extras any one of which it runs with (the first is the one named).
COMMAND_EXTRAS: dict[str, tuple[str, ...]] = {
    "up": ("server",),
    "export-trace": ("server",),
    "config": ("server", "sim"),
    "simulate": ("sim",),
    "vc-config": ("sim",),
    "plot-vcs": ("sim",),
    "fgd": ("sim",),
}


def installed(name: str) -> bool:
    """Whether the top-level package `name` can be imported (found, not imported)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def missing_packages(extra: str) -> list[str]:
    return [name for name in EXTRAS[extra] if not installed(name)]


def install_hint(extra: str) -> str:
    return f"pip install 'corral[{extra}]' (from a checkout: pip install -e '.[{extra}]')"


def missing_extra(command: str) -> str | None:
    """None when `command` can run; else the one line saying which extra to install."""
    extras = COMMAND_EXTRAS.get(command, ())
    if not extras or any(not missing_packages(extra) for extra in extras):
        return None
    first = extras[0]
    missing = missing_packages(first)
    # A client-only install lacks them all; a partial one is told which are missing.
    which = "" if len(missing) == len(EXTRAS[first]) else f" ({', '.join(missing)} missing)"
    return f"corral {command} needs the {first} extra{which}: {install_hint(first)}"
