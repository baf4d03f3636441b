"""`corral completion bash|zsh|fish`: the shell's completion script for `corral`.

The script calls `corral` back with _CORRAL_COMPLETE=bash_complete (zsh_complete,
fish_complete) set: click answers from the command tree (corral.cli.main builds it lazily, so
completing a subcommand's name imports only the client commands' module).
"""

from __future__ import annotations

import click

SHELLS = ("bash", "zsh", "fish")


@click.command()
@click.argument("shell", type=click.Choice(SHELLS))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print the completion script for SHELL.

    \b
    bash: eval "$(corral completion bash)"   (in ~/.bashrc)
    zsh:  eval "$(corral completion zsh)"    (in ~/.zshrc)
    fish: corral completion fish > ~/.config/fish/completions/corral.fish
    """
    from click.shell_completion import get_completion_class

    root = ctx.find_root()
    complete_class = get_completion_class(shell)
    assert complete_class is not None  # one of click's own shells
    script = complete_class(root.command, {}, "corral", "_CORRAL_COMPLETE").source()
    click.echo(script)
