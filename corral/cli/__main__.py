"""`python -m corral.cli`: the `corral` command. Run where Python finds corral's sources first (the
project's root), it imports them, not an installed compiled build; it then says so, in one line."""

import sys

from corral.core.compiled import compiled_core, installed_compiled

if not compiled_core():
    _compiled = installed_compiled()
    if _compiled is not None:
        print(
            f"note: running corral's Python sources, not the compiled build installed in "
            f"{_compiled} (run the `corral` command, or from outside the source tree)",
            file=sys.stderr,
        )

from corral.cli.main import run  # noqa: E402

run()
