"""One configuration builds the scheduler, for `corral simulate` and for `corral up` alike.

A `SchedulerConfig` names the plugins (policy, placement, admission, round stages) and holds the
options of every registered plugin, each section built from the plugin's own `Options` dataclass
(corral.core.options). It reads from and writes to a plain mapping (the `scheduler:` section of a
YAML file, `corral config show`, the file `corral up` stores and `corral export-trace` writes),
and `build_scheduler` turns it into a `SchedulerCore` with what the shell offers (`Services`).
Nothing here knows a plugin by name: the registries are the only lists.

The defaults are the same in every shell. Where a shell cannot give what a plugin needs (sjf
without job lengths, elasticflow without a throughput table), building refuses in one line.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from corral.core.admission import ADMISSIONS
from corral.core.admission.base import Assembly
from corral.core.backfill import BACKFILL_ALIASES, BACKFILLS, backfill_name
from corral.core.options import NoOptions, OptionError, build, describe, option, to_dict
from corral.core.placement import PLACEMENTS
from corral.core.plugin import PluginError, Services
from corral.core.policy import POLICIES
from corral.core.preempt import VICTIM_RULES
from corral.core.protocol import SchedulerCore
from corral.core.registry import Lazy, Registry
from corral.core.retry import RetryOptions, RetryRule
from corral.core.stages import Stage

#: Round stages beside the queue walk (corral.core.stages), by name.
STAGES: Registry[type[Stage]] = Registry(
    {
        "packing": Lazy(
            "corral.core.packing:Packing", "corral.core.packing_options:PackingOptions"
        ),
        "migration": Lazy(
            "corral.core.migration:Migration", "corral.core.migration_options:MigrationOptions"
        ),
    }
)


@dataclass(frozen=True, slots=True)
class CoreOptions:
    """The choices every scheduler makes; the plugins' own options are sections of their own."""

    policy: str = option("las", help="ordering policy", choices=lambda: POLICIES)
    placement: str = option("relax", help="placement", choices=lambda: PLACEMENTS)
    admission: tuple[str, ...] = option(
        ("auto",),
        help="how VCs share the cluster; auto: the policy's own, else quota when the cluster "
        "config defines VCs, else none; several chain, the first building the scheduler and "
        "each later one adding its verdicts",
        choices=lambda: ["auto", *ADMISSIONS],
    )
    stages: tuple[str, ...] = option((), help="round stages to run", choices=lambda: STAGES)
    backfill: str = option(
        "none",
        help="which later jobs start around a blocking policy's head that cannot: "
        + "; ".join(f"{name} ({rule.summary})" for name, rule in BACKFILLS.items())
        + " (true, or the flag alone: greedy; false: none)",
        choices=lambda: BACKFILLS,
        aliases=BACKFILL_ALIASES,
        bare="greedy",
    )
    restore_s: float = option(
        30.0, help="seconds a resumed job spends restoring its checkpoint before it works", low=0
    )
    victims: str = option(
        "lowest",
        help="which running jobs a waiting job preempts: "
        + "; or ".join(f"{name} ({rule.summary})" for name, rule in VICTIM_RULES.items()),
    )
    preempt_exempt_s: float = option(
        0.0,
        help="a running job is no preemption victim until it has run this many seconds since "
        "its last start (Slurm's PreemptExemptTime; 0: from the next instant on)",
        low=0,
    )
    precheck_s: float | None = option(
        None,
        help="run each job of more than one worker first as one worker (a pre-run, to catch "
        "early user errors before it holds its gang); it passes on its first progress report, "
        "after this many seconds, or when it exits successfully; applies to jobs whose spec "
        "names none (none or 0: off)",
        low=0,
    )

    def validate(self) -> str | None:
        for name, registry, kind in (
            (self.policy, POLICIES, "policy"),
            (self.placement, PLACEMENTS, "placement"),
        ):
            if name not in registry:
                return f"{kind}: unknown {kind} {name!r}; choose one of {', '.join(registry)}"
        if not self.admission:
            return "admission: name at least one admission (or auto)"
        for position, name in enumerate(self.admission):
            if not (name in ADMISSIONS or (name == "auto" and position == 0)):
                first = "auto (first only), " if position else "auto, "
                return (
                    f"admission: unknown admission {name!r}; choose one of {first}"
                    f"{', '.join(ADMISSIONS)}"
                )
        if len(set(self.admission)) != len(self.admission):
            return f"admission: {', '.join(self.admission)}: an admission is named twice"
        if self.backfill not in BACKFILLS:
            return (
                f"backfill: unknown backfill {self.backfill!r}; choose one of "
                f"{', '.join(BACKFILLS)}"
            )
        if self.backfill == "easy" and self.stages:
            return (
                f"backfill easy: not with stages ({', '.join(self.stages)}): a stage starts "
                "jobs outside the reservation's check"
            )
        if self.victims not in VICTIM_RULES:
            return (
                f"victims: unknown victim rule {self.victims!r}; choose one of "
                f"{', '.join(VICTIM_RULES)}"
            )
        for stage in self.stages:
            if stage not in STAGES:
                return f"stages: unknown stage {stage!r}; choose from {', '.join(STAGES)}"
        return None


