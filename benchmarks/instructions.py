"""Count the instructions one run of `sim_preemption_heavy.py` executes, to compare two builds.

On a shared machine the CPU time of the same run moves by a quarter from one minute to the next,
so pairs of timed runs cannot tell a change of a few percent from noise. The number of
instructions executed does not move: this runs `benchmarks/sim_preemption_heavy.py --one POLICY`
under valgrind's cachegrind (`--cache-sim=no`: it only counts, about 25 times slower than the
run itself) with a fixed `PYTHONHASHSEED`, and prints the count with the run's own line.

The `corral` it measures is the one Python imports: point PYTHONPATH at a copy of a commit
(`git archive COMMIT corral benchmarks | tar -x -C DIR`, DIR beside the checkout so that
`../shared` is found), compiled or not, and run this from it.
Needs valgrind (Debian: `apt-get install valgrind`). Instructions are a proxy for time, not time:
a change that trades instructions for cache misses can still be slower; confirm a gain with
timed runs where it is large enough to see.

Run: PYTHONPATH=DIR python DIR/benchmarks/instructions.py [--jobs N] [--policy las]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BENCHMARK = Path(__file__).resolve().parent / "sim_preemption_heavy.py"


def count_instructions(arguments: list[str], who: str) -> tuple[int, str]:
    """The instructions `python ARGUMENTS` executes under cachegrind (counting only, a fixed
    PYTHONHASHSEED), with its output; exits naming `who` when valgrind is missing or the run
    fails."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        sys.exit(f"{who}: valgrind not found (Debian: apt-get install valgrind)")
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            valgrind,
            "--tool=cachegrind",
            "--cache-sim=no",
            f"--cachegrind-out-file={tmp}/out",
            sys.executable,
            *arguments,
        ]
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"{who}: the run failed:\n{done.stdout}{done.stderr}")
    counted = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if counted is None:
        sys.exit(f"{who}: no instruction count in valgrind's output:\n{done.stderr}")
    return int(counted.group(1).replace(",", "")), done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--policy", default="las")
    args = parser.parse_args()
    instructions, output = count_instructions(
        [str(BENCHMARK), "--jobs", str(args.jobs), "--one", args.policy], "instructions.py"
    )
    print(f"{instructions / 1e9:,.2f} G instructions: {output.strip()}")


if __name__ == "__main__":
    main()
