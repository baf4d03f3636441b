"""`corral simulate`: replay a trace on a modelled cluster. Its scheduler flags are generated
from the plugin registries (corral.cli.schedflags); the rest describe the simulated world."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from corral.cli.common import UserError, console, fail, warn

if TYPE_CHECKING:
    from collections.abc import Mapping

    # Only in the annotations, which the typer command reads (corral.cli.schedflags passes it
    # typer) and corral.cli.simargs reads without typer.
    import typer

    from corral.sim.runner import RunSettings

#: Where a user gets the Tiresias preset's Gittins history (1,000 job GPU-times of a production
#: YARN GPU cluster, in SymbioticLab/Tiresias, Apache-2.0) when the shared data is not beside them.
PRESET_HISTORY_URL = (
    "https://raw.githubusercontent.com/SymbioticLab/Tiresias/master/simulator/yarn-gput1000.csv"
)


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


# The help texts that list a registry's names are called where typer reads this signature
# (`corral.cli.schedflags.scheduler_flags` evaluates the postponed annotations each time the
# command is built), so a format or policy registered late is listed too.


def policy_help() -> str:
    from corral.cli.registries import policy_help as text

    return text()


def preset_help() -> str:
    from corral.cli.registries import preset_help as text

    return text()


def trace_help() -> str:
    from rich.markup import escape

    from corral.sim.traces import usages

    return escape(f"FORMAT:PATH, one of: {usages()} (a path ending .corral.jsonl is corral's own)")


def stream_help() -> str:
    from rich.markup import escape

    from corral.sim.traces import streaming_formats

    formats = ", ".join(streaming_formats()) or "none"
    return escape(
        "read the trace as the run goes and write each job's row as it ends: memory bounded by "
        "the jobs in the system, for traces of millions of jobs (the file in submission order; "
        f"formats that stream: {formats})"
    )


def simulate(
    trace: Annotated[str, typer.Option(help=trace_help())],
    cluster: Annotated[str, typer.Option(help="NODESxGPUS, e.g. 64x8")] = "16x8",
    racks: Annotated[int, typer.Option(help="racks the nodes are spread over")] = 1,
    gpu_type: Annotated[str, typer.Option(help="GPU type of the --cluster shorthand")] = "v100",
    gpus_per_switch: Annotated[int | None, typer.Option(help="GPUs under one PCIe switch")] = None,
    config: Annotated[Path | None, typer.Option(help="cluster YAML (overrides --cluster)")] = None,
    scheduler_config: Annotated[
        Path | None,
        typer.Option(
            help="the scheduler's settings (YAML: a `scheduler:` section, as `corral config show` "
            "prints and `corral export-trace` writes); flags override it"
        ),
    ] = None,
    policy: Annotated[str | None, typer.Option(help=policy_help())] = None,
    preset: Annotated[
        str | None,
        typer.Option(help=preset_help()),
    ] = None,
    spread_slowdown: Annotated[
        bool | None,
        typer.Option(
            "--spread-slowdown/--no-spread-slowdown",
            help="slow jobs spread over nodes by their model's factor (--slowdowns) [default: on; "
            "off with --preset tiresias]",
            show_default=False,
        ),
    ] = None,
    compare: Annotated[
        str | None, typer.Option(help="several policies, e.g. fifo,las,gittins,srtf")
    ] = None,
    workers: Annotated[
        int,
        typer.Option(
            help="run the policies of --compare side by side in this many processes (0: one "
            "per CPU); the results are the same, each process reads the trace again"
        ),
    ] = 1,
    gittins_history: Annotated[
        Path | None,
        typer.Option(
            help="CSV with a 'duration' column of job GPU-seconds (default: the trace's own jobs)"
        ),
    ] = None,
    optimus_noise: Annotated[
        float, typer.Option(help="optimus: noise (log-normal sd) of the simulated loss samples")
    ] = 0.02,
    failure_rate: Annotated[
        float, typer.Option(help="per-attempt failure probability of a 1-GPU job (0: off)")
    ] = 0.0,
    failure_model: Annotated[
        str,
        typer.Option(
            help="rate (--failure-rate per attempt) or philly (user errors that repeat early, "
            "infrastructure failures per GPU-hour; see docs/simulator.md)"
        ),
    ] = "rate",
    node_failures: Annotated[
        str | None,
        typer.Option(
            help="MTBF,MTTR in seconds: each node fails and recovers after exponential times"
        ),
    ] = None,
    max_retries: Annotated[int, typer.Option(help="retries of a failed job")] = 3,
    checkpoint_every_s: Annotated[
        float | None,
        typer.Option(
            help="every job saves a checkpoint after this many seconds of work, so a failed "
            "attempt keeps the work up to it [default: only when preempted]"
        ),
    ] = None,
    time_limit_factor: Annotated[
        float | None,
        typer.Option(
            help="each job's time limit is this many times its run time, where the trace gives "
            "it none (EASY backfill reads time limits; a job that runs past its limit fails) "
            "[default: only the trace's limits]"
        ),
    ] = None,
    precheck_report_s: Annotated[
        float,
        typer.Option(
            help="with --precheck-s: seconds after an attempt's start and restore at which a job "
            "first reports progress, which passes its pre-run (an assumption: the retry rule's "
            "fast-failure window; see docs/failures.md)"
        ),
    ] = 60.0,
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
    throughputs: Annotated[
        Path | None,
        typer.Option(
            help="measured throughputs (Gavel's JSON, as `corral export-trace` writes a live "
            "manager's): the jobs' speeds, as the live manager's [default: the trace's own]"
        ),
    ] = None,
    decisions: Annotated[
        bool,
        typer.Option(
            "--decisions",
            help="also write each run's decisions (decisions-POLICY-PLACEMENT.jsonl), every start "
            "and preemption, as `corral export-trace` writes a live manager's",
        ),
    ] = False,
    stream: Annotated[
        bool,
        typer.Option(
            "--stream",
            help=stream_help(),
        ),
    ] = False,
    seed: Annotated[int, typer.Option()] = 0,
    private_baseline: Annotated[
        bool,
        typer.Option(help="also run each VC alone on its own cells, to detect sharing anomaly"),
    ] = False,
    opportunistic_share: Annotated[
        float,
        typer.Option(
            help="hived, quota, fairshare: mark this share of jobs opportunistic (seeded)"
        ),
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
    deadline_factor: Annotated[
        str | None,
        typer.Option(
            help="LO:HI: deadline = submit + U(LO,HI) x duration (default 0.5:1.5 with edf or elasticflow)"
        ),
    ] = None,
    out: Annotated[Path, typer.Option(help="output directory")] = Path("runs/latest"),
    plot: Annotated[bool, typer.Option(help="write JCT CDF, utilisation and queue plots")] = False,
    *,
    scheduler: dict[str, Any],
) -> None:
    """Replay a trace on a modelled cluster and report how each policy did."""
    from corral.cli.simextra import require_sim

    require_sim()
    from corral.cli.schedflags import effective_config, preset_changes
    from corral.core.collector import raise_gc_thresholds
    from corral.sim.failures import NodeFailures
    from corral.sim.runner import (
        RunSettings,
        check_settings,
        run_simulations,
        shared_data_file,
    )

    try:
        nodes, gpus_per_node = parse_cluster(cluster)
        scheduler_settings = effective_config(scheduler_config, scheduler, preset)
        chosen = compare or policy or scheduler_settings.core.policy
        world: Mapping[str, object] = {}
        if preset is not None:
            from corral.core.presets import get_preset

            world = get_preset(preset).simulator
        if spread_slowdown is None:
            spread_slowdown = bool(world.get("spread_slowdown", True))
        history = world.get("gittins_history")
        if gittins_history is None and history is not None and "gittins" in chosen:
            gittins_history = shared_data_file(str(history))
            if gittins_history is None:
                raise UserError(
                    f"--preset {preset}: gittins learns from {history} in the shared data "
                    "directory (../shared/data), which is not there; download "
                    f"{PRESET_HISTORY_URL} and pass --gittins-history PATH"
                )
        if failure_model not in ("rate", "philly"):
            raise UserError(f"--failure-model: unknown {failure_model!r}; choose rate or philly")
        if failure_model == "philly" and failure_rate > 0:
            raise UserError("--failure-rate: not with --failure-model philly (it draws its own)")
        settings = RunSettings(
            trace=trace,
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            racks=racks,
            gpu_type=gpu_type,
            gpus_per_switch=gpus_per_switch,
            config=config,
            policies=[p.strip() for p in chosen.split(",") if p.strip()],
            scheduler=scheduler_settings,
            policy_changes=preset_changes(preset, scheduler_config, scheduler),
            spread_slowdown=spread_slowdown,
            gittins_history=gittins_history,
            optimus_noise=optimus_noise,
            failure_rate=failure_rate,
            failure_model=failure_model,
            node_failures=NodeFailures.parse(node_failures) if node_failures else None,
            max_retries=max_retries,
            checkpoint_every_s=checkpoint_every_s,
            time_limit_factor=time_limit_factor,
            precheck_report_s=precheck_report_s,
            arrival_scale=arrival_scale,
            window=parse_window(window),
            skip_oversized=skip_oversized,
            slowdowns=slowdowns,
            throughputs=throughputs,
            decisions=decisions,
            stream=stream,
            seed=seed,
            private_baseline=private_baseline,
            opportunistic_share=opportunistic_share,
            cache_gb_per_node=cache_gb_per_node,
            storage_gbps=storage_gbps,
            cache_policy=cache_policy,
            datasets=datasets,
            deadline_factor=parse_range("--deadline-factor", deadline_factor),
            workers=workers,
        )
        check_settings(settings)  # (again in the run) refusals before any warning
        warn_idle_backfill(settings)
        raise_gc_thresholds()  # (a run holds every job of its trace)
        run_simulations(settings, out=out, plot=plot, console=console)
    except UserError as error:
        fail(str(error))
    except (ValueError, OSError) as error:
        fail(str(error).splitlines()[0] if str(error) else type(error).__name__)


def warn_idle_backfill(settings: RunSettings) -> None:
    """Warn where the backfill rule of a policy's final config (a preset may set it for some
    policies only) can never act: that policy does not block."""
    from corral.core.framework import idle_backfill
    from corral.sim.runner import config_for

    by_rule: dict[str, list[str]] = {}
    for name in settings.policies:
        by_rule.setdefault(config_for(settings, name).core.backfill, []).append(name)
    for rule, names in by_rule.items():
        idle = idle_backfill(rule, names)
        if idle is not None:
            warn(idle)


def command() -> Any:
    """The click command, with the generated scheduler flags (corral.cli.lazy builds it)."""
    from corral.cli.schedflags import click_command

    return click_command("simulate", simulate)
