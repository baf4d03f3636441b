"""`corral config show`: the scheduler config that `simulate` or `up` would run with, or the one
a running manager runs with (`--url`), as YAML that `--scheduler-config` reads back."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from corral.cli.common import UserError, console, fail
from corral.cli.registries import policy_help, preset_help


def show(
    scheduler_config: Annotated[
        Path | None, typer.Option(help="start from this file's `scheduler:` section")
    ] = None,
    policy: Annotated[str | None, typer.Option(help=policy_help())] = None,
    preset: Annotated[
        str | None,
        typer.Option(help=preset_help()),
    ] = None,
    all_sections: Annotated[
        bool,
        typer.Option("--all", help="every plugin's options, not only the chosen plugins'"),
    ] = False,
    url: Annotated[
        str | None,
        typer.Option(
            help="show the config of the manager running there instead (CORRAL_URL, token from "
            "CORRAL_TOKEN)",
        ),
    ] = None,
    *,
    scheduler: dict[str, Any],
) -> None:
    """Print the effective scheduler config (defaults, then the file, then the flags)."""
    import yaml

    from corral.cli.schedflags import effective_config

    if url is not None:
        from corral.client import Client, ClientError

        try:
            mapping = Client(url).scheduler_config()
        except ClientError as error:
            fail(str(error))
    else:
        try:
            given = scheduler | ({"policy": policy} if policy is not None else {})
            config = effective_config(scheduler_config, given, preset, policy)
            if preset is not None and policy is None:  # the preset's change for its policy
                chosen = config.core.policy
                config = effective_config(scheduler_config, given, preset, chosen)
        except UserError as error:
            fail(str(error))
        mapping = {"scheduler": config.to_mapping(only_used=not all_sections)}
        if preset is not None:
            from corral.core.presets import get_preset

            chosen_preset = get_preset(preset)
            if chosen_preset.simulator:  # `simulate` reads these; `--scheduler-config` does not
                mapping["simulate"] = dict(chosen_preset.simulator)
    console.print(
        yaml.safe_dump(mapping, sort_keys=False).rstrip(), highlight=False, soft_wrap=True
    )


def plugins() -> None:
    """List every registered policy, placement, admission scheme, round stage and trace format."""
    from rich.markup import escape
    from rich.table import Table

    from corral.cli.registries import KINDS

    table = Table("kind", "name", "what it does", "options or usage", box=None, pad_edge=False)
    for kind, rows in KINDS:
        for row in rows():
            table.add_row(kind, row.name, escape(row.summary), escape(row.use) or "-")
    console.print(table)


def command() -> Any:
    """The `config` group (corral.cli.lazy builds it)."""
    from corral.cli.schedflags import scheduler_flags, with_bare_flags

    app = typer.Typer(
        add_completion=False,
        no_args_is_help=True,
        pretty_exceptions_enable=False,
    )

    @app.callback()
    def config() -> None:
        """The scheduler's configuration (`corral config show`)."""

    app.command("show")(scheduler_flags(show))
    app.command("plugins")(plugins)
    return with_bare_flags(typer.main.get_command(app))
