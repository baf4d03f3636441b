"""Fixtures shared by the server's tests: a real PostgreSQL server (see tests/server/postgres.py)
and a manager's data directory whose jobs' processes are all ended afterwards."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.helpers import kill_jobs_of
from tests.server.postgres import postgres, postgres_server, postgres_url  # noqa: F401


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    """A manager's data directory (not yet made); every process its jobs left is ended after the
    test, also when it failed half-way."""
    directory = tmp_path / "corral"
    yield directory
    kill_jobs_of(directory)
