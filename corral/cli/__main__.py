"""`python -m corral.cli`: the `corral` command. Run where Python finds corral's sources first (the
project's root), it imports them, not an installed compiled build; it then says so, in one line.
The check reads file names only: it imports nothing of the core (a client-only install has none,
and the client commands must start fast)."""

import sys


def _sources_over_compiled() -> str | None:
    """The folder of an installed compiled build when Python imports corral's sources instead."""
    from importlib import metadata
    from pathlib import Path, PurePath

    core = Path(__file__).resolve().parent.parent / "core"
    if any(core.glob("scheduler.*.so")) or any(core.glob("scheduler.*.pyd")):
        return None  # these sources are the compiled build's own folder
    try:
        files = metadata.distribution("corral").files or []
    except metadata.PackageNotFoundError:
        return None
    for path in files:
        name = str(path).replace("\\", "/")
        if name.startswith("corral/core/scheduler.") and not name.endswith((".py", ".pyc")):
            return str(PurePath(str(path.locate())).parent.parent.parent)
    return None


_compiled = _sources_over_compiled()
if _compiled is not None:
    print(
        f"note: running corral's Python sources, not the compiled build installed in "
        f"{_compiled} (run the `corral` command, or from outside the source tree)",
        file=sys.stderr,
    )

from corral.cli.main import run  # noqa: E402

run()
