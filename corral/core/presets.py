"""Named configurations: a scheduler config (and the simulator settings that go with it) that
reproduces another system, chosen with `--preset NAME` (`corral simulate`, `corral config show`).

A preset is plain data over the plugin framework (corral.core.framework): the base of the
scheduler config, changes for some policies, and settings of the simulated world. Whatever the
user gives (a `--scheduler-config` file, flags) overrides it, key by key.

`tiresias` reproduces the Tiresias simulator (SymbioticLab/Tiresias, `simulator/run_sim.py` run
with `--scheme=yarn`); docs/policies.md lists each difference from corral's defaults, why corral's
default is what it is, and what each changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Preset:
    name: str
    summary: str
    #: The scheduler config's base: a mapping as `config_from_mapping` reads it.
    scheduler: Mapping[str, object]
    #: Per policy, keys to change on top of `scheduler` when that policy runs.
    by_policy: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    #: Settings of the simulated world (corral.sim.runner.RunSettings fields by name).
    simulator: Mapping[str, object] = field(default_factory=dict)


# Tiresias's dlas-gpu and dlas-gpu-gittins keep 3 queues (simulator/jobs.py: num_queue = 3 and
# queue_limit = [3250, 7200, 18000]; with 3 queues only the first two limits are used), compared
# with attained GPU-seconds (executed seconds x GPUs).
TIRESIAS_THRESHOLDS_GPU_S = (3_250.0, 7_200.0)

TIRESIAS = Preset(
    name="tiresias",
    summary="the Tiresias simulator (run_sim.py --scheme=yarn): its placement, queues and rules",
    scheduler={
        "placement": "yarn",  # fifo places with its yarn scheme
        "restore_s": 0.0,  # it charges nothing to resume a preempted job
        "victims": "in-order",  # its pass keeps running jobs in list order while they fit
        "las": {
            "thresholds_gpu_s": list(TIRESIAS_THRESHOLDS_GPU_S),
            "preempt_within_queue": False,
            "queue_order": "started",  # its lists: the last started gives way first
            "demote_at_rounds": True,  # it checks queues at its events only
        },
        "gittins": {
            "thresholds_gpu_s": list(TIRESIAS_THRESHOLDS_GPU_S),
            "queues": True,  # 2D-Gittins inside the LAS queues (its dlas-gpu-gittins)
            "delta_gpu_s": 3_250.0,  # its static Gittins quantum (jobs.py: gittins_delta)
            "formula": "tiresias",  # its own index (docs/policies.md: how it differs)
            "quantiles": 1_000,  # the index changes at every sample of the history
            "demote_at_rounds": True,  # it updates indexes and queues at its events only
        },
    },
    by_policy={
        # Its dlas and gittins loops only count free GPUs: they never call the placement.
        "las": {"placement": "any"},
        "gittins": {"placement": "any"},
    },
    simulator={
        "spread_slowdown": False,  # a job's duration is the same wherever it is placed
        "gittins_history": "tiresias/yarn-gput1000.csv",  # in the shared data directory
    },
)

PRESETS: dict[str, Preset] = {TIRESIAS.name: TIRESIAS}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}") from None


def given_keys(mapping: Mapping[str, object]) -> set[tuple[str, ...]]:
    """The (section, key) or (key,) paths a scheduler mapping sets."""
    keys: set[tuple[str, ...]] = set()
    for key, value in mapping.items():
        if isinstance(value, Mapping):
            keys.update((key, inner) for inner in value)
        else:
            keys.add((key,))
    return keys


def without(mapping: Mapping[str, object], keys: set[tuple[str, ...]]) -> dict[str, object]:
    """`mapping` less the paths in `keys` (what a user gave overrides a preset's per-policy
    change)."""
    out: dict[str, object] = {}
    for key, value in mapping.items():
        if isinstance(value, Mapping):
            inner = {k: v for k, v in value.items() if (key, k) not in keys}
            if inner:
                out[key] = inner
        elif (key,) not in keys:
            out[key] = value
    return out


__all__ = ["PRESETS", "TIRESIAS", "Preset", "get_preset", "given_keys", "without"]
