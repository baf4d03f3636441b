"""`corral fgd`: FGD's packing experiment on an openb node list and pod list (docs/fgd.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from corral.cli.common import console, fail

DEFAULT_POLICIES = "fgd,best-fit,random-fit,packing"


def fgd(
    nodes: Annotated[Path, typer.Option(help="openb_node_list_gpu_node.csv")],
    tasks: Annotated[Path, typer.Option(help="an openb_pod_list_*.csv")],
    policies: Annotated[
        str,
        typer.Option(help="comma-separated: fgd, best-fit, random-fit, packing, packing-cpu"),
    ] = DEFAULT_POLICIES,
    target_load: Annotated[
        float, typer.Option(help="stop arrivals at this share of GPU capacity requested")
    ] = 1.3,
    repeats: Annotated[
        int, typer.Option(help="arrival orders (seeds seed, seed+1, ...); curves are medians")
    ] = 3,
    seed: Annotated[int, typer.Option()] = 0,
    coverage: Annotated[
        float,
        typer.Option(
            help="FGD's target workload: the most popular task shapes covering this share"
        ),
    ] = 1.0,
    out: Annotated[Path, typer.Option(help="output directory")] = Path("runs/fgd"),
    plot: Annotated[bool, typer.Option(help="write fgd.png")] = False,
) -> None:
    """Place GPU-sharing tasks until the cluster is full; compare fragmentation by policy."""
    from rich.progress import TaskID

    from corral.core.sharing import SharingError
    from corral.sim.report import progress_bar
    from corral.sim.sharing import ExperimentSettings, run_experiment, summary_table, write_outputs
    from corral.sim.traces.base import TraceError
    from corral.sim.traces.openb import read_nodes, read_tasks

    try:
        settings = ExperimentSettings(
            policies=tuple(p.strip() for p in policies.split(",") if p.strip()),
            target_load=target_load,
            repeats=repeats,
            seed=seed,
            coverage=coverage,
        )
        settings.check()
        node_list = read_nodes(nodes)
        task_list = read_tasks(tasks)
        console.print(
            f"[bold]{tasks}[/]: {len(task_list)} tasks on {len(node_list)} nodes "
            f"({sum(n.num_gpu for n in node_list)} GPUs), arrivals up to "
            f"{100 * target_load:.0f}% of GPU capacity, {repeats} orders"
        )
        with progress_bar(console) as progress:
            bars: dict[str, TaskID] = {}

            def on_progress(policy: str, repeat: int, done: int, total: int) -> None:
                if policy not in bars:
                    bars[policy] = progress.add_task(policy, total=total * repeats)
                progress.update(bars[policy], completed=repeat * total + done)

            experiment = run_experiment(node_list, task_list, settings, on_progress)
        summary = write_outputs(experiment, out, plot)
    except (TraceError, SharingError, OSError) as error:
        fail(str(error).splitlines()[0] if str(error) else type(error).__name__)
    console.print(summary_table(summary))
    console.print(
        f"wrote {out / 'summary.json'}, {out / 'curves.csv'}"
        + (f", {out / 'fgd.png'}" if plot else "")
    )
