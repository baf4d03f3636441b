"""corral's numpy linear sum assignment (for installs without scipy) against scipy's: the same
assignment, not only the same cost, on matrices full of ties and forbidden (+inf) entries, and
the hetero placement's matching the same with scipy blocked."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linear_sum_assignment as scipy_lsa  # type: ignore[import-untyped]

from corral.core.placement.lsap import linear_sum_assignment
from tests.cli.blocking import blocking_env

ROOT = Path(__file__).resolve().parents[2]


@st.composite
def wide_matrices(draw: st.DrawFn) -> np.ndarray:
    rows = draw(st.integers(1, 7))
    columns = draw(st.integers(rows, 12))
    # few distinct values: many ties, where the choice among equal assignments shows
    values = st.sampled_from([0.0, 1.0, 1.0, 2.0, 2.5, 3.0, 0.1 + 0.2, np.inf])
    matrix = np.array(draw(st.lists(values, min_size=rows * columns, max_size=rows * columns)))
    matrix = matrix.reshape(rows, columns)
    # keep it feasible: each row a finite column of its own
    for row in range(rows):
        matrix[row, row] = min(matrix[row, row], 5.0)
    return matrix


@settings(max_examples=400, deadline=None)
@given(wide_matrices())
def test_the_same_assignment_as_scipy(matrix: np.ndarray) -> None:
    rows, columns = linear_sum_assignment(matrix)
    expected_rows, expected_columns = scipy_lsa(matrix)
    assert rows.tolist() == expected_rows.tolist()
    assert columns.tolist() == expected_columns.tolist()


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 30), st.integers(0, 20), st.integers(0, 2**32 - 1))
def test_random_real_costs_match_scipy(rows: int, extra: int, seed: int) -> None:
    matrix = np.random.default_rng(seed).random((rows, rows + extra))
    assert linear_sum_assignment(matrix)[1].tolist() == scipy_lsa(matrix)[1].tolist()


def test_a_constant_matrix_gives_the_identity_as_scipy_does() -> None:
    assert linear_sum_assignment(np.ones((3, 5)))[1].tolist() == [0, 1, 2]


@pytest.mark.parametrize(
    ("matrix", "message"),
    [
        ([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], "more rows (3) than columns (2)"),
        ([[np.nan, 1.0]], "the cost matrix contains NaN or -inf"),
        ([[-np.inf, 1.0]], "the cost matrix contains NaN or -inf"),
        ([[np.inf, 1.0], [np.inf, 2.0]], "the cost matrix is infeasible"),
        ([1.0, 2.0], "the cost matrix must be 2-D, got 1-D"),
    ],
)
def test_bad_matrices_are_refused(matrix: list[object], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        linear_sum_assignment(matrix)
    assert str(caught.value) == message


def test_an_empty_matrix_assigns_nothing() -> None:
    rows, columns = linear_sum_assignment(np.zeros((0, 3)))
    assert rows.tolist() == [] and columns.tolist() == []


def test_the_hetero_matching_is_the_same_without_scipy(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import json, sys
        from corral.core.placement.hetero import assign_types
        options = [(1 + i % 4, {"v100": 10.0 + i % 3, "k80": 25.0 + (i * 7) % 5})
                   for i in range(24)] + [(2, {}), (8, {"k80": 3.0})]
        print(json.dumps(assign_types(options, {"v100": 8, "k80": 16}, {"k80": 2.0})))
        print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "scipy")[:1]))
        """
    )
    with_scipy = run_python(script, os.environ.copy())
    without = run_python(script, blocking_env(tmp_path, "scipy"))
    assert with_scipy.splitlines()[0] == without.splitlines()[0]
    assert with_scipy.splitlines()[1] == '["scipy"]' and without.splitlines()[1] == "[]"
    # every job that may run somewhere got a type; the one with no type got none
    assert '"v100"' in with_scipy and with_scipy.splitlines()[0].count("null") == 1


def run_python(script: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
