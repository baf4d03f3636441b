"""What `corral simulate` costs before its first event, against a bare interpreter's start.

Runs `corral simulate` (corral.cli.main's app, its environment set first as the command sets
it) on a small trace (default: the 300-job `tests/sim/fixtures/tiresias-300.csv` on 8 x 8 GPUs
under `--policy las`, so that reading the trace is a few ms) and stops it when its first
`Simulation.run` begins: the CPU the process had used then (`time.process_time()`, user +
system) is its start-up. `python -c pass` in the same interpreter is timed alongside: the floor
(an editable install's finder and the site packages' .pth files are part of it).

Several source trees compare best in the same minutes: `--tree LABEL=DIR` runs DIR's corral
(PYTHONPATH=DIR, from a scratch directory so that the current one does not come first; make DIR
with `git archive COMMIT corral | tar -x -C DIR`), one run of each tree and of the bare
interpreter in turn, --runs times, and prints each one's median and least. CPU seconds move with
the machine's load; `--instructions` also counts, once per tree under valgrind's cachegrind
(benchmarks/instructions.py), the instructions each start executes, which do not.

Bytecode is written and read as an installed package's is (PYTHONDONTWRITEBYTECODE is dropped
from the children's environment and one untimed run of each tree writes it): a start that
compiled corral's sources each time would measure the compiler (some 300 ms), not the start.

Run: python benchmarks/sim_startup.py [--runs 15] [--tree before=DIR --tree after=DIR]
     [--instructions] [--] [simulate options replacing the default ones]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "tests" / "sim" / "fixtures" / "tiresias-300.csv"
DEFAULT_OPTIONS = ["--trace", f"tiresias:{TRACE}", "--cluster", "8x8", "--policy", "las"]

#: The child: `corral simulate ARGS`, stopped (os._exit, nothing written after it) as its first
#: simulation begins, the CPU it had used by then written to the file named by argv[1].
CHILD = """
import os, sys, time
from corral.cli.main import tool_environment
tool_environment("simulate")  # what `corral simulate` sets before it imports the simulator
import corral.sim.engine as engine
path = sys.argv.pop(1)
def run(self, *args, **kwargs):
    with open(path, "w") as out:
        out.write(repr(time.process_time()))
    os._exit(0)
engine.Simulation.run = run
from corral.cli.main import app
sys.argv[0] = "corral"
app()
"""


def environment(tree: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    return env


def start_cpu(tree: Path | None, options: list[str], scratch: Path) -> float:
    """The CPU seconds one `corral simulate` had used at its first event."""
    figure = scratch / "startup.txt"
    figure.unlink(missing_ok=True)
    args = [sys.executable, "-c", CHILD, str(figure), "simulate", *options]
    args += ["--out", str(scratch / "out")]
    done = subprocess.run(
        args, cwd=scratch, env=environment(tree), capture_output=True, text=True, check=False
    )
    if done.returncode != 0 or not figure.is_file():
        sys.exit(f"corral simulate failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return float(figure.read_text())


def bare_cpu(tree: Path | None, scratch: Path) -> float:
    """The CPU seconds of `python -c pass` (user + system of the child)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"], cwd=scratch, env=environment(tree))
    _, status, usage = os.wait4(child.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit("python -c pass failed")
    return usage.ru_utime + usage.ru_stime


def instructions(tree: Path | None, options: list[str], scratch: Path) -> tuple[int, int]:
    """The instructions of one start (to the first event) and of `python -c pass`."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from instructions import count_instructions

    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(environment(tree))
        os.chdir(scratch)
        figure = scratch / "startup.txt"
        args = ["-c", CHILD, str(figure), "simulate", *options, "--out", str(scratch / "out")]
        start, _ = count_instructions(args, "sim_startup.py")
        bare, _ = count_instructions(["-c", "pass"], "sim_startup.py")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return start, bare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument(
        "--tree",
        action="append",
        default=[],
        metavar="LABEL=DIR",
        help="a source tree to time (PYTHONPATH=DIR); default: the corral Python imports",
    )
    parser.add_argument("--instructions", action="store_true", help="count with valgrind too")
    parser.add_argument("options", nargs="*", help="simulate's options (default: the 300 jobs)")
    args = parser.parse_args()
    trees: dict[str, Path | None] = {}
    for given in args.tree:
        label, _, where = given.partition("=")
        if not where or not (Path(where) / "corral").is_dir():
            sys.exit(f"--tree {given}: expected LABEL=DIR, DIR holding a corral folder")
        trees[label] = Path(where).resolve()
    if not trees:
        trees["corral"] = None
    options = args.options or DEFAULT_OPTIONS
    cpu: dict[str, list[float]] = {label: [] for label in [*trees, "python -c pass"]}
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        for tree in trees.values():
            start_cpu(tree, options, scratch)  # writes the bytecode; not timed
        for _ in range(args.runs):
            for label, tree in trees.items():
                cpu[label].append(start_cpu(tree, options, scratch))
            cpu["python -c pass"].append(bare_cpu(None, scratch))
        for label, figures in cpu.items():
            print(
                f"{label:>16}: CPU median {statistics.median(figures) * 1000:6,.0f} ms, "
                f"least {min(figures) * 1000:6,.0f} ms ({len(figures)} runs)"
            )
        if args.instructions:
            for label, tree in trees.items():
                start, bare = instructions(tree, options, scratch)
                print(
                    f"{label:>16}: {start / 1e6:,.0f} M instructions to the first event "
                    f"(python -c pass: {bare / 1e6:,.0f} M)"
                )
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
