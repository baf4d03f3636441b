"""Break each mechanism's decision in the source by hand, run the live test that must catch it,
and restore the source: every mutant must be killed (its test fails).

Each mutant is one exact replacement in one file of corral/core (the text must occur once), and a
test under tests/server that starts real processes. The file is restored after the run, also when
the run is interrupted. Run from the repository root, with nothing else running its tests (the
source is changed while a mutant's test runs):

    .venv/bin/python scripts/live_mutants.py [--only NAME ...] [--list]

It prints one line per mutant (KILLED or SURVIVED, and the test's first failure) and exits 1 if
any survived. A killed mutant's test usually fails by a wait timing out (a decision that never
comes): a minute or two per mutant. docs/mutants.md records the result.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    name: str
    what: str
    path: str
    old: str
    new: str
    test: str


MUTANTS = [
    Mutant(
        "gittins-constant",
        "gittins: every job's index the same constant",
        "corral/core/policy/gittins.py",
        "        return self.index_at[self._grid_position(job, now)]",
        "        return 1.0",
        "tests/server/test_gittins_live.py",
    ),
    Mutant(
        "gittins-sign",
        "gittins: the lowest index first",
        "corral/core/policy/gittins.py",
        "        return (-self.index(job, now), *tie_break(job))",
        "        return (self.index(job, now), *tie_break(job))",
        "tests/server/test_gittins_live.py",
    ),
    Mutant(
        "relax-never",
        "relax: never relaxes",
        "corral/core/placement/named.py",
        "        return job.queued_since + self.relax_after_s",
        "        return math.inf",
        "tests/server/test_relax_live.py",
    ),
    Mutant(
        "relax-at-once",
        "relax: relaxes as the job arrives",
        "corral/core/placement/named.py",
        "        return job.queued_since + self.relax_after_s",
        "        return job.queued_since",
        "tests/server/test_relax_live.py",
    ),
    Mutant(
        "fairshare-usage-ignored",
        "fairshare: shares by weight alone, usage ignored",
        "corral/core/admission/fairshare.py",
        "            self._effective[vc] = weight * 2.0 ** (-normalized_usage / normalized_share)",
        "            self._effective[vc] = weight",
        "tests/server/test_fairshare_live.py",
    ),
    Mutant(
        "reclaim-victims-swapped",
        "quota/fairshare: reclaim from the highest-priority running job first",
        "corral/core/admission/quota.py",
        "            yield from (victim for victim in running if self.reclaimable(victim, job))",
        "            yield from reversed([v for v in running if self.reclaimable(v, job)])",
        "tests/server/test_fairshare_live.py",
    ),
    Mutant(
        "edf-deadline-ignored",
        "edf: deadlines ignored (arrival order)",
        "corral/core/policy/edf.py",
        "        return (deadline_of(job), *tie_break(job))",
        "        return tie_break(job)",
        "tests/server/test_edf_live.py",
    ),
    Mutant(
        "edf-no-deadline-first",
        "edf: a job without a deadline first",
        "corral/core/policy/edf.py",
        "    return job.spec.deadline if job.spec.deadline is not None else math.inf",
        "    return job.spec.deadline if job.spec.deadline is not None else -math.inf",
        "tests/server/test_edf_live.py",
    ),
    Mutant(
        "quota-lend-first",
        "quota: lend_last off (borrowers placed in queue order with the rest)",
        "corral/core/admission/quota.py",
        "        self.lend_last = lend_last and oversubscribe",
        "        self.lend_last = False",
        "tests/server/test_lend_last_live.py",
    ),
    Mutant(
        "fgd-score-inverted",
        "fgd: the largest growth of fragmentation first",
        "corral/core/placement/sharing.py",
        "            ((weighted(after(state, shape, v)) - before, v), v)",
        "            ((before - weighted(after(state, shape, v)), v), v)",
        "tests/server/test_fgd_live.py",
    ),
]


def run(mutant: Mutant) -> tuple[bool, str]:
    """Whether the mutant's test failed (killed), and its first failure line."""
    path = ROOT / mutant.path
    original = path.read_text()
    if original.count(mutant.old) != 1:
        raise SystemExit(f"{mutant.name}: {mutant.path} does not hold its text exactly once")
    path.write_text(original.replace(mutant.old, mutant.new))
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:randomly", mutant.test],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        path.write_text(original)
    first = next((line for line in result.stdout.splitlines() if line.startswith("E ")), "")
    return result.returncode != 0, " ".join(first.split())[:140]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=[], help="mutants to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = parser.parse_args()
    known = {m.name for m in MUTANTS}
    unknown = sorted(set(args.only) - known)
    if unknown:
        print(f"--only: unknown mutant {unknown[0]!r}; known: {', '.join(sorted(known))}")
        return 2
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    if args.list:
        for mutant in chosen:
            print(f"{mutant.name}: {mutant.what} ({mutant.path}; {mutant.test})")
        return 0
    survived = 0
    for mutant in chosen:
        killed, first = run(mutant)
        survived += not killed
        verdict = "KILLED" if killed else "SURVIVED"
        print(f"{mutant.name}: {verdict} by {mutant.test} {first}", flush=True)
    print(f"{len(chosen)} mutants, {len(chosen) - survived} killed, {survived} survived")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
