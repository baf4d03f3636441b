"""The compiled build (setup.py: a non-editable install where a C compiler is present): whether
it is in use, and the one mypyc marker the compiled classes need."""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from mypy_extensions import mypyc_attr as mypyc_attr
else:

    def mypyc_attr(*args, **kwargs):
        """mypy_extensions' marker, which mypyc reads when it compiles; nothing at run time
        (mypy_extensions comes with mypy, not a dependency of corral)."""
        return lambda cls: cls


def compiled_core() -> bool:
    """Whether the scheduling core imported is the mypyc-compiled build (an extension module)
    rather than its Python source. The scheduler's file is looked up, not imported: this module
    lies below everything it compiles (their classes import `mypyc_attr` from here)."""
    spec = importlib.util.find_spec("corral.core.scheduler")
    return spec is not None and not (spec.origin or "").endswith(".py")


T = TypeVar("T")


def init_fields(cls: type) -> tuple[str, ...]:
    """The fields a dataclass's `__init__` takes, for its `__reduce__` (`rebuilt`)."""
    return tuple(field.name for field in dataclasses.fields(cls) if field.init)


def rebuilt(cls: type[T], values: dict[str, Any]) -> T:
    """An object made again from its `__init__`'s arguments: how the compiled build's frozen and
    argument-taking classes pickle (`corral simulate --workers` sends results back by pickle),
    which mypyc's native classes cannot by themselves (they would be made by `__init__` without
    arguments). The same in both builds."""
    return cls(**values)