def sections() -> dict[str, type[Any]]:
    """Every options section by name: `retry`, the stages', then each plugin's that has options.
    Two plugins of one name (the elasticflow policy and admission) share a section, so at most
    one of them may declare options."""
    sections: dict[str, type[Any]] = {"retry": RetryOptions}
    registries: list[Registry[Any]] = [STAGES, POLICIES, PLACEMENTS, ADMISSIONS]
    for registry in registries:
        for name in registry:
            options = registry.options(name)  # (the plugin itself is imported when it runs)
            if options is NoOptions:
                continue
            if name in sections and sections[name] is not options:
                raise TypeError(f"two plugins named {name!r} both declare options")
            sections[name] = options
    return sections


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    core: CoreOptions = field(default_factory=CoreOptions)
    #: section name -> its options; every section of `sections()` is present.
    sections: dict[str, Any] = field(
        default_factory=lambda: {name: cls() for name, cls in sections().items()}
    )

    def section(self, name: str) -> Any:
        """A plugin's options (an empty `NoOptions` for a plugin that declares none)."""
        return self.sections.get(name, NoOptions())

    def with_policy(self, policy: str) -> SchedulerConfig:
        return config_from_mapping(self.to_mapping() | {"policy": policy})

    def admission_for(self, vc_cells: Mapping[str, object]) -> str:
        """The admission that builds the scheduler (the chain's first), `auto` resolved as on a
        cluster with these VCs."""
        first = self.core.admission[0]
        if first != "auto":
            return first
        own = POLICIES[self.core.policy].admission
        if own is not None:
            return own
        return "quota" if set(vc_cells) != {"default"} else "none"

    def admission_chain(self, vc_cells: Mapping[str, object]) -> tuple[str, ...]:
        """Every admission of the chain, `auto` resolved as on a cluster with these VCs."""
        return (self.admission_for(vc_cells), *self.core.admission[1:])

    def to_mapping(
        self, only_used: bool = False, admission: str | None = None
    ) -> dict[str, object]:
        """Plain values, as YAML writes them; `only_used`: only the sections the chosen plugins
        and stages read (what `config show` prints); `admission`: the one `auto` resolved to."""
        out: dict[str, object] = to_dict(self.core)
        chain = self.core.admission if admission is None else (admission, *self.core.admission[1:])
        out["admission"] = chain[0] if len(chain) == 1 else list(chain)  # one: as it always was
        used = self.used_sections(admission) if only_used else set(self.sections)
        for name, options in self.sections.items():
            if name in used:
                out[name] = to_dict(options)
        return out

    def resolved(self, vc_cells: Mapping[str, object]) -> dict[str, object]:
        """What runs on a cluster with these VCs: `auto` resolved, and only the sections the
        chosen plugins read (what `corral up` stores and a simulation's summary records)."""
        return self.to_mapping(only_used=True, admission=self.admission_for(vc_cells))

    def used_sections(self, admission: str | None = None) -> set[str]:
        names = {"retry", self.core.policy, self.core.placement, *self.core.stages}
        names.update((admission or self.core.admission[0], *self.core.admission[1:]))
        return names & set(self.sections)


def config_from_mapping(
    values: Mapping[str, object] | None, where: str = "scheduler"
) -> SchedulerConfig:
    """A config from a mapping (YAML's `scheduler:` section, overrides from the CLI); every key
    and value checked, errors naming `where.key`."""
    values = dict(values or {})
    core_keys = {info.name for info in describe(CoreOptions)}
    core = build(CoreOptions, {k: v for k, v in values.items() if k in core_keys}, where)
    known = sections()
    built: dict[str, Any] = {}
    for name, cls in known.items():
        built[name] = build(cls, values.get(name), f"{where}.{name}")
    unknown = sorted(set(values) - core_keys - set(known))
    if unknown:
        expected = ", ".join([*core_keys, *known])
        raise OptionError(f"{where}.{unknown[0]}: unknown key (expected one of: {expected})")
    return SchedulerConfig(core, built)


def merge(base: Mapping[str, object], overrides: Mapping[str, object]) -> dict[str, object]:
    """`base` with `overrides` applied one level deep (a section's keys merge)."""
    merged = dict(base)
    for key, value in overrides.items():
        old = merged.get(key)
        if isinstance(value, Mapping) and isinstance(old, Mapping):
            merged[key] = {**old, **value}
        else:
            merged[key] = value
    return merged


