"""The linear sum assignment (min-cost matching of rows to columns) that the hetero placement
needs, in numpy, for installs without scipy (the manager's: scipy comes with corral[sim]).

It is scipy.optimize.linear_sum_assignment's algorithm (the shortest augmenting path of Jonker
and Volgenant, as Crouse describes it; scipy's rectangular_lsap.cpp) with the same arithmetic and
the same choices among equal costs, so it returns the same assignment as scipy, not only one of
the same cost: a placement does not depend on whether scipy is installed. Each row's path search
is vectorised over the columns; scipy's C is faster for large matrices, and is used when present.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def linear_sum_assignment(
    cost: npt.ArrayLike,
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """(rows, columns) of the assignment of every row to a distinct column with the least total
    cost; `cost` is rows x columns with no more rows than columns, +inf where not allowed.
    ValueError for NaN or -inf, more rows than columns, or no complete assignment."""
    matrix = np.asarray(cost, dtype=float)
    if matrix.ndim != 2:
        raise ValueError(f"the cost matrix must be 2-D, got {matrix.ndim}-D")
    rows, columns = matrix.shape
    if rows > columns:
        raise ValueError(f"more rows ({rows}) than columns ({columns})")
    if np.isnan(matrix).any() or np.isneginf(matrix).any():
        raise ValueError("the cost matrix contains NaN or -inf")
    u = np.zeros(rows)
    v = np.zeros(columns)
    col4row = np.full(rows, -1, dtype=np.intp)
    row4col = np.full(columns, -1, dtype=np.intp)
    path = np.full(columns, -1, dtype=np.intp)
    for current in range(rows):
        # The shortest augmenting path from row `current` (Dijkstra over the reduced costs).
        # `remaining` keeps scipy's order: reversed, and a scanned column is replaced by the last.
        remaining = np.arange(columns - 1, -1, -1, dtype=np.intp)
        count = columns
        scanned_rows = np.zeros(rows, dtype=bool)
        scanned_columns = np.zeros(columns, dtype=bool)
        shortest = np.full(columns, np.inf)
        min_value = 0.0
        row = current
        sink = -1
        while sink == -1:
            scanned_rows[row] = True
            open_columns = remaining[:count]
            reduced = min_value + matrix[row, open_columns] - u[row] - v[open_columns]
            better = reduced < shortest[open_columns]
            path[open_columns[better]] = row
            shortest[open_columns[better]] = reduced[better]
            costs = shortest[open_columns]
            lowest = costs.min()
            if lowest == np.inf:
                raise ValueError("the cost matrix is infeasible")
            # scipy's scan keeps the first lowest column, or the last free one among them
            ties = np.flatnonzero(costs == lowest)
            free = ties[row4col[open_columns[ties]] == -1]
            index = int(free[-1] if free.size else ties[0])
            min_value = float(lowest)
            column = int(remaining[index])
            if row4col[column] == -1:
                sink = column
            else:
                row = int(row4col[column])
            scanned_columns[column] = True
            count -= 1
            remaining[index] = remaining[count]
        # the duals
        u[current] += min_value
        others = scanned_rows.copy()
        others[current] = False
        u[others] += min_value - shortest[col4row[others]]
        v[scanned_columns] -= min_value - shortest[scanned_columns]
        # augment along the path
        column = sink
        while True:
            row = int(path[column])
            row4col[column] = row
            col4row[row], column = column, int(col4row[row])
            if row == current:
                break
    return np.arange(rows, dtype=np.intp), col4row
