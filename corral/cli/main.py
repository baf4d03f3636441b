"""The `corral` command."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="corral: a GPU cluster manager for deep-learning training.",
    pretty_exceptions_enable=False,
)
console = Console()
if not console.is_terminal:
    console = Console(
        width=140
    )  # piped output (CI, files): keep the summary table on one line a run
err_console = Console(stderr=True)


class UserError(Exception):
    """An error the user caused: shown as one line, exit code 2."""


def fail(message: str) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


@app.callback()
def main() -> None:
    """corral: a GPU cluster manager for deep-learning training."""


def parse_cluster(shorthand: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d+)\s*x\s*(\d+)\s*", shorthand)
    if not match:
        raise UserError(f"--cluster: expected NODESxGPUS such as 64x8, got {shorthand!r}")
    return int(match.group(1)), int(match.group(2))


def parse_window(window: str | None) -> tuple[int, int] | None:
    if window is None:
        return None
    match = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", window)
    if not match or int(match.group(1)) >= int(match.group(2)):
        raise UserError(
            f"--window: expected START:END job indices with START < END, got {window!r}"
        )
    return int(match.group(1)), int(match.group(2))


def parse_range(option: str, text: str | None) -> tuple[float, float] | None:
    if text is None:
        return None
    try:
        low, high = (float(part) for part in text.split(":"))
    except ValueError:
        low = high = math.nan
    if not 0 < low <= high < math.inf:
        raise UserError(
            f"{option}: expected LO:HI with 0 < LO <= HI, such as 0.5:1.5, got {text!r}"
        )
    return low, high


def parse_floats(option: str, text: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserError(f"{option}: expected comma-separated numbers, got {text!r}") from None


@app.command()
def simulate(
    trace: Annotated[
        str,
        typer.Option(
            help="FORMAT:PATH, FORMAT one of philly, tiresias, gavel, "
            "alibaba, helios, synthetic (synthetic:jobs=N,load=L,gpus=G)"
        ),
    ],
    cluster: Annotated[str, typer.Option(help="NODESxGPUS, e.g. 64x8")] = "16x8",
    racks: Annotated[int, typer.Option(help="racks the nodes are spread over")] = 1,
    gpu_type: Annotated[str, typer.Option(help="GPU type of the --cluster shorthand")] = "v100",
    gpus_per_switch: Annotated[int | None, typer.Option(help="GPUs under one PCIe switch")] = None,
    config: Annotated[Path | None, typer.Option(help="cluster YAML (overrides --cluster)")] = None,
    policy: Annotated[
        str,
        typer.Option(help="fifo, sjf, srtf, las, gittins, optimus, timeslice, edf, elasticflow"),
    ] = "las",
    placement: Annotated[
        str, typer.Option(help="consolidate, relax, profile, any, hetero, cache-aware")
    ] = "relax",
    compare: Annotated[
        str | None, typer.Option(help="several policies, e.g. fifo,las,gittins,srtf")
    ] = None,
    backfill: Annotated[
        bool, typer.Option(help="let smaller jobs pass a blocked head job (fifo)")
    ] = False,
    las_thresholds: Annotated[
        str, typer.Option(help="LAS/Gittins queue thresholds, GPU-seconds")
    ] = "3600,36000",
    starvation_factor: Annotated[
        float | None,
        typer.Option(help="LAS: promote a job that waited this many times its run time"),
    ] = None,
    gittins_history: Annotated[
        Path | None,
        typer.Option(
            help="CSV with a 'duration' column of job GPU-seconds (default: the trace's own jobs)"
        ),
    ] = None,
    relax_after: Annotated[
        float, typer.Option(help="relax: seconds of waiting before locality is relaxed")
    ] = 600.0,
    profile_threshold: Annotated[
        float, typer.Option(help="profile: consolidate jobs slowed more than this when spread")
    ] = 1.1,
    optimus_noise: Annotated[
        float, typer.Option(help="optimus: noise (log-normal sd) of the simulated loss samples")
    ] = 0.02,
    hetero_fairness: Annotated[
        float | None,
        typer.Option(
            help="hetero: match a job only to GPU types where it runs at least this fraction "
            "(0-1] of its speed on an equal share of every type"
        ),
    ] = None,
    restore_s: Annotated[
        float,
        typer.Option(
            help="seconds a job that ran before spends restoring when it restarts (after a preemption or a failure)"
        ),
    ] = 30.0,
    failure_rate: Annotated[
        float, typer.Option(help="per-attempt failure probability of a 1-GPU job (0: off)")
    ] = 0.0,
    max_retries: Annotated[int, typer.Option(help="retries of a failed job")] = 3,
    arrival_scale: Annotated[
        float, typer.Option(help="multiply inter-arrival gaps (0.5 = twice the rate)")
    ] = 1.0,
    window: Annotated[
        str | None, typer.Option(help="measure jobs START:END (by arrival) only")
    ] = None,
    skip_oversized: Annotated[
        bool, typer.Option(help="drop jobs larger than the cluster instead of failing")
    ] = False,
    slowdowns: Annotated[
        Path | None, typer.Option(help="YAML/JSON {model_prefix: slowdown when spread}")
    ] = None,
    seed: Annotated[int, typer.Option()] = 0,
    admission: Annotated[
        str,
        typer.Option(
            help="none, hived (VC cells, HiveD), quota (GPU counts, YARN-CS) or fairshare (weighted by the VCs' GPUs)"
        ),
    ] = "none",
    oversubscribe: Annotated[
        bool,
        typer.Option(
            help="lend idle GPUs to jobs their VC cannot place now; owners reclaim them by preemption (quota, hived)"
        ),
    ] = False,
    lend_last: Annotated[
        bool,
        typer.Option(
            help="quota --oversubscribe: each round places jobs within their quota before lending (as corral up does)"
        ),
    ] = False,
    private_baseline: Annotated[
        bool,
        typer.Option(help="also run each VC alone on its own cells, to detect sharing anomaly"),
    ] = False,
    opportunistic_share: Annotated[
        float, typer.Option(help="hived: mark this share of jobs opportunistic (seeded)")
    ] = 0.0,
    cache_gb_per_node: Annotated[
        float | None,
        typer.Option(help="a data-set cache of this many GB per node; jobs read remote storage"),
    ] = None,
    storage_gbps: Annotated[
        float, typer.Option(help="with a cache: remote-storage Gbit/s per node, shared by its GPUs")
    ] = 1.0,
    cache_policy: Annotated[
        str, typer.Option(help="with a cache: lru (cache-oblivious) or silod (gain per GB)")
    ] = "lru",
    datasets: Annotated[
        str, typer.Option(help="with a cache: shared (one data set per model) or per-vc")
    ] = "shared",
    quantum_s: Annotated[
        float, typer.Option(help="timeslice: round length; a turn ends on a round boundary")
    ] = 600.0,
    packing: Annotated[
        bool, typer.Option(help="share GPUs between jobs the Gavel co-location table pairs well")
    ] = False,
    packing_threshold: Annotated[
        float, typer.Option(help="packing: least combined normalised throughput of a pair")
    ] = 1.1,
    migrate: Annotated[
        bool, typer.Option(help="move small jobs to bring free GPUs together on one node")
    ] = False,
    deadline_factor: Annotated[
        str | None,
        typer.Option(
            help="LO:HI: deadline = submit + U(LO,HI) x duration (default 0.5:1.5 with edf or elasticflow)"
        ),
    ] = None,
    out: Annotated[Path, typer.Option(help="output directory")] = Path("runs/latest"),
    plot: Annotated[bool, typer.Option(help="write JCT CDF, utilisation and queue plots")] = False,
) -> None:
    """Replay a trace on a modelled cluster and report how each policy did."""
    from corral.sim.runner import RunSettings, run_simulations

    try:
        nodes, gpus_per_node = parse_cluster(cluster)
        settings = RunSettings(
            trace=trace,
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            racks=racks,
            gpu_type=gpu_type,
            gpus_per_switch=gpus_per_switch,
            config=config,
            policies=[p.strip() for p in (compare or policy).split(",") if p.strip()],
            placement=placement,
            backfill=backfill,
            las_thresholds=parse_floats("--las-thresholds", las_thresholds),
            starvation_factor=starvation_factor,
            gittins_history=gittins_history,
            relax_after_s=relax_after,
            profile_threshold=profile_threshold,
            optimus_noise=optimus_noise,
            hetero_fairness=hetero_fairness,
            restore_s=restore_s,
            failure_rate=failure_rate,
            max_retries=max_retries,
            arrival_scale=arrival_scale,
            window=parse_window(window),
            skip_oversized=skip_oversized,
            slowdowns=slowdowns,
            seed=seed,
            admission=admission,
            oversubscribe=oversubscribe,
            lend_last=lend_last,
            private_baseline=private_baseline,
            opportunistic_share=opportunistic_share,
            cache_gb_per_node=cache_gb_per_node,
            storage_gbps=storage_gbps,
            cache_policy=cache_policy,
            datasets=datasets,
            quantum_s=quantum_s,
            packing=packing,
            packing_threshold=packing_threshold,
            migrate=migrate,
            deadline_factor=parse_range("--deadline-factor", deadline_factor),
        )
        run_simulations(settings, out=out, plot=plot, console=console)
    except UserError as error:
        fail(str(error))
    except (ValueError, OSError) as error:
        fail(str(error).splitlines()[0] if str(error) else type(error).__name__)


@app.command("vc-config")
def vc_config_command(
    trace: Annotated[str, typer.Option(help="FORMAT:PATH of the trace whose VCs to size")],
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

    from corral.sim.report import plot_vc_queueing

    labelled: list[tuple[str, dict[str, object]]] = []
    for directory in runs:
        path = directory / "summary.json"
        try:
            summaries = json.loads(path.read_text())["runs"]
        except (OSError, ValueError, KeyError) as error:
            fail(f"{path}: cannot read a corral summary ({error})")
        for summary in summaries:
            admission = summary.get("options", {}).get("admission", "none")
            labelled.append((f"{admission} + {summary['policy']}/{summary['placement']}", summary))
    plot_vc_queueing(labelled, out)
    console.print(f"wrote {out}")


app.command("fgd")(__import__("corral.cli.sharing", fromlist=["fgd"]).fgd)
app.command("up")(__import__("corral.cli.up", fromlist=["up"]).up)
__import__("corral.cli.client", fromlist=["register"]).register(app)
app.command("export-trace")(__import__("corral.cli.up", fromlist=["export_trace"]).export_trace)


def run() -> None:
    sys.exit(app())