def check_config(
    config: SchedulerConfig, services: Services | None = None, *, uses_cache: bool = False
) -> None:
    """Refuse a combination that cannot run, in one line (PluginError); `uses_cache`: the shell
    runs node data caches."""
    core = config.core
    admission_name = (
        config.admission_for(services.vc_cells) if services is not None else core.admission[0]
    )
    policy = POLICIES[core.policy]
    if policy.admission is not None and admission_name not in ("auto", policy.admission):
        raise PluginError(
            f"policy {core.policy}: runs only inside admission {policy.admission} "
            f"(got admission {admission_name})"
        )
    followers = [ADMISSIONS[name] for name in core.admission[1:]]
    for follower in followers:
        if not follower.follows:
            raise PluginError(
                f"admission: {follower.name} must come first (only an admission that adds "
                "verdicts to the scheduler can follow another)"
            )
    schemes = [] if admission_name == "auto" else [ADMISSIONS[admission_name]]
    if services is not None and services.vc_tree is not None and schemes and not schemes[0].queues:
        raise PluginError(
            f"admission {admission_name} does not run with departments (the cluster config's "
            "departments and a VC's parent, weight, limit): use admission quota"
        )
    schemes += followers
    picker = next((scheme for scheme in schemes if scheme.picks_victims), None)
    if picker is not None and not VICTIM_RULES[core.victims].with_picked_victims:
        raise PluginError(
            f"victims {core.victims}: only with admissions that leave victims to the policy, "
            f"not {picker.name} (it chooses who gives way to reclaim its GPUs)"
        )
    if admission_name != "auto" and followers and not ADMISSIONS[admission_name].leads:
        raise PluginError(
            f"admission: {admission_name} runs alone (it sizes and places every gang itself)"
        )
    if admission_name == "elasticflow" and policy.admission != "elasticflow":
        raise PluginError("admission elasticflow: needs policy elasticflow")
    if admission_name == "elasticflow" and core.precheck_s:
        raise PluginError(
            "admission elasticflow does not run pre-runs (precheck_s): it sizes and restarts "
            "every gang itself"
        )
    if admission_name == "elasticflow" and core.preempt_exempt_s:
        raise PluginError(
            "admission elasticflow does not take preempt_exempt_s: it resizes and restarts "
            "every gang itself"
        )
    for scheme in schemes:
        for stage in [*core.stages, *(["cache"] if uses_cache else [])]:
            problem = scheme.unsupported(stage)
            if problem is None and stage in STAGES and STAGES[stage].shares_gpus:
                problem = scheme.unsupported_stage_sharing(stage)
            if problem:
                raise PluginError(problem)
        problem = scheme.unsupported_placement(config.section(scheme.name), core.placement)
        if problem:
            raise PluginError(problem)
        if PLACEMENTS[core.placement].shares:
            problem = scheme.unsupported_sharing(core.placement)
            if problem:
                raise PluginError(problem)


def build_scheduler(
    config: SchedulerConfig, services: Services, *, uses_cache: bool = False
) -> SchedulerCore:
    """The scheduler this config describes, over what the shell offers. `uses_cache`: the shell
    runs node data caches (their start hook is `services.cache.on_start`)."""
    check_config(config, services, uses_cache=uses_cache)
    core = config.core
    admission_name = config.admission_for(services.vc_cells)
    scheme = ADMISSIONS[admission_name]
    policy_cls = POLICIES[core.policy]
    placement_cls = PLACEMENTS[core.placement]
    policy = policy_cls.from_options(config.section(core.policy), services)
    placement = placement_cls.from_options(config.section(core.placement), services)
    stages = [STAGES[name].from_options(config.section(name), services) for name in core.stages]
    followers = [
        ADMISSIONS[name].admission(config.section(name), services) for name in core.admission[1:]
    ]
    parts = Assembly(
        policy=policy,
        placement=placement,
        services=services,
        backfill=core.backfill,
        restore_s=core.restore_s,
        victims=core.victims,
        preempt_exempt_s=core.preempt_exempt_s,
        retry=RetryRule(config.section("retry")),
        precheck_s=core.precheck_s or None,
        stages=stages,
        on_start=services.cache.on_start if uses_cache and services.cache is not None else None,
        admissions=[admission for admission in followers if admission is not None],
    )
    return scheme.build(config.section(admission_name), parts)


def idle_backfill(backfill: str | bool, policies: Iterable[str]) -> str | None:
    """A one-line warning, naming the flag, where the backfill rule can never act under some of
    `policies` (None: it acts under each, or it is `none`): only a blocking policy has a head for
    later jobs to pass; under any other every rule decides as `none` does. A warning rather
    than a refusal (`CoreOptions.validate` cannot tell: the policy is final only where a shell
    builds its schedulers), as `corral simulate` compares several policies under one rule."""
    rule = backfill_name(backfill)
    idle = [name for name in policies if name in POLICIES and not POLICIES[name].blocking]
    if rule == "none" or not idle:
        return None
    blocking = ", ".join(name for name, policy in POLICIES.items() if policy.blocking)
    under = f"policy {idle[0]}" if len(idle) == 1 else f"policies {', '.join(idle)}"
    return (
        f"--backfill {rule}: no effect under {under}, which never blocks (backfill passes "
        f"the head of a blocking policy: {blocking})"
    )


__all__ = [
    "STAGES",
    "CoreOptions",
    "SchedulerConfig",
    "build_scheduler",
    "check_config",
    "config_from_mapping",
    "idle_backfill",
    "merge",
    "sections",
]
