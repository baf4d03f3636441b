"""Hand mutants of the scheduler's decisions: each one breaks one mechanism's decision the way a
plausible bug would (a key forced constant, a score inverted, a threshold off by one, a victim
rule swapped) and must be killed, that is, make some test fail.

Each mutant runs twice over a copy of this tree (the files git tracks or would track, so work
not yet committed counts): against the core's unit tests of its mechanism, and against the live
tests that show the mechanism with real processes (docs/live.md). A mutant survives a set of
tests when they all pass with it. Before any mutant, every test named is run once on the
unchanged copy: a test that fails there would kill every mutant for nothing, so the run stops.

Prints one line per mutant and, with `--markdown`, the table docs/mutants.md holds. Exits 1 if
any mutant survived both sets.

Run: .venv/bin/python scripts/mutants.py [--only NAME,...] [--skip-live] [--markdown]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: A set of tests may take this long on a loaded 2-core machine before it counts as a kill.
TIMEOUT_S = 1800


@dataclass(frozen=True)
class Mutant:
    name: str
    #: The mechanism it breaks, as docs/live.md names it.
    mechanism: str
    #: What it does to the decision, in words.
    change: str
    path: str
    #: (text, its replacement): each text occurs exactly once in the file.
    edits: tuple[tuple[str, str], ...]
    #: The core's unit tests of the mechanism, and its live tests (paths or node ids).
    core: tuple[str, ...]
    live: tuple[str, ...]


MUTANTS = [
    Mutant(
        "las-one-queue",
        "Tiresias: las",
        "every job in LAS's first queue: attained service never demotes (FIFO)",
        "corral/core/policy/las.py",
        (
            (
                "        queue = self.queue_of(job, now)\n        state = job.peek(LasState)\n",
                "        queue = 0\n        state = job.peek(LasState)\n",
            ),
        ),
        ("tests/core/test_policies.py", "tests/core/test_repeat_rounds.py"),
        (
            "tests/server/test_manager.py::test_las_preempts_the_job_that_attained_more_service_and_it_resumes",
        ),
    ),
    Mutant(
        "gittins-index-constant",
        "Tiresias: gittins",
        "the Gittins index of every job is 0: the order is arrival only",
        "corral/core/policy/gittins.py",
        (
            (
                "        return self.index_at[self._grid_position(job, now)]\n",
                "        return 0.0\n",
            ),
        ),
        ("tests/core/test_policies.py", "tests/core/test_wake_bounds.py"),
        ("tests/server/test_gittins_live.py",),
    ),
    Mutant(
        "edf-deadline-ignored",
        "ElasticFlow: edf",
        "every job's deadline is the same: the order is arrival only",
        "corral/core/policy/edf.py",
        (
            (
                "        return (deadline_of(job), *tie_break(job))\n",
                "        return (0.0, *tie_break(job))\n",
            ),
        ),
        ("tests/core/test_policies.py", "tests/core/test_elastic.py"),
        ("tests/server/test_edf_live.py",),
    ),
    Mutant(
        "gittins-lowest-index-first",
        "Tiresias: gittins",
        "the lowest Gittins index first (the order inverted)",
        "corral/core/policy/gittins.py",
        (
            (
                "        return (-self.index(job, now), *tie_break(job))\n",
                "        return (self.index(job, now), *tie_break(job))\n",
            ),
        ),
        ("tests/core/test_policies.py",),
        ("tests/server/test_gittins_live.py",),
    ),
    Mutant(
        "edf-no-deadline-first",
        "ElasticFlow: edf",
        "a job without a deadline goes before every job with one",
        "corral/core/policy/edf.py",
        (
            (
                "    return job.spec.deadline if job.spec.deadline is not None else math.inf\n",
                "    return job.spec.deadline if job.spec.deadline is not None else -math.inf\n",
            ),
        ),
        ("tests/core/test_elastic.py", "tests/core/test_policies.py"),
        ("tests/server/test_edf_live.py",),
    ),
    Mutant(
        "reclaim-highest-first",
        "quota, fairshare: GPU quotas, lending last",
        "a VC taking back its share preempts the other VC's highest-priority jobs first",
        "corral/core/admission/quota.py",
        (
            (
                "            yield from (victim for victim in running if self.reclaimable(victim, job))\n",
                "            yield from reversed([v for v in running if self.reclaimable(v, job)])\n",
            ),
        ),
        ("tests/core/test_quota.py", "tests/core/test_framework.py"),
        ("tests/server/test_fairshare_live.py",),
    ),
    Mutant(
        "srtf-remaining-constant",
        "sjf, srtf (declared lengths)",
        "srtf's remaining work is the same for every job",
        "corral/core/policy/shortest.py",
        (
            (
                "        return (job.remaining_work_s(now), *tie_break(job))\n",
                "        return (0.0, *tie_break(job))\n",
            ),
        ),
        ("tests/core/test_policies.py",),
        (
            "tests/server/test_telemetry.py::"
            "test_srtf_preempts_for_a_shorter_declared_length_and_refuses_jobs_without_one",
        ),
    ),
    Mutant(
        "sjf-length-constant",
        "sjf, srtf (declared lengths)",
        "sjf's length is the same for every job",
        "corral/core/policy/shortest.py",
        (
            (
                "        return (duration, *tie_break(job))\n",
                "        return (0.0, *tie_break(job))\n",
            ),
        ),
        ("tests/core/test_policies.py",),
        (
            "tests/server/test_telemetry.py::"
            "test_sjf_orders_by_the_declared_time_limit_and_refuses_jobs_without_one",
        ),
    ),
    Mutant(
        "optimus-remaining-constant",
        "Optimus (loss-curve fit)",
        "Optimus's remaining time is the same for every job",
        "corral/core/policy/optimus.py",
        (
            (
                "        return (self.remaining_s(job, now), *tie_break(job))\n",
                "        return (0.0, *tie_break(job))\n",
            ),
        ),
        ("tests/core/test_optimus.py",),
        ("tests/server/test_optimus_live.py",),
    ),
    Mutant(
        "relax-never",
        "Philly: consolidate, relax after waiting",
        "relax never relaxes: a job waits for a consolidated placement forever",
        "corral/core/placement/named.py",
        (
            (
                "        return job.queued_since + self.relax_after_s\n",
                "        return math.inf\n",
            ),
        ),
        ("tests/core/test_placement.py",),
        ("tests/server/test_relax_live.py",),
    ),
    Mutant(
        "relax-at-once",
        "Philly: consolidate, relax after waiting",
        "relax relaxes at once, without waiting",
        "corral/core/placement/named.py",
        (
            (
                "        return job.queued_since + self.relax_after_s\n",
                "        return job.queued_since\n",
            ),
        ),
        ("tests/core/test_placement.py",),
        ("tests/server/test_relax_live.py",),
    ),
    Mutant(
        "victims-highest-first",
        "Tiresias: las",
        "preemption takes the highest-priority running job it may preempt first",
        "corral/core/preempt.py",
        (
            (
                "        for key in reversed(self._running):\n            victim = by_seq[key[-1]]\n",
                "        for key in self._running:\n            victim = by_seq[key[-1]]\n",
            ),
        ),
        ("tests/core/test_policies.py", "tests/core/test_failed_searches.py"),
        ("tests/server/test_las_victims_live.py",),
    ),
    Mutant(
        "preempt-exempt-ignored",
        "preemption: preempt_exempt_s",
        "a running job is a victim however recently it started: the exempt time is ignored",
        "corral/core/preempt.py",
        (
            (
                "        return start == now or (start is not None and now - start < self.exempt_s)\n",
                "        return start == now\n",
            ),
        ),
        ("tests/core/test_preempt_exempt.py",),
        ("tests/server/test_preempt_exempt_live.py",),
    ),
    Mutant(
        "failed-search-never-forgotten",
        "Tiresias: las",
        "a failed search for victims is remembered even after a running job it may preempt appears",
        "corral/core/preempt.py",
        (
            (
                "        if self.no_room:\n            self._forget(old, new)\n",
                "        pass\n",
            ),
        ),
        ("tests/core/test_failed_searches.py",),
        ("tests/server/test_failed_search_live.py",),
    ),
    Mutant(
        "quota-lends-first",
        "quota, fairshare: GPU quotas, lending last",
        "quota lends idle GPUs in the same walk as jobs within their quotas (lend-last off)",
        "corral/core/admission/quota.py",
        (("            if self.lend_last:\n", "            if False:\n"),),
        ("tests/core/test_quota.py", "tests/core/test_quota_opportunistic.py"),
        ("tests/server/test_lend_last_live.py",),
    ),
    Mutant(
        "fairshare-usage-ignored",
        "quota, fairshare: GPU quotas, lending last",
        "fair share ignores past usage: every VC keeps its weight",
        "corral/core/admission/fairshare.py",
        (
            (
                "            self._effective[vc] = weight * 2.0 ** (-normalized_usage / normalized_share)\n",
                "            self._effective[vc] = weight\n",
            ),
        ),
        ("tests/core/test_quota.py", "tests/core/test_framework.py"),
        ("tests/server/test_fairshare_live.py",),
    ),
    Mutant(
        "queues-lend-across-first",
        "quota: hierarchical queues",
        "a department is guaranteed only its teams' own quotas: a team's idle quota is lent "
        "across departments by weight, not within its department first",
        "corral/core/queues.py",
        (
            (
                "            given = {n: min(demand[n], float(self.queues[n].quota)) for n in names}\n",
                "            given = {n: self._mutant_own(n, demand) for n in names}\n",
            ),
            (
                "    def vcs(self) -> list[str]:\n",
                "    def _mutant_own(self, n: str, demand: dict[str, float]) -> float:\n"
                "        below = self.children(n)\n"
                "        if not below:\n"
                "            return min(demand[n], float(self.queues[n].quota))\n"
                "        return sum(self._mutant_own(c, demand) for c in below)\n\n"
                "    def vcs(self) -> list[str]:\n",
            ),
        ),
        ("tests/core/test_queues.py",),
        (
            "tests/server/test_queues_live.py",
            "tests/server/test_operations_ray.py::"
            "test_a_two_level_queue_on_ray_lends_within_first_and_reclaims_from_outside_first",
        ),
    ),
    Mutant(
        "queues-reclaim-within-first",
        "quota: hierarchical queues",
        "a team takes GPUs back from borrowers inside its department before those outside",
        "corral/core/admission/queues.py",
        (
            (
                "                borrowers.append((self._common(w, vc), -self._over(w), index, victim))\n",
                "                borrowers.append((-self._common(w, vc), -self._over(w), index, victim))\n",
            ),
        ),
        ("tests/core/test_queues.py",),
        (
            "tests/server/test_queues_live.py",
            "tests/server/test_operations_ray.py::"
            "test_a_two_level_queue_on_ray_lends_within_first_and_reclaims_from_outside_first",
        ),
    ),
    Mutant(
        "fgd-score-inverted",
        "FGD: fractional GPUs, `fgd` placement, MPS limits",
        "FGD picks where the target workload's fragmentation grows the most",
        "corral/core/placement/sharing.py",
        (
            (
                "            return (weighted(after(state, shape, None)) - before,), None\n",
                "            return (before - weighted(after(state, shape, None)),), None\n",
            ),
            (
                "            ((weighted(after(state, shape, v)) - before, v), v)\n",
                "            ((before - weighted(after(state, shape, v)), v), v)\n",
            ),
        ),
        ("tests/core/test_sharing.py",),
        (
            "tests/server/test_fgd_live.py::test_fgd_chooses_the_node_where_fragmentation_grows_least",
            "tests/server/test_fgd_live.py::test_fgd_places_each_share_where_fragmentation_grows_least",
        ),
    ),
    Mutant(
        "retry-fast-fail-off-by-one",
        "Philly: retries, user errors ended, lost attempts",
        "a user error needs one more fast failure in a row than `fast_fail_repeats` + 1",
        "corral/core/retry.py",
        (
            (
                "        return run > self.options.fast_fail_repeats\n",
                "        return run > self.options.fast_fail_repeats + 1\n",
            ),
        ),
        ("tests/core/test_retry.py",),
        (
            "tests/server/test_manager.py::test_the_same_fast_failure_again_and_again_is_a_user_error",
        ),
    ),
    Mutant(
        "precheck-progress-ignored",
        "Philly: pre-run (`precheck`)",
        "a pre-run's first progress report does not pass it (only its timer does)",
        "corral/core/precheck.py",
        (
            (
                '        return self._stop_passed(job, now, "progress")\n',
                "        return None\n",
            ),
        ),
        ("tests/core/test_precheck.py",),
        (
            "tests/server/test_precheck_live.py::"
            "test_a_pre_run_that_reports_and_runs_on_passes_by_its_report",
        ),
    ),
    Mutant(
        "packing-never-splits",
        "Gandiva: packing (pair speeds measured, unmeasured pairs tried once, losing pairs split)",
        "a pair measured not to gain is never split",
        "corral/core/packing.py",
        (
            (
                "            if measured[0] + measured[1] <= self.threshold:\n",
                "            if False:\n",
            ),
        ),
        ("tests/core/test_gandiva.py",),
        ("tests/server/test_gandiva_live.py",),
    ),
    Mutant(
        "migration-never-plans",
        "Gandiva: migration",
        "migration never finds a plan: no job is moved",
        "corral/core/migration.py",
        (
            (
                "        plan = self.plan(cluster, job, host.running_jobs(), movable)\n",
                "        plan = None\n",
            ),
        ),
        ("tests/core/test_gandiva.py",),
        ("tests/server/test_gandiva_live.py",),
    ),
    Mutant(
        "elastic-never-grows",
        "ElasticFlow: `elasticflow`, `edf`",
        "a running elastic job is never grown to the GPUs it was allotted",
        "corral/core/elastic.py",
        (
            (
                "        curve = self._elastic[job.id].curve\n        statement = Statement(",
                "        return []\n        curve = self._elastic[job.id].curve\n        statement = Statement(",
            ),
        ),
        ("tests/core/test_elastic.py",),
        ("tests/server/test_elastic_grow_live.py", "tests/server/test_ddp_live.py"),
    ),
    Mutant(
        "timeslice-turns-never-end",
        "Gandiva: time-slicing",
        "a job in its turn keeps it: turns never rotate",
        "corral/core/policy/timeslice.py",
        (
            (
                "            return self.turn_ends(job.run_started_at)\n",
                "            return math.inf\n",
            ),
        ),
        ("tests/core/test_gandiva.py", "tests/core/test_policies.py"),
        ("tests/server/test_manager.py::test_time_slicing_suspends_and_resumes_jobs_in_turns",),
    ),
    Mutant(
        "cache-aware-ignores-caches",
        "SiloD: node data caches, `cache-aware` placement",
        "cache-aware places as consolidate, whatever the nodes cache",
        "corral/core/placement/cacheaware.py",
        (
            (
                "        if cache is None or read is None or not_enough(cluster, job) is not None:\n",
                "        if True:\n",
            ),
        ),
        ("tests/core/test_cache.py",),
        (
            "tests/server/test_silod_live.py::"
            "test_cache_aware_sends_a_job_to_the_declared_node_that_caches_its_data",
            "tests/server/test_silod_live.py::"
            "test_cache_aware_placement_sends_a_job_to_the_node_that_caches_its_data",
        ),
    ),
    Mutant(
        "drain-ignored",
        "Node lifecycle: drain (with or without `--preempt`), resume",
        "a drained node's free GPUs are never held out: jobs start there as on any node",
        "corral/core/nodes.py",
        (
            (
                "        return name in self.drained or name in self.unhealthy or name in self.absent\n",
                "        return name in self.unhealthy or name in self.absent\n",
            ),
        ),
        ("tests/core/test_nodes.py", "tests/sim/test_maintenance.py"),
        (
            "tests/server/test_nodes_live.py::test_a_drained_node_lets_its_job_finish_and_the_next_job_starts_on_the_other",
            "tests/server/test_nodes_replay.py",
            "tests/server/test_operations_ray.py::"
            "test_a_drained_ray_node_lets_its_job_finish_and_the_next_job_starts_on_the_other",
        ),
    ),
    Mutant(
        "drain-preempt-ignored",
        "Node lifecycle: drain (with or without `--preempt`), resume",
        "a drain with --preempt preempts nothing: the node's jobs run on",
        "corral/core/nodes.py",
        (
            (
                "        stops = core.evict_node(node, now, drain_label(name)) if preempt else []\n",
                "        stops = []\n",
            ),
        ),
        ("tests/core/test_nodes.py", "tests/sim/test_maintenance.py"),
        (
            "tests/server/test_nodes_live.py::test_a_drain_with_preempt_requeues_the_job_which_restarts_elsewhere",
            "tests/server/test_nodes_replay.py",
            "tests/server/test_operations_ray.py::"
            "test_a_drain_with_preempt_requeues_the_job_which_resumes_on_the_other_ray_node",
        ),
    ),
    Mutant(
        "unhealthy-ignored",
        "Node lifecycle: health checks",
        "an unhealthy node's free GPUs are never held out: jobs start there as on any node",
        "corral/core/nodes.py",
        (
            (
                "        return name in self.drained or name in self.unhealthy or name in self.absent\n",
                "        return name in self.drained or name in self.absent\n",
            ),
        ),
        ("tests/core/test_nodes.py", "tests/sim/test_health_changes.py"),
        (
            "tests/server/test_health_live.py::test_an_unhealthy_node_requeues_its_job_elsewhere_and_comes_back_when_its_check_passes",
            "tests/server/test_health_replay.py",
        ),
    ),
    Mutant(
        "unhealthy-not-infrastructure",
        "Node lifecycle: health checks",
        "the attempts on an unhealthy node fail as the job's own failures: they use up max_retries",
        "corral/core/nodes.py",
        (
            (
                "        report = FailureReport(unhealthy_label(name, reason), infrastructure=True)\n",
                "        report = FailureReport(unhealthy_label(name, reason), infrastructure=False)\n",
            ),
        ),
        ("tests/core/test_nodes.py", "tests/sim/test_health_changes.py"),
        (
            "tests/server/test_health_live.py::test_an_unhealthy_node_requeues_its_job_elsewhere_and_comes_back_when_its_check_passes",
        ),
    ),
    Mutant(
        "easy-ignores-shadow",
        "EASY backfill",
        "the head's shadow time is ignored: every later job that fits starts on the reserved "
        "GPUs, whenever its time limit ends (greedy)",
        "corral/core/backfill.py",
        (
            (
                "        if self.head is None or self.shadow == math.inf or limit_end(job, now) <= self.shadow:\n",
                "        if True:\n",
            ),
        ),
        ("tests/core/test_backfill.py", "tests/sim/test_backfill_sim.py"),
        (
            "tests/server/test_backfill_live.py::"
            "test_easy_backfill_starts_the_short_job_and_never_delays_the_head",
            "tests/server/test_operations_ray.py::"
            "test_easy_backfill_on_ray_starts_the_short_job_and_never_delays_the_head",
        ),
    ),
    Mutant(
        "reservation-ignored",
        "Reservations",
        "no job is ever kept off a reservation's GPUs: members or not, in the window or not",
        "corral/core/reservations.py",
        (
            (
                "        if not self.items:\n            return []\n        ends_by",
                "        if True:\n            return []\n        ends_by",
            ),
        ),
        ("tests/core/test_reservations.py", "tests/sim/test_backfill_sim.py"),
        (
            "tests/server/test_reservations_live.py::"
            "test_a_maintenance_window_is_honoured_with_backfill_around_it",
            "tests/server/test_operations_ray.py::"
            "test_a_reservation_of_a_ray_node_is_honoured_with_backfill_around_it",
        ),
    ),
]


def copy_tree(dest: Path) -> None:
    """The files git tracks, or would track (not ignored), as they are now."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in listed:
        if not name:
            continue
        source = ROOT / os.fsdecode(name)
        if source.is_file():
            target = dest / os.fsdecode(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def mutated(original: str, mutant: Mutant) -> str:
    text = original
    for old, new in mutant.edits:
        found = text.count(old)
        if found != 1:
            raise SystemExit(
                f"mutants: {mutant.name}: {mutant.path}: the text to change occurs {found} times "
                f"(must be once): {old.strip()[:60]!r}"
            )
        text = text.replace(old, new)
    return text


def run_tests(tree: Path, tests: tuple[str, ...]) -> tuple[bool, str, float]:
    """(passed, the first failing test or the tail of the output, seconds)."""
    started = time.monotonic()
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-x",
        "-q",
        "-p",
        "no:randomly",
        "-p",
        "no:cacheprovider",
    ]
    try:
        result = subprocess.run(
            [*command, *tests],
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False, f"timed out after {TIMEOUT_S} s", time.monotonic() - started
    seconds = time.monotonic() - started
    if result.returncode == 0:
        return True, "", seconds
    if result.returncode == 5:
        raise SystemExit(f"mutants: no test collected from {' '.join(tests)}")
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", result.stdout, flags=re.MULTILINE)
    detail = failed[0] if failed else result.stdout.strip().splitlines()[-1:]
    return False, str(detail), seconds


def check_imports_from(tree: Path) -> None:
    """The copy's corral is the one its tests import (not an installed one)."""
    found = subprocess.run(
        [sys.executable, "-c", "import corral; print(corral.__file__)"],
        cwd=tree,
        env=dict(os.environ, PYTHONPATH=str(tree)),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(found).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"mutants: the copy imports corral from {found}, not from the copy")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated mutant names")
    parser.add_argument("--skip-live", action="store_true", help="the core's tests only")
    parser.add_argument("--markdown", action="store_true", help="print docs/mutants.md's table")
    args = parser.parse_args()
    chosen = MUTANTS
    if args.only:
        names = args.only.split(",")
        unknown = sorted(set(names) - {m.name for m in MUTANTS})
        if unknown:
            raise SystemExit(f"mutants: --only: unknown mutant(s) {', '.join(unknown)}")
        chosen = [m for m in MUTANTS if m.name in names]
    for mutant in chosen:  # every change applies, before anything runs
        mutated((ROOT / mutant.path).read_text(), mutant)
    with tempfile.TemporaryDirectory(prefix="corral-mutants-") as scratch:
        tree = Path(scratch)
        copy_tree(tree)
        check_imports_from(tree)
        sets = [m.core for m in chosen] + ([] if args.skip_live else [m.live for m in chosen])
        every = tuple(dict.fromkeys(t for tests in sets for t in tests))
        present = tuple(t for t in every if (tree / t.split("::")[0]).exists())
        missing = sorted(set(every) - set(present))
        for test in missing:
            print(f"not found (counts as not killing): {test}", flush=True)
        passed, detail, seconds = run_tests(tree, present)
        if not passed:
            raise SystemExit(f"mutants: the unchanged tree fails {detail}: fix that first")
        print(
            f"unchanged tree: {len(present)} test files or ids pass ({seconds:.0f} s)", flush=True
        )
        rows = []
        for mutant in chosen:
            path = tree / mutant.path
            original = path.read_text()
            path.write_text(mutated(original, mutant))
            try:
                verdicts = []
                for kind, tests in (("core", mutant.core), ("live", mutant.live)):
                    tests = tuple(t for t in tests if t in present)
                    if kind == "live" and args.skip_live:
                        verdicts.append("not run")
                    elif not tests:
                        verdicts.append("no test")
                    else:
                        ok, detail, seconds = run_tests(tree, tests)
                        verdicts.append(
                            "survived" if ok else f"killed by {detail} ({seconds:.0f} s)"
                        )
            finally:
                path.write_text(original)
            rows.append((mutant, *verdicts))
            print(f"{mutant.name}: core {verdicts[0]}; live {verdicts[1]}", flush=True)
    if args.markdown:
        print(
            "\n| mutant | mechanism | the break | core tests | live tests |\n|---|---|---|---|---|"
        )
        for mutant, core, live in rows:
            print(f"| `{mutant.name}` | {mutant.mechanism} | {mutant.change} | {core} | {live} |")
    survivors = [
        m.name
        for m, core, live in rows
        if not core.startswith("killed") and not live.startswith("killed")
    ]
    print(
        f"{len(rows)} mutants, {len(rows) - len(survivors)} killed, {len(survivors)} survived"
        + (f": {', '.join(survivors)}" if survivors else "")
    )
    sys.exit(1 if survivors else 0)


if __name__ == "__main__":
    main()
