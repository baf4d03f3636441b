"""CLI flags generated from the plugin registries: one flag per declared option.

`scheduler_flags(command)` adds to a typer command a flag for every option of `CoreOptions`
(but `policy`, which each command declares itself) and of every plugin section:
`--relax-after-s 60`, `--las-thresholds-gpu-s 3250,7200,18000`, `--quota-lend-last/
--no-quota-lend-last`. Their help is the option's own, grouped by plugin. The command receives
what was given as `scheduler: dict` (a mapping `corral.core.framework.config_from_mapping` reads),
so a flag that was not given does not override the config file or the default.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

from corral.core.framework import CoreOptions, sections
from corral.core.options import OptionInfo, describe

if TYPE_CHECKING:
    from corral.core.framework import SchedulerConfig

# typer and rich are imported where a typer command is built: a run of `corral simulate` that
# corral.cli.simargs reads imports neither.


def flags() -> list[tuple[str, str | None, OptionInfo, str]]:
    """(parameter name, section or None for the core, option, help panel) for every flag, from
    the registries as they are now (a plugin registered late has its flags too)."""
    flags: list[tuple[str, str | None, OptionInfo, str]] = []
    for info in describe(CoreOptions):
        if info.name != "policy":
            flags.append((f"sched__{info.name}", None, info, "Scheduler"))
    for section, cls in sections().items():
        for info in describe(cls):
            name = f"sched_{section.replace('-', '_')}__{info.name}"  # random-fit: a Python name
            flags.append((name, section, info, f"Scheduler: {section}"))
    return flags


def flag_name(section: str | None, option: str) -> str:
    name = option if section is None else f"{section}-{option}"
    return "--" + name.replace("_", "-")


def _default_text(info: OptionInfo) -> str:
    value = info.default
    if isinstance(value, tuple):
        return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value) or "none"
    if isinstance(value, float):
        return f"{value:g}"
    return (
        "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    )


def _parameter(name: str, section: str | None, info: OptionInfo, panel: str) -> inspect.Parameter:
    import typer
    from rich.markup import escape

    flag = flag_name(section, info.name)
    default = _default_text(info)
    text = info.help
    names = info.choices_text()  # read from the registry now: a late entry is listed too
    if names:
        text += f" ({'any' if info.base is not str else 'one'} of: {names})"
    if info.range_text():
        text += f" ({info.range_text()})"
    text += escape(f" [default: {default}]")
    if info.base is bool:
        negative = "--no-" + flag[2:]
        option = typer.Option(
            f"{flag}/{negative}", help=text, rich_help_panel=panel, show_default=False
        )
        annotation: Any = Annotated[Optional[bool], option]  # noqa: UP045 - typer needs Optional
    elif info.bare is not None:  # `--backfill` alone (`with_bare_flags`), or `--backfill easy`
        option = typer.Option(
            flag,
            help=text + escape(f" [alone: {info.bare}]"),
            rich_help_panel=panel,
            metavar="[VALUE]",
            show_default=False,
        )
        annotation = Annotated[Optional[str], option]  # noqa: UP045
    else:
        metavar = "LIST" if info.base is not str and "tuple" in str(info.base) else "VALUE"
        option = typer.Option(
            flag, help=text, rich_help_panel=panel, metavar=metavar, show_default=False
        )
        annotation = Annotated[Optional[str], option]  # noqa: UP045
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation
    )


def overrides(
    values: dict[str, Any], generated: list[tuple[str, str | None, OptionInfo, str]]
) -> dict[str, Any]:
    """The mapping of the flags that were given, from the generated parameters' values."""
    out: dict[str, Any] = {}
    for name, section, info, _ in generated:
        value = values.get(name)
        if value is None:
            continue
        if section is None:
            out[info.name] = value
        else:
            out.setdefault(section, {})[info.name] = value
    return out


def scheduler_flags(command: Callable[..., Any]) -> Callable[..., Any]:
    """The command with the generated flags added; it gets them as `scheduler=<mapping>`."""
    import typer

    # (the command's module may leave typer to its annotations: `if TYPE_CHECKING: import typer`)
    signature = inspect.signature(
        command, eval_str=True, globals={**inspect.unwrap(command).__globals__, "typer": typer}
    )
    kept = [p for p in signature.parameters.values() if p.name != "scheduler"]
    known = flags()
    generated = [_parameter(*flag) for flag in known]

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        given = {name: kwargs.pop(name, None) for name, *_ in known}
        return command(**kwargs, scheduler=overrides(given, known))

    wrapper.__signature__ = signature.replace(parameters=[*kept, *generated])  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in [*kept, *generated]}
    del wrapper.__wrapped__  # typer must read the signature above, not the command's
    return wrapper


