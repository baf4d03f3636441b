"""`corral fgd`: FGD's packing experiment on an openb node list and pod list (docs/fgd.md).

A thin alias of `corral simulate --trace openb:NODES,PODS --policy fifo --placement P --seed S`:
one simulation per placement and arrival order, and the median curves over the orders.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from corral.cli.common import console, fail

DEFAULT_POLICIES = "fgd,best-fit,random-fit,gpu-packing"


def fgd(
    nodes: Annotated[Path, typer.Option(help="openb_node_list_gpu_node.csv")],
    tasks: Annotated[Path, typer.Option(help="an openb_pod_list_*.csv")],
    policies: Annotated[
        str,
        typer.Option(
            help="comma-separated placements: fgd, best-fit, random-fit, gpu-packing, "
            "gpu-packing-cpu"
        ),
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
    workers: Annotated[
        int,
        typer.Option(
            help="run the simulations side by side in this many processes (0: one per CPU); "
            "the results are the same"
        ),
    ] = 1,
    out: Annotated[Path, typer.Option(help="output directory")] = Path("runs/fgd"),
    plot: Annotated[bool, typer.Option(help="write fgd.png")] = False,
) -> None:
    """Place GPU-sharing tasks until the cluster is full; compare fragmentation by placement."""
    if plot:
        from corral.cli.simextra import require_sim

        require_sim()
    from corral.sim.fragmentation import (
        ExperimentSettings,
        run_experiment,
        summary_table,
        write_outputs,
    )
    from corral.sim.report import progress_bar

    settings = ExperimentSettings(
        policies=tuple(p.strip() for p in policies.split(",") if p.strip()),
        target_load=target_load,
        repeats=repeats,
        seed=seed,
        coverage=coverage,
        workers=workers,
    )
    try:
        with progress_bar(console) as progress:
            bar = progress.add_task("simulations", total=len(settings.policies) * repeats)

            def on_run(placement: str, repeat: int) -> None:
                progress.update(bar, advance=1, description=f"{placement}, order {repeat + 1}")

            experiment = run_experiment(nodes, tasks, settings, on_run)
        summary = write_outputs(experiment, out, plot)
    except (ValueError, OSError) as error:
        fail(str(error).splitlines()[0] if str(error) else type(error).__name__)
    runs = summary["runs"]
    assert isinstance(runs, list) and experiment.results
    console.print(
        f"[bold]{tasks}[/]: {experiment.trace_tasks} tasks on {experiment.nodes} nodes "
        f"({experiment.capacity_gpus:.0f} GPUs), arrivals up to {100 * target_load:.0f}% of GPU "
        f"capacity, {repeats} orders; corral simulate --policy fifo per placement and order",
        soft_wrap=True,
    )
    console.print(summary_table(summary))
    console.print(
        f"wrote {out / 'summary.json'}, {out / 'curves.csv'}"
        + (f", {out / 'fgd.png'}" if plot else "")
    )
