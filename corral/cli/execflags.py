"""`corral up`'s executor flags, generated from the executor registry (corral.server.executors).

`executor_flags(command)` adds to a typer command `--executor NAME`, whose help and completion
list the registered executors, and a flag for every option an executor declares,
`--NAME-OPTION` (`--ray-address`), with its own help, grouped by executor. The command receives
`executor` (the name as given: boot refuses an unknown one, listing the registered ones) and
`executor_options`, the chosen executor's options that were given, by name. A flag of another
executor than the chosen one is refused in one line.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.markup import escape

from corral.cli.common import fail
from corral.cli.schedflags import _parameter
from corral.core.options import OptionInfo, describe


def flags() -> list[tuple[str, str, OptionInfo]]:
    """(parameter name, executor, option) for every executor's options, from the registry as it
    is now (an executor registered late has its flags too)."""
    from corral.server.executors import EXECUTORS

    return [
        (f"exec_{name.replace('-', '_')}__{info.name}", name, info)
        for name, entry in EXECUTORS.items()
        for info in describe(entry.Options)
    ]


def executor_parameter() -> inspect.Parameter:
    """`--executor NAME`: its help, default and completion from the registry."""
    from corral.server.executors import DEFAULT_EXECUTOR, executor_summaries

    summaries = executor_summaries()
    names = [name for name, _ in summaries]
    described = "; ".join(f"{name}: {summary}" for name, summary in summaries)
    text = escape(f"how attempts run, one of: {', '.join(names)} ({described})")

    def complete(incomplete: str) -> list[str]:
        return [name for name in names if name.startswith(incomplete)]

    option = typer.Option(help=text, autocompletion=complete, metavar="NAME")
    return inspect.Parameter(
        "executor",
        inspect.Parameter.KEYWORD_ONLY,
        default=DEFAULT_EXECUTOR,
        annotation=Annotated[str, option],
    )


def executor_flags(command: Callable[..., Any]) -> Callable[..., Any]:
    """The command with `--executor` and the executors' flags; it gets them as `executor=NAME`
    and `executor_options=<mapping>`."""
    from corral.server.executors import flag

    signature = inspect.signature(command, eval_str=True)
    kept = [
        p for p in signature.parameters.values() if p.name not in ("executor", "executor_options")
    ]
    known = flags()
    generated = [
        executor_parameter(),
        *(
            _parameter(name, executor, info, f"Executor: {executor}")
            for name, executor, info in known
        ),
    ]

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        chosen = kwargs.pop("executor")
        given: dict[str, Any] = {}
        for name, executor, info in known:
            value = kwargs.pop(name, None)
            if value is None:
                continue
            if executor != chosen:
                fail(
                    f"{flag(executor, info.name)}: an option of --executor {executor} "
                    f"(this is --executor {chosen})"
                )
            given[info.name] = value
        return command(**kwargs, executor=chosen, executor_options=given)

    wrapper.__signature__ = signature.replace(parameters=[*kept, *generated])  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in [*kept, *generated]}
    del wrapper.__wrapped__  # typer must read the signature above, not the command's
    return wrapper