def _flag_message(message: str) -> str:
    """An OptionError about a given flag, naming the flag (`--relax-after-s: ...`)."""
    core = re.match(r"scheduler: ([a-z_]+): (.*)", message)
    if core is not None and core.group(1) in {info.name for info in describe(CoreOptions)}:
        return f"{flag_name(None, core.group(1))}: {core.group(2)}"
    match = re.match(r"scheduler\.([a-z0-9_-]+)(?:\.([a-z0-9_]+))?(\[\d+\])?: (.*)", message)
    if match is None:
        return message
    first, second, _, reason = match.groups()
    if second is not None:
        return f"{flag_name(first, second)}: {reason}"
    if first in {info.name for info in describe(CoreOptions)}:
        return f"{flag_name(None, first)}: {reason}"
    return f"--{first}-* options: {reason}"


def user_mapping(path: Path | None, given: dict[str, Any]) -> dict[str, object]:
    """What the user gave: the file's `scheduler:` section as written (if any), then the flags."""
    from corral.cli.common import UserError
    from corral.core.framework import merge
    from corral.core.options import OptionError

    base: dict[str, object] = {}
    if path is not None:  # (only then PyYAML: some 10 ms of a run's start)
        from corral.config_file import load_scheduler_config, read_yaml_file

        try:
            load_scheduler_config(path)  # checked whole, errors naming the file
            data = read_yaml_file(path)
        except OptionError as error:
            raise UserError(str(error)) from None
        assert isinstance(data, dict)
        base = dict(data.get("scheduler", data))
    return merge(base, given)


def effective_config(
    path: Path | None, given: dict[str, Any], preset: str | None = None, policy: str | None = None
) -> SchedulerConfig:
    """Defaults, then the preset (if any, with its changes for `policy`), then the file (if any),
    then the flags given; UserError naming the preset, the file or the flag."""
    from corral.cli.common import UserError
    from corral.core.framework import config_from_mapping, merge
    from corral.core.options import OptionError

    base: dict[str, object] = {}
    if preset is not None:
        from corral.core.presets import get_preset

        try:
            chosen = get_preset(preset)
        except ValueError as error:
            raise UserError(f"--preset: {error}") from None
        base = merge(chosen.scheduler, chosen.by_policy.get(policy or "", {}))
    try:
        return config_from_mapping(merge(base, user_mapping(path, given)))
    except OptionError as error:
        raise UserError(_flag_message(str(error))) from None


def preset_changes(
    preset: str | None, path: Path | None, given: dict[str, Any]
) -> dict[str, dict[str, object]]:
    """The preset's per-policy changes, less what the user gave (file or flags), by policy."""
    if preset is None:
        return {}
    from corral.core.presets import get_preset, given_keys, without

    keys = given_keys(user_mapping(path, given))
    return {
        policy: without(changes, keys) for policy, changes in get_preset(preset).by_policy.items()
    }


def click_command(name: str, command: Callable[..., Any]) -> Any:
    """A click command for `command` with the generated flags (for corral.cli.lazy)."""
    import typer
    import typer.main

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command(name)(scheduler_flags(command))
    return with_bare_flags(typer.main.get_command(app))


def expand_bare(args: list[str], bare: dict[str, str]) -> list[str]:
    """The command line with the value of each flag that has one alone (`option(bare=...)`)
    given where the flag is last or followed by another flag: `--backfill --trace X` is
    `--backfill greedy --trace X`."""
    out: list[str] = []
    for position, arg in enumerate(args):
        out.append(arg)
        if arg in bare and (position + 1 == len(args) or args[position + 1].startswith("-")):
            out.append(bare[arg])
    return out


def bare_values(
    known: list[tuple[str, str | None, OptionInfo, str]],
) -> dict[str, str]:
    """The value of each flag that has one alone (`--backfill`: greedy), by flag."""
    return {
        flag_name(section, info.name): info.bare
        for _, section, info, _ in known
        if info.bare is not None
    }


def with_bare_flags(command: Any) -> Any:
    """The click command (or each command of a group) reading a flag with a bare value alone
    (`--backfill` is `--backfill greedy`): typer's options take a value or none, not both."""
    bare = bare_values(flags())
    for sub in getattr(command, "commands", {}).values():
        with_bare_flags(sub)
    parse = command.parse_args

    def parse_args(ctx: Any, args: list[str]) -> list[str]:
        return parse(ctx, expand_bare(list(args), bare))

    command.parse_args = parse_args
    return command
