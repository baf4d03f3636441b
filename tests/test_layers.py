"""The layering, checked: import-linter's contracts (pyproject.toml, [tool.importlinter]) hold.

`corral.core` imports nothing of corral outside it; the shells (sim, server, exec, cli, ...) reach
the plugins only through their registries; no import cycle in `corral.core` (type-only imports
count) nor between corral's parts. CI runs the test suite only, so this test is the check: it
runs `lint-imports` and fails with its report. The contracts are shown to bite on a copy of the
package with one bad import added, and every registered plugin's module is shown to be one the
shells may not import.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from corral.core.admission import ADMISSIONS
from corral.core.framework import STAGES
from corral.core.placement import PLACEMENTS
from corral.core.policy import POLICIES

ROOT = Path(__file__).resolve().parent.parent
CONTRACTS = {
    c["id"]: c
    for c in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"
    ]
}
SHELLS = "shells-reach-plugins-by-registry"


def lint_imports(cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`lint-imports` of the environment running the tests, on the package importable from cwd
    (no cache: nothing is written beside the sources, nothing stale is read)."""
    script = Path(sys.executable).parent / "lint-imports"
    command = str(script) if script.exists() else shutil.which("lint-imports")
    assert command, "lint-imports not found: install the test extra (import-linter)"
    return subprocess.run(
        [command, "--no-cache", "--no-logo"],
        cwd=cwd,
        env=os.environ | env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def verdicts(output: str) -> dict[str, str]:
    """Each contract's id -> KEPT or BROKEN, read from the report's summary lines."""
    found = {}
    for line in output.splitlines():
        for contract_id, contract in CONTRACTS.items():
            if line.startswith(contract["name"] + " "):
                found[contract_id] = line[len(contract["name"]) + 1 :].split()[0]
    return found


def test_the_contracts_are_kept() -> None:
    result = lint_imports(ROOT)
    if result.returncode != 0:
        pytest.fail(f"lint-imports exited {result.returncode}:\n{result.stdout}{result.stderr}")
    assert verdicts(result.stdout) == dict.fromkeys(CONTRACTS, "KEPT")


# (file, line added at its end, the one contract that breaks; None: all are kept)
BAD_IMPORTS = [
    ("corral/core/job.py", "from corral.yamlfile import read_yaml_file", "core-alone"),
    ("corral/sim/engine.py", "from corral.core.policy.las import LeastAttainedService", SHELLS),
    ("corral/server/telemetry.py", "from corral.core.packing import Packing", SHELLS),
    # a type-only import is an import: plugin.py below every policy, as the type of a member
    (
        "corral/core/plugin.py",
        "if TYPE_CHECKING:\n    from corral.core.policy.las import LeastAttainedService",
        "core-acyclic",
    ),
    ("corral/core/compiled.py", "from corral.core import scheduler", "core-acyclic"),
    ("corral/exec/local.py", "from corral.cli import main", "parts-acyclic"),
    # the kinds' base classes are no plugin
    ("corral/sim/engine.py", "from corral.core.placement.base import Placement", None),
]


@pytest.mark.parametrize(("path", "line", "broken"), BAD_IMPORTS)
def test_a_bad_import_breaks_its_contract(
    tmp_path: Path, path: str, line: str, broken: str | None
) -> None:
    shutil.copytree(
        ROOT / "corral", tmp_path / "corral", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    with open(tmp_path / path, "a") as file:
        file.write(f"\n{line}\n")
    result = lint_imports(tmp_path, PYTHONPATH=str(tmp_path))
    expected = dict.fromkeys(CONTRACTS, "KEPT") | ({} if broken is None else {broken: "BROKEN"})
    assert verdicts(result.stdout) == expected, result.stdout + result.stderr
    assert (result.returncode != 0) == (broken is not None)


def covered(module: str, expression: str) -> bool:
    """Whether a forbidden module expression (`*`: one name) covers the module or a package
    above it."""
    pattern = expression.split(".")
    parts = module.split(".")
    return len(parts) >= len(pattern) and all(
        p == "*" or p == m for p, m in zip(pattern, parts, strict=False)
    )


def test_every_registered_plugin_is_forbidden_to_the_shells() -> None:
    """A new plugin module is covered by the shells' contract without a new line there: every
    plugin in a registry lives where the contract forbids the shells to look."""
    forbidden = CONTRACTS[SHELLS]["forbidden_modules"]
    registries = {"policy": POLICIES, "placement": PLACEMENTS, "admission": ADMISSIONS}
    registries["stage"] = STAGES
    for kind, registry in registries.items():
        for name, plugin in registry.items():
            module = plugin.__module__
            assert any(covered(module, e) for e in forbidden), (
                f"{kind} {name!r} is defined in {module}, which the shells may import: add it "
                f"to the forbidden_modules of the contract {SHELLS!r} in pyproject.toml"
            )
            assert not module.endswith(".base"), f"{kind} {name!r} is defined in a base module"


def test_covered() -> None:
    assert covered("corral.core.policy.las", "corral.core.policy.*")
    assert covered("corral.core.packing", "corral.core.packing")
    assert covered("corral.core.packing.inner", "corral.core.packing")
    assert not covered("corral.core.policy", "corral.core.policy.*")
    assert not covered("corral.core.packingx", "corral.core.packing")
    assert not covered("corral.core.stages", "corral.core.policy.*")
