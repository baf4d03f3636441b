"""The commands built with typer: the simulator's smaller commands here, the others registered
from corral.cli.simulate, .up, .configcmd (built lazily, corral.cli.lazy), .fgd, and
export-trace from .up (what they share is in corral.cli.common). corral.cli.main runs them as
`corral NAME ...` (each is named in its COMMANDS table): typer and rich are imported only when
one of them runs, never for the client commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from corral.cli import fgd, up
from corral.cli.common import UserError, console, fail
from corral.cli.lazy import LazyGroup
from corral.cli.simulate import parse_cluster, trace_help

# Built when called: their flags come from the plugin registries (the scheduling core).
LazyGroup.lazy = {
    "simulate": "corral.cli.simulate:command",
    "up": "corral.cli.up:command",
    "config": "corral.cli.configcmd:command",
}
LazyGroup.order = ["simulate", "vc-config", "plot-vcs", "fgd", "up", "config"]

app = typer.Typer(
    cls=LazyGroup,
    add_completion=False,
    no_args_is_help=True,
    help="corral: a GPU cluster manager for deep-learning training.",
    pretty_exceptions_enable=False,
)


@app.callback()
def main() -> None:
    """corral: a GPU cluster manager for deep-learning training."""


@app.command("vc-config")
def vc_config_command(
    trace: Annotated[str, typer.Option(help=trace_help())],
    cluster: Annotated[str, typer.Option(help="NODESxGPUS, e.g. 64x8")] = "64x8",
    racks: Annotated[int, typer.Option(help="racks the nodes are spread over")] = 8,
    gpu_type: Annotated[str, typer.Option(help="GPU type of the nodes")] = "v100",
    out: Annotated[Path, typer.Option(help="YAML file to write")] = Path("vcs.yaml"),
) -> None:
    """Write a cluster config whose VCs get node cells in proportion to their demand in a trace."""
    import yaml

    from corral.sim.traces import TraceError, load_trace
    from corral.sim.vcconfig import VcSizingError, vc_config

    try:
        nodes, gpus_per_node = parse_cluster(cluster)
        jobs = load_trace(trace).jobs
        config = vc_config(jobs, nodes, gpus_per_node, racks, gpu_type.lower())
    except (UserError, TraceError, VcSizingError, OSError) as error:
        fail(str(error))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(config, sort_keys=False))
    sizes = config["virtual_clusters"]
    console.print(f"wrote {out}: {len(sizes)} VCs on {nodes} nodes")  # type: ignore[arg-type]


@app.command("plot-vcs")
def plot_vcs_command(
    runs: Annotated[
        list[Path],
        typer.Argument(help="output directories of `corral simulate --private-baseline`"),
    ],
    out: Annotated[Path, typer.Option(help="PNG to write")] = Path("vc-queueing.png"),
) -> None:
    """Plot per-VC queueing, shared against alone, for each run of each directory."""
    import json

    from corral.cli.simextra import require_sim

    require_sim()

    from corral.sim.report import plot_vc_queueing

    labelled: list[tuple[str, dict[str, object]]] = []
    for directory in runs:
        path = directory / "summary.json"
        try:
            summaries = json.loads(path.read_text())["runs"]
        except (OSError, ValueError, KeyError) as error:
            fail(f"{path}: cannot read a corral summary ({error})")
        for summary in summaries:
            admission = summary.get("options", {}).get("scheduler", {}).get("admission", "none")
            labelled.append((f"{admission} + {summary['policy']}/{summary['placement']}", summary))
    plot_vc_queueing(labelled, out)
    console.print(f"wrote {out}")


app.command("fgd")(fgd.fgd)
app.command("export-trace")(up.export_trace)
