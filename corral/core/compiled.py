"""The opt-in compiled build (setup.py, `CORRAL_COMPILE=1`): whether it is in use, and the one
mypyc marker the compiled classes need."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mypy_extensions import mypyc_attr as mypyc_attr
else:

    def mypyc_attr(*args, **kwargs):
        """mypy_extensions' marker, which mypyc reads when it compiles; nothing at run time
        (mypy_extensions comes with mypy, not a dependency of corral)."""
        return lambda cls: cls


def compiled_core() -> bool:
    """Whether the scheduling core imported is the mypyc-compiled build (an extension module)
    rather than its Python source."""
    from corral.core import scheduler

    return not (scheduler.__file__ or "").endswith(".py")
